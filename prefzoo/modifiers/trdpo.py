"""TR-DPO: the reference model is updated from the policy every τ steps (TRL ``sync_ref_model``)."""

from __future__ import annotations

from dataclasses import dataclass

from prefzoo.modifiers._common import WITH_REFERENCE, registers
from prefzoo.spec import InnerLoss, LossParams, LossSpec, ModifierSpec, param
from prefzoo.types import LossContext, LossOutput, PreferenceBatch


@dataclass(frozen=True, kw_only=True)
class TRDPOParams(LossParams):
    mixup_alpha: float = param(
        0.6, r"$\alpha$: $\theta_{\mathrm{ref}} \leftarrow \alpha\cdot\theta + (1 - \alpha)\cdot"
        r"\theta_{\mathrm{ref}}$ at each sync (1 = hard update; TRL ref_model_mixup_alpha)", gt=0.0, le=1.0
    )
    sync_steps: int = param(512, r"$\tau$: optimizer steps between reference updates (TRL ref_model_sync_steps)", ge=1)


def tr_dpo(inner: InnerLoss, batch: PreferenceBatch, p: TRDPOParams, spec: LossSpec, lp: LossParams,
           ctx: LossContext) -> LossOutput:  # fmt: skip
    """TR-DPO (Gorbatovski et al. 2024, arXiv:2404.09656): the loss is unchanged, its reference moves (callback)."""
    return inner(batch, lp)


_SPECS: tuple[ModifierSpec, ...] = (
    ModifierSpec(
        name="tr-dpo",
        fn=tr_dpo,
        params_cls=TRDPOParams,
        paper="Gorbatovski et al. 2024, arXiv:2404.09656 (TR-DPO)",
        transforms_tex=r"\text{every}\ \tau\ \text{steps}\ \theta_{\mathrm{ref}} \leftarrow \alpha\cdot\theta "
                       r"+ (1 - "
                      r"\alpha)\cdot\theta_{\mathrm{ref}}\ (\text{soft};\ \alpha = 1\text{: hard})",
        applies=WITH_REFERENCE,
        updates_reference=True,
        callback="reference-sync",
        trl="DPOConfig.sync_ref_model, ref_model_mixup_alpha, ref_model_sync_steps",
        description="Trust-region DPO: the reference follows the policy during training, through the trainer "
        "callback reference-sync (which it installs).",
        notes="Needs a separate reference copy: not with --precompute-ref nor with a LoRA adapter-disabled "
        "reference (both keep the reference fixed).",
    ),
)

prefzoo_register_modifiers = registers(_SPECS)
