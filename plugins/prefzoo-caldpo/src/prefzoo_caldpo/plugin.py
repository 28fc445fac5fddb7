"""Cal-DPO (Xiao et al. 2024, arXiv:2412.14516) registered through prefzoo's plugin hook."""

from __future__ import annotations

from dataclasses import dataclass

import torch.nn.functional as F

import prefzoo
from prefzoo import LossContext, LossOutput, LossParams, LossSpec, Need, PreferenceBatch, param


@dataclass(frozen=True, kw_only=True)
class CalDPOParams(LossParams):
    beta: float = param(0.1, "β: the implicit rewards are calibrated towards ±1/(2β)", gt=0.0)


def cal_dpo_loss(batch: PreferenceBatch, p: CalDPOParams, ctx: LossContext) -> LossOutput:
    """Cal-DPO (Xiao et al. 2024, arXiv:2412.14516, Eq. 10).

    L = −log σ(ρ_w − ρ_l) + (ρ_w − 1/(2β))² + (ρ_l + 1/(2β))²,  ρ = log π_θ(y|x) − log π_ref(y|x)
    """
    assert batch.ref_chosen_logps is not None and batch.ref_rejected_logps is not None  # declared need
    rho_w = batch.policy_chosen_logps - batch.ref_chosen_logps.detach()  # (B,)
    rho_l = batch.policy_rejected_logps - batch.ref_rejected_logps.detach()  # (B,)
    target = 1.0 / (2.0 * p.beta)
    losses = -F.logsigmoid(rho_w - rho_l) + (rho_w - target) ** 2 + (rho_l + target) ** 2
    return LossOutput(losses, (p.beta * rho_w).detach(), (p.beta * rho_l).detach())


@prefzoo.hookimpl
def prefzoo_register_losses() -> list[LossSpec]:
    return [
        LossSpec(
            name="cal-dpo",
            fn=cal_dpo_loss,
            params_cls=CalDPOParams,
            family="dpo",
            formula="−log σ(ρ_w − ρ_l) + (ρ_w − 1/(2β))² + (ρ_l + 1/(2β))²",
            paper="Xiao et al. 2024, arXiv:2412.14516 (Cal-DPO)",
            scores="β·(log π_θ(y|x) − log π_ref(y|x)) (DPO implicit reward)",
            needs=frozenset({Need.REFERENCE}),
            monotone=False,  # the squared calibration terms pull ρ back towards ±1/(2β)
            shift_invariant=True,
            description="Calibrated DPO: the logistic margin loss plus squared terms that calibrate the implicit "
            "rewards to ±1/(2β), so the chosen likelihood does not fall while the margin grows.",
        )
    ]
