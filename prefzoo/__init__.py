"""prefzoo: a zoo of offline preference-optimization losses behind one interface, with a shared trainer.

Importing prefzoo imports nothing heavy: each public name below loads its module on first use (PEP 562), so
``prefzoo train`` prints its first line before torch loads (seconds on a first run, when nothing is byte-compiled
yet: README command 1 installs with ``--no-compile``).  The losses need only torch and pluggy; the trainer, data
and evaluation modules import transformers, accelerate and friends lazily.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from prefzoo._lazy import lazy_names

if TYPE_CHECKING:  # the same names for type checkers and IDEs; at run time __getattr__ loads them
    from prefzoo.hookspecs import hookimpl, hookspec
    from prefzoo.losses.combine import CombinedLoss
    from prefzoo.losses.shapes import REDUCTIONS, pairs_from_lists
    from prefzoo.modifiers.compose import ModifiedLoss, Modifier
    from prefzoo.registry import (
        RegistryError,
        UnknownLossError,
        combine,
        get_loss,
        get_registry,
        list_losses,
        list_modifiers,
        loss_spec,
        modifier_spec,
        modify,
        reset_registry,
    )
    from prefzoo.spec import (
        Applicability,
        Loss,
        LossOutputError,
        LossParamError,
        LossParams,
        LossSpec,
        ModifierError,
        ModifierSpec,
        param,
        param_infos,
    )
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




__all__ = [
    "REDUCTIONS",
    "Applicability",
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
    "ModifiedLoss",
    "Modifier",
    "ModifierError",
    "ModifierSpec",
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
    "list_modifiers",
    "loss_spec",
    "modifier_spec",
    "modify",
    "pairs_from_lists",
    "param",
    "param_infos",
    "reset_registry",
    "sequence_logps",
]

# module -> the public names it defines: the TYPE_CHECKING imports above (tests/test_package.py keeps them in step),
# and sequence_logps, whose model package (torch code) loads on first use; this __init__ ranks above it
# (tests/test_import_layers.py)
_MODULES: dict[str, tuple[str, ...]] = {
    "prefzoo.hookspecs": ("hookimpl", "hookspec"),
    "prefzoo.losses.combine": ("CombinedLoss",),
    "prefzoo.losses.shapes": ("REDUCTIONS", "pairs_from_lists"),
    "prefzoo.modifiers.compose": ("ModifiedLoss", "Modifier"),
    "prefzoo.registry": ("RegistryError", "UnknownLossError", "combine", "get_loss", "get_registry", "list_losses",
                         "list_modifiers", "loss_spec", "modifier_spec", "modify", "reset_registry"),
    "prefzoo.spec": ("Applicability", "Loss", "LossOutputError", "LossParamError", "LossParams", "LossSpec",
                     "ModifierError", "ModifierSpec", "param", "param_infos"),
    "prefzoo.types": ("GroupBatch", "GroupBatchError", "LossContext", "LossOutput", "LossState", "Need",
                      "PreferenceBatch", "PreferenceBatchError", "Shape", "UnpairedBatch", "UnpairedBatchError",
                      "group_from_pairs"),
    "prefzoo.model": ("sequence_logps",),
}  # fmt: skip

_LAZY, __getattr__, __dir__ = lazy_names(globals(), _MODULES)
