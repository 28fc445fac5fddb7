"""Modifiers that rewrite the log-probs a loss sees: LD-DPO (TRL ``ld_alpha``) and AlphaPO (TRL CPO ``alpha``)."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from prefzoo.modifiers._common import LOGP_REWARD, registers, soft_exp
from prefzoo.spec import Applicability, InnerLoss, LossParams, LossSpec, ModifierSpec, param
from prefzoo.types import LossContext, LossOutput, Need, PreferenceBatch

_ALPHAPO_EXP_CAP = 60.0  # e^60·(1 + 1e4) stays finite in float32; TRL's formula is exact up to −α·u = 60


@dataclass(frozen=True, kw_only=True)
class LDDPOParams(LossParams):
    alpha: float = param(0.5, r"$\alpha$: weight of the tokens past the shared length $\min(\lvert y_w\rvert, \lvert "
        r"y_l\rvert)$ (TRL ld_alpha)",
                         ge=0.0, le=1.0)  # fmt: skip


def desensitized(token_logps: Tensor, mask: Tensor, shared: Tensor, alpha: float) -> Tensor:
    """Σ_{t ≤ ℓ} log π(y_t) + α·Σ_{t > ℓ} log π(y_t), counting completion tokens of ``mask``; ℓ = ``shared`` (B,)."""
    pos = mask.long().cumsum(-1)  # (B, T) 1-based position of each completion token
    head = mask & (pos <= shared[:, None])  # (B, T)
    tail = mask & (pos > shared[:, None])
    return (token_logps * head).sum(-1) + alpha * (token_logps * tail).sum(-1)  # (B,)


def ld_dpo(
    inner: InnerLoss, batch: PreferenceBatch, p: LDDPOParams, spec: LossSpec, lp: LossParams, ctx: LossContext
) -> LossOutput:
    """LD-DPO (Liu et al. 2024, arXiv:2409.06411), as TRL 1.16 ``ld_alpha``.

    log π̂(y|x) = Σ_{t ≤ ℓ} log π(y_t) + α·Σ_{t > ℓ} log π(y_t),  ℓ = min(|y_w|, |y_l|), for policy and reference
    """
    assert batch.chosen_mask is not None and batch.rejected_mask is not None
    assert batch.policy_chosen_token_logps is not None and batch.policy_rejected_token_logps is not None
    mw, ml = batch.chosen_mask, batch.rejected_mask
    shared = torch.minimum(mw.sum(-1), ml.sum(-1))  # (B,) ℓ
    ch: dict[str, Tensor] = {
        "policy_chosen_logps": desensitized(batch.policy_chosen_token_logps, mw, shared, p.alpha),
        "policy_rejected_logps": desensitized(batch.policy_rejected_token_logps, ml, shared, p.alpha),
    }
    if batch.ref_chosen_token_logps is not None and batch.ref_rejected_token_logps is not None:
        ch["ref_chosen_logps"] = desensitized(batch.ref_chosen_token_logps.detach(), mw, shared, p.alpha)
        ch["ref_rejected_logps"] = desensitized(batch.ref_rejected_token_logps.detach(), ml, shared, p.alpha)
    return inner(batch.replace(**ch), lp)


@dataclass(frozen=True, kw_only=True)
class AlphaPOParams(LossParams):
    alpha: float = param(0.25, r"$\alpha$: reward shape $r = (1 - \pi^{-\alpha})/\alpha$ (TRL CPO alpha; $\alpha \to "
        r"0$ is $\log\pi$)", ge=-1.0, le=1.0)


def alpha_reward(u: Tensor, alpha: float) -> Tensor:
    """r(u) = (1 − e^(−α·u))/α for a log-prob u (log π, or its per-token average); u itself at α = 0.

    Evaluated as u·φ(x), x = −α·u, φ(x) = (e^x − 1)/x (a series near 0): no 0/0 for tiny α in float32.
    """
    if alpha == 0.0:
        return u
    x = -alpha * u
    small = x.abs() < 1e-3
    xs = torch.where(small, torch.ones_like(x), x)
    em1 = torch.where(
        xs > _ALPHAPO_EXP_CAP, soft_exp(xs, _ALPHAPO_EXP_CAP) - 1, torch.expm1(xs.clamp(max=_ALPHAPO_EXP_CAP))
    )
    phi = torch.where(small, 1 + x / 2 + x * x / 6, em1 / xs)
    return u * phi


def alphapo(
    inner: InnerLoss, batch: PreferenceBatch, p: AlphaPOParams, spec: LossSpec, lp: LossParams, ctx: LossContext
) -> LossOutput:
    """AlphaPO (Gupta et al. 2025, arXiv:2501.03884), as TRL 1.16 CPO ``alpha``: r = (1 − π^(−α))/α replaces log π.

    For an ``average`` loss (SimPO) the per-token average ū = log π/|y| is shaped, log π ← |y|·r(ū), as TRL.
    """
    pw, pl = batch.policy_chosen_logps, batch.policy_rejected_logps
    if spec.logp_reward == "average":
        assert batch.chosen_lengths is not None and batch.rejected_lengths is not None
        nw, nl = batch.chosen_lengths.to(pw.dtype), batch.rejected_lengths.to(pl.dtype)
        new_w, new_l = nw * alpha_reward(pw / nw, p.alpha), nl * alpha_reward(pl / nl, p.alpha)
    else:
        new_w, new_l = alpha_reward(pw, p.alpha), alpha_reward(pl, p.alpha)
    return inner(batch.replace(policy_chosen_logps=new_w, policy_rejected_logps=new_l), lp)


_SPECS: tuple[ModifierSpec, ...] = (
    ModifierSpec(
        name="ld-dpo",
        fn=ld_dpo,
        params_cls=LDDPOParams,
        paper="Liu et al. 2024, arXiv:2409.06411 (LD-DPO)",
        transforms_tex=r"\log\pi(y) \leftarrow \sum_{t\le\ell} \log\pi(y_t) + \alpha\cdot\sum_{t>\ell} "
                       r"\log\pi(y_t),\quad \ell "
                      r"= \min(\lvert y_w\rvert, \lvert y_l\rvert)\ \text{(policy and reference)}",
        applies=Applicability("every loss (it rewrites the sequence log-probs any loss reads)", lambda s, p: True),
        needs=frozenset({Need.TOKEN_LOGPS}),
        reference_needs=frozenset({Need.REF_TOKEN_LOGPS}),
        trl="DPOConfig.ld_alpha",
        description=r"Length-desensitized DPO: tokens past the shorter response's length count with weight $\alpha$, "
        "so the longer response's extra tokens no longer dominate the log-ratio.",
        notes="The reference's per-token log-probs are needed too, so it cannot be precomputed (--precompute-ref).",
    ),
    ModifierSpec(
        name="alphapo",
        fn=alphapo,
        params_cls=AlphaPOParams,
        paper="Gupta et al. 2025, arXiv:2501.03884 (AlphaPO)",
        transforms_tex=r"u \leftarrow \frac{1 - e^{-\alpha\cdot u}}{\alpha}\ \text{for the loss's reward}\ u = "
                       r"\log\pi(y\mid "
                      r"x) \text{ or } \frac{\log\pi(y\mid x)}{\lvert y\rvert}",
        applies=LOGP_REWARD,
        trl="CPOConfig.alpha (trl.experimental.cpo)",
        description=r"AlphaPO reward shaping: the reference-free reward $\log\pi$ is replaced by $(1 - "
            r"\pi^{-\alpha})/\alpha$, "
        "which changes how fast the likelihood of the preferred response may fall.",
        notes=f"Beyond $-\\alpha\\cdot u = {_ALPHAPO_EXP_CAP:g}$ the exponential continues along its tangent "
        "(finite, with a gradient), where TRL overflows.",
    ),
)

prefzoo_register_modifiers = registers(_SPECS)
