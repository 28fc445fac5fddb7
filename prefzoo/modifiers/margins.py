"""Modifiers of a reward-difference loss's margin and β: ODPO (an offset from the data's scores) and β-DPO."""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

import torch
from torch import Tensor

from prefzoo.hookspecs import hookimpl
from prefzoo.modifiers._common import REWARD_DIFFERENCE, pair_margin_inputs
from prefzoo.spec import InnerLoss, LossParams, LossSpec, ModifierSpec, param
from prefzoo.types import LossContext, LossOutput, Need, PreferenceBatch, PreferenceBatchError

_MIN_BETA_SCALE = 1e-3  # β-DPO's β_batch never falls below 1e-3·β₀ (a batch far below M₀ would make it ≤ 0)


@dataclass(frozen=True, kw_only=True)
class ODPOParams(LossParams):
    alpha: float = param(1.0, "α: scale of the offset Δ_r = α·log(score(y_w) − score(y_l))", ge=0.0)


def odpo_offset(chosen_scores: Tensor, rejected_scores: Tensor, alpha: float) -> Tensor:
    """Δ_r = α·log(s_w − s_l) (ODPO Sec. 4: the log-scaled score difference); a constant."""
    diff = (chosen_scores - rejected_scores).detach()  # (B,)
    if not bool((diff > 0).all()):
        i = int(torch.nonzero(diff <= 0)[0])
        raise PreferenceBatchError(
            f"odpo: chosen_scores[{i}] = {chosen_scores[i].item()} is not above rejected_scores[{i}] = "
            f"{rejected_scores[i].item()}; ODPO's offset α·log(s_w − s_l) needs the chosen response scored higher"
        )
    return alpha * torch.log(diff)


def odpo(inner: InnerLoss, batch: PreferenceBatch, p: ODPOParams, spec: LossSpec, lp: LossParams,
         ctx: LossContext) -> LossOutput:  # fmt: skip
    """ODPO (Amini et al. 2024, arXiv:2402.10571): L = ℓ(β·Δ − Δ_r), Δ_r = α·log(score(y_w) − score(y_l)).

    A reward-difference loss reads the pair only through β·Δ, so log π(y_w) is lowered by Δ_r/β.
    """
    assert batch.chosen_scores is not None and batch.rejected_scores is not None
    beta = float(getattr(lp, "beta"))  # noqa: B009 (reward-difference losses declare the parameter beta)
    offset = odpo_offset(batch.chosen_scores, batch.rejected_scores, p.alpha).to(batch.policy_chosen_logps.dtype)
    out = inner(batch.replace(policy_chosen_logps=batch.policy_chosen_logps - offset / beta), lp)
    return dataclasses.replace(out, metrics={**out.metrics, "odpo/offset": offset.mean()})


@dataclass(frozen=True, kw_only=True)
class BetaDPOParams(LossParams):
    alpha: float = param(0.6, "α: how strongly β follows the batch's mean reward margin (paper: 0.6 on HH)", ge=0.0)
    m0: float = param(0.0, "M₀: the reward-margin threshold at which β_batch = β₀")
    filter_fraction: float = param(
        1.0, "ρ: fraction of the gathered batch kept, the pairs whose margin is closest to M₀ (1 = no filtering)",
        gt=0.0, le=1.0,
    )  # fmt: skip


def beta_dpo_stats(margins: Tensor, p: BetaDPOParams) -> tuple[Tensor, Tensor]:
    """(keep threshold on |M_i − M₀|, mean margin of the kept pairs) over a gathered (N,) tensor of margins."""
    dist = (margins - p.m0).abs()  # (N,)
    k = max(1, math.ceil(p.filter_fraction * margins.shape[0]))
    thresh = torch.kthvalue(dist, k).values  # every pair at least as close as the k-th is kept (ties all kept)
    kept = dist <= thresh
    return thresh, margins[kept].mean()


def beta_dpo(inner: InnerLoss, batch: PreferenceBatch, p: BetaDPOParams, spec: LossSpec, lp: LossParams,
             ctx: LossContext) -> LossOutput:  # fmt: skip
    """β-DPO (Wu et al. 2024, arXiv:2407.08639: dynamic β and β-guided data filtering).

    M_i = β₀·Δ_i (the pair's implicit reward margin);  β_batch = β₀·(1 + α·(mean_{kept} M_i − M₀)),
    kept = the ⌈ρ·N⌉ pairs of the gathered batch whose M_i is closest to M₀; the other pairs contribute 0.
    """
    beta0 = float(getattr(lp, "beta"))  # noqa: B009 (reward-difference losses declare the parameter beta)
    s_w, s_l = pair_margin_inputs(batch)
    m = (beta0 * (s_w - s_l)).detach()  # (B,) M_i
    thresh, mean_kept = beta_dpo_stats(ctx.gather(m), p)
    beta = beta0 * max(1 + p.alpha * (float(mean_kept) - p.m0), _MIN_BETA_SCALE)
    out = inner(batch, dataclasses.replace(lp, beta=beta))  # type: ignore[call-arg]
    keep = ((m - p.m0).abs() <= thresh).to(out.losses.dtype)  # (B,)
    metrics = {**out.metrics, "beta-dpo/beta": torch.tensor(beta), "beta-dpo/kept": keep.mean()}
    return dataclasses.replace(out, losses=out.losses * keep, metrics=metrics)


@hookimpl
def prefzoo_register_modifiers() -> list[ModifierSpec]:
    return [
        ModifierSpec(
            name="odpo",
            fn=odpo,
            params_cls=ODPOParams,
            paper="Amini et al. 2024, arXiv:2402.10571 (ODPO)",
            transforms="β·Δ ← β·Δ − α·log(score(y_w) − score(y_l))",
            applies=REWARD_DIFFERENCE,
            needs=frozenset({Need.SCORES}),
            description="DPO with an offset: the larger the data's score gap between the responses, the larger "
            "the margin the policy must reach. Needs score_chosen/score_rejected columns in the data.",
            notes="Rewards (and reward accuracy) are those of the offset margin β·Δ − Δ_r.",
        ),
        ModifierSpec(
            name="beta-dpo",
            fn=beta_dpo,
            params_cls=BetaDPOParams,
            paper="Wu et al. 2024, arXiv:2407.08639 (β-DPO)",
            transforms="β ← β₀·(1 + α·(mean M_i − M₀)) per batch, M_i = β₀·Δ_i; pairs far from M₀ filtered",
            applies=REWARD_DIFFERENCE,
            batch_coupled=True,
            description="Dynamic β: each batch's β grows with its mean implicit reward margin (gathered over all "
            "processes), and β-guided filtering keeps the pairs whose margin is closest to M₀.",
            notes="Stateless: M₀ is a fixed parameter, not the paper's moving average, and filtering keeps the "
            "⌈ρ·N⌉ closest pairs deterministically instead of sampling them, so resume and sharding are exact. "
            f"β_batch is at least {_MIN_BETA_SCALE:g}·β₀.",
        ),
    ]
