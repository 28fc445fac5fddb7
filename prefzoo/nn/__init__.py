"""The fused LM head + any registered prefzoo loss as one ``torch.nn.Module``, for loops that are not prefzoo's.

:class:`FusedLinearPreferenceLoss` (short name :data:`PreferenceLoss`) is built and called as Liger-Kernel's fused
preference losses are, ``FusedLinearPreferenceLoss("dpo", beta=0.1)(lin_weight, _input, target, bias, ref_input,
ref_weight, ref_bias)``, and takes every registered loss: pairs, lists and unpaired rows (layouts in
:mod:`prefzoo.nn.layout`), plugins, weighted sums and modifiers.  It scores with the trainer's fused head
(:func:`prefzoo.model.weight_logps`) and builds the loss's batch from the inputs the loss declares it needs, so its
loss and gradients are the trainer's on the same batch.  :func:`fused_sequence_logps` gives the per-row log-probs
alone (a reference's, or KTO's mismatched pairs').  :mod:`prefzoo.nn.liger` holds Liger-Kernel's five preference-loss
classes by name, arguments and outputs, with any prefzoo loss behind them.

Above :mod:`prefzoo.model` and the registry, below the trainer; importing it imports torch but not transformers.
"""

from __future__ import annotations

from prefzoo.nn.liger import (
    LigerFusedLinearCPOLoss,
    LigerFusedLinearDPOLoss,
    LigerFusedLinearKTOLoss,
    LigerFusedLinearORPOLoss,
    LigerFusedLinearSimPOLoss,
)
from prefzoo.nn.module import FusedLinearPreferenceLoss, FusedLossAux, fused_sequence_logps
from prefzoo.nn.rows import FusedInputError

PreferenceLoss = FusedLinearPreferenceLoss  # the short name

__all__ = [
    "FusedInputError",
    "FusedLinearPreferenceLoss",
    "FusedLossAux",
    "LigerFusedLinearCPOLoss",
    "LigerFusedLinearDPOLoss",
    "LigerFusedLinearKTOLoss",
    "LigerFusedLinearORPOLoss",
    "LigerFusedLinearSimPOLoss",
    "PreferenceLoss",
    "fused_sequence_logps",
]
