"""Public testing kit for prefzoo losses: Hypothesis strategies, reference formulas, property and conformance checks.

Importable with only torch, hypothesis and pytest installed, so plugin authors can
test their own losses with the same properties as the built-ins:

    from prefzoo.testing import check_loss, conformance_tests, preference_batches, loss_params

``tiny_causal_lm()`` builds a tiny random Llama and its character tokenizer locally (needs the ``train`` extra),
for tests of code that runs a model.
"""

from prefzoo.data.tiny import char_tokenizer, tiny_causal_lm, tiny_llama_config
from prefzoo.testing.conformance import (
    ALL_PROPERTIES,
    ConformanceReport,
    PropertyResult,
    check_loss,
    conformance_tests,
    dtypes_from_env,
)
from prefzoo.testing.properties import GENERIC_PROPERTIES, Property, PropertyFailure, cast_batch, grads
from prefzoo.testing.properties_shapes import LIST_PROPERTIES, UNPAIRED_PROPERTIES
from prefzoo.testing.sharding import gloo_gather, run_sharded, shard_batch, split_sizes
from prefzoo.testing.strategies import batches_for, group_batches, loss_params, preference_batches, unpaired_batches

__all__ = [
    "ALL_PROPERTIES",
    "GENERIC_PROPERTIES",
    "LIST_PROPERTIES",
    "UNPAIRED_PROPERTIES",
    "ConformanceReport",
    "Property",
    "PropertyFailure",
    "PropertyResult",
    "batches_for",
    "cast_batch",
    "char_tokenizer",
    "check_loss",
    "conformance_tests",
    "dtypes_from_env",
    "gloo_gather",
    "grads",
    "group_batches",
    "loss_params",
    "preference_batches",
    "run_sharded",
    "shard_batch",
    "split_sizes",
    "tiny_causal_lm",
    "tiny_llama_config",
    "unpaired_batches",
]
