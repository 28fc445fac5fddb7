"""prefzoo: a zoo of offline preference-optimization losses behind one interface, with a shared trainer.

Importing prefzoo needs only torch and pluggy; the trainer, data and evaluation
modules import transformers, accelerate and friends lazily.
"""

from prefzoo.hookspecs import hookimpl, hookspec
from prefzoo.losses.combine import CombinedLoss
from prefzoo.losses.shapes import REDUCTIONS, pairs_from_lists
from prefzoo.registry import (
    RegistryError,
    UnknownLossError,
    combine,
    get_loss,
    get_registry,
    list_losses,
    loss_spec,
    reset_registry,
)
from prefzoo.spec import Loss, LossOutputError, LossParamError, LossParams, LossSpec, param, param_infos
from prefzoo.types import (
    GroupBatch,
    GroupBatchError,
    LossContext,
    LossOutput,
    LossState,
    Need,
    PreferenceBatch,
    PreferenceBatchError,
    Shape,
    UnpairedBatch,
    UnpairedBatchError,
    group_from_pairs,
)

__version__ = "0.1.0"


def __getattr__(name: str) -> object:
    """Lazy re-exports: ``prefzoo.sequence_logps`` loads the log-prob module only when used."""
    if name == "sequence_logps":
        import importlib

        return importlib.import_module("prefzoo.train.logps").sequence_logps
    raise AttributeError(f"module 'prefzoo' has no attribute {name!r}")


__all__ = [
    "REDUCTIONS",
    "CombinedLoss",
    "GroupBatch",
    "GroupBatchError",
    "Loss",
    "LossContext",
    "LossOutput",
    "LossOutputError",
    "LossParamError",
    "LossParams",
    "LossSpec",
    "LossState",
    "Need",
    "PreferenceBatch",
    "PreferenceBatchError",
    "RegistryError",
    "Shape",
    "UnknownLossError",
    "UnpairedBatch",
    "UnpairedBatchError",
    "__version__",
    "combine",
    "get_loss",
    "get_registry",
    "group_from_pairs",
    "hookimpl",
    "hookspec",
    "list_losses",
    "loss_spec",
    "pairs_from_lists",
    "param",
    "param_infos",
    "reset_registry",
    "sequence_logps",
]
