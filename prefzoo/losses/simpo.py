"""Reference-free margin losses: SimPO and CPO."""

from __future__ import annotations

from dataclasses import dataclass

import torch.nn.functional as F

from prefzoo.hookspecs import hookimpl
from prefzoo.losses._common import average_logps, require
from prefzoo.spec import LossParams, LossSpec, param
from prefzoo.types import LossContext, LossOutput, Need, PreferenceBatch


@dataclass(frozen=True, kw_only=True)
class SimPOParams(LossParams):
    beta: float = param(2.0, "β: reward scale of the average log-prob", gt=0.0)
    gamma_beta_ratio: float = param(0.5, "γ/β: target reward margin divided by β", ge=0.0)


@dataclass(frozen=True, kw_only=True)
class CPOParams(LossParams):
    beta: float = param(0.1, "β: temperature of the preference term", gt=0.0)
    alpha: float = param(1.0, "α: weight of the NLL term on the chosen response (TRL cpo_alpha)", ge=0.0)


def simpo_loss(batch: PreferenceBatch, p: SimPOParams, ctx: LossContext) -> LossOutput:
    """SimPO (Meng et al. 2024, arXiv:2405.14734, Eq. 6), as the SimPO reference code.

    L = −log σ(β/|y_w| · log π(y_w|x) − β/|y_l| · log π(y_l|x) − γ),  γ = β · gamma_beta_ratio
    """
    lw, ll = require(batch, "chosen_lengths", "rejected_lengths")
    chosen = average_logps(batch.policy_chosen_logps, lw)  # (B,) log π(y_w|x)/|y_w|
    rejected = average_logps(batch.policy_rejected_logps, ll)  # (B,)
    logits = chosen - rejected - p.gamma_beta_ratio  # (B,)
    return LossOutput(-F.logsigmoid(p.beta * logits), (p.beta * chosen).detach(), (p.beta * rejected).detach())


def cpo_loss(batch: PreferenceBatch, p: CPOParams, ctx: LossContext) -> LossOutput:
    """CPO (Xu et al. 2024, arXiv:2401.08417, Eq. 3 + NLL), as TRL's CPOTrainer with loss_type='sigmoid'.

    L = −log σ(β·(log π(y_w|x) − log π(y_l|x))) − α · log π(y_w|x)/|y_w|
    """
    lw, _ = require(batch, "chosen_lengths", "rejected_lengths")
    pw, pl = batch.policy_chosen_logps, batch.policy_rejected_logps  # (B,) summed log-probs
    nll = -average_logps(pw, lw)  # (B,) per-token NLL of y_w
    losses = -F.logsigmoid(p.beta * (pw - pl)) + p.alpha * nll
    return LossOutput(losses, (p.beta * pw).detach(), (p.beta * pl).detach(), {"cpo/nll": nll.detach().mean()})


_LEN = frozenset({Need.LENGTHS})


@hookimpl
def prefzoo_register_losses() -> list[LossSpec]:
    return [
        LossSpec(
            name="simpo",
            fn=simpo_loss,
            params_cls=SimPOParams,
            family="simpo",
            formula="−log σ(β·log π(y_w|x)/|y_w| − β·log π(y_l|x)/|y_l| − γ)",
            paper="Meng et al. 2024, arXiv:2405.14734 (SimPO)",
            scores="β·log π_θ(y|x)/|y| (average log-prob)",
            needs=_LEN,
            logp_reward="average",
            description="Simple Preference Optimization: reference-free, length-normalized margin loss.",
        ),
        LossSpec(
            name="cpo",
            fn=cpo_loss,
            params_cls=CPOParams,
            family="simpo",
            formula="−log σ(β(log π(y_w|x) − log π(y_l|x))) − α·log π(y_w|x)/|y_w|",
            paper="Xu et al. 2024, arXiv:2401.08417 (CPO)",
            scores="β·log π_θ(y|x) (summed log-prob)",
            needs=_LEN,
            description="Contrastive Preference Optimization: a reference-free DPO plus NLL on the chosen response.",
            notes="TRL averages the NLL over all chosen tokens of the batch; prefzoo keeps it per example.",
        ),
    ]
