"""Public testing kit for prefzoo losses: Hypothesis strategies, reference formulas, property and conformance checks.

Importable with only torch, hypothesis and pytest installed, so plugin authors can
test their own losses with the same properties as the built-ins:

    from prefzoo.testing import check_loss, conformance_tests, preference_batches, loss_params

``tiny_causal_lm()`` builds a tiny random Llama and its character tokenizer locally (needs the ``train`` extra),
for tests of code that runs a model.

Importing this package imports nothing: each public name loads its module on first use (PEP 562), so the
``prefzoo`` pytest plugin (:mod:`prefzoo.testing.pytest_plugin`), which every pytest session of an environment with
prefzoo installed loads, pulls in neither torch nor Hypothesis.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from prefzoo._lazy import lazy_names

if TYPE_CHECKING:  # the same names for type checkers and IDEs; at run time __getattr__ loads them
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

# module -> the public names it defines: the TYPE_CHECKING imports above (tests/test_package.py keeps them in step)
_MODULES: dict[str, tuple[str, ...]] = {
    "prefzoo.data.tiny": ("char_tokenizer", "tiny_causal_lm", "tiny_llama_config"),
    "prefzoo.testing.conformance": ("ALL_PROPERTIES", "ConformanceReport", "PropertyResult", "check_loss",
                                    "conformance_tests", "dtypes_from_env"),
    "prefzoo.testing.properties": ("GENERIC_PROPERTIES", "Property", "PropertyFailure", "cast_batch", "grads"),
    "prefzoo.testing.properties_shapes": ("LIST_PROPERTIES", "UNPAIRED_PROPERTIES"),
    "prefzoo.testing.sharding": ("gloo_gather", "run_sharded", "shard_batch", "split_sizes"),
    "prefzoo.testing.strategies": ("batches_for", "group_batches", "loss_params", "preference_batches",
                                   "unpaired_batches"),
}  # fmt: skip




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

_LAZY, __getattr__, __dir__ = lazy_names(globals(), _MODULES)
