"""MMPO (Najafi & Fyshe, "Offline Preference Optimization via Maximum Marginal Likelihood Estimation"), ablations.

The listing in the paper is the reference implementation:

    R_w = r_ε + β·log π_ref(y_w|x)          R_l = 0.1 + β·log π_ref(y_l|x)
    R̂   = (R + ε − min R) / (max R + ε − min R)   over both responses of the gathered batch
    s_w = log π_θ(y_w|x) + R̂_w              s_l = log π_θ(y_l|x) + R̂_l
    L   = −logsumexp(s_w, s_l) − log σ(s_w − s_l)

Since log σ(a − b) = a − logsumexp(a, b), the listed loss equals −s_w exactly:
its gradient is −∇log π_θ(y_w|x), plain NLL on the chosen response, for every
β, r_ε, reference and rejected response.  The sigmoid weighting of the
paper's Theorem 3.1, ∇ = σ(s_w − s_l)∇log π(y_w) + σ(s_l − s_w)∇log π(y_l),
belongs to the logsumexp term alone: that is ``mmpo-no-aux``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

from prefzoo.losses._common import average_pair, minmax_normalize, registers, require
from prefzoo.spec import LossParams, LossSpec, param
from prefzoo.types import LossContext, LossOutput, Need, PreferenceBatch

PAPER = "Najafi & Fyshe, Offline Preference Optimization via Maximum Marginal Likelihood Estimation (MMPO), listing 1"


@dataclass(frozen=True, kw_only=True)
class MMPOParams(LossParams):
    beta: float = param(0.1, r"$\beta$: weight of $\log\pi_{\mathrm{ref}}$ inside the reward $R = r + "
        r"\beta\cdot\log\pi_{\mathrm{ref}}$", ge=0.0)
    reward_epsilon: float = param(0.6, r"$r_\varepsilon$: reward $r(y, y_w)$ of the chosen response (the target "
        r"margin)")
    rejected_reward: float = param(0.1, "reward r(y, y_l) of the rejected response; the listing's constant 0.1")
    norm_eps: float = param(1e-6, r"$\varepsilon$ of the min-max normalization $(R + \varepsilon - \min)/(\max + "
        r"\varepsilon - \min)$", ge=0.0)


@dataclass(frozen=True, kw_only=True)
class MMPOEntropyParams(MMPOParams):
    entropy_beta: float | None = param(
        None, r"weight of the entropy bonus; None uses $\beta$ as the paper does ($\beta\cdot H(\pi(\cdot\mid "
            r"x))$)", ge=0.0
    )


def _rewards(batch: PreferenceBatch, p: MMPOParams, average: bool) -> tuple[Tensor, Tensor]:
    """R_w = r_ε + β·log π_ref(y_w|x), R_l = rejected_reward + β·log π_ref(y_l|x); constants."""
    rw, rl = require(batch, "ref_chosen_logps", "ref_rejected_logps")
    rw, rl = rw.detach(), rl.detach()
    if average:
        rw, rl = average_pair(batch, rw, rl)
    return p.reward_epsilon + p.beta * rw, p.rejected_reward + p.beta * rl  # (B,), (B,)


def _scores(
    batch: PreferenceBatch, p: MMPOParams, ctx: LossContext, *, normalize: bool = True, average: bool = False
) -> tuple[Tensor, Tensor, dict[str, Tensor]]:
    """s_w, s_l of Eq. (7) with the listing's rewards, normalized over the gathered batch."""
    pw, pl = batch.policy_chosen_logps, batch.policy_rejected_logps  # (B,) log π_θ(y|x)
    if average:
        pw, pl = average_pair(batch, pw, pl)
    R_w, R_l = _rewards(batch, p, average)  # (B,)
    metrics: dict[str, Tensor] = {}
    if normalize:
        R_w, R_l, lo, hi = minmax_normalize(R_w, R_l, ctx.gather, p.norm_eps)
        metrics = {"mmpo/reward_min": lo.detach(), "mmpo/reward_max": hi.detach()}
    s_w = pw + R_w  # (B,)
    s_l = pl + R_l  # (B,)
    metrics["mmpo/weight_chosen"] = torch.sigmoid(s_w - s_l).detach().mean()  # σ(s_w − s_l), Theorem 3.1
    return s_w, s_l, metrics


def _mml(s_w: Tensor, s_l: Tensor, aux: bool) -> Tensor:
    """−logsumexp(s_w, s_l), plus −log σ(s_w − s_l) when ``aux`` (the listing's two lines)."""
    losses = -torch.logsumexp(torch.stack((s_w, s_l), dim=1), dim=1)  # (B,)
    if aux:
        losses = losses - F.logsigmoid(s_w - s_l)
    return losses


def _output(losses: Tensor, s_w: Tensor, s_l: Tensor, metrics: dict[str, Tensor]) -> LossOutput:
    return LossOutput(losses=losses, chosen_rewards=s_w.detach(), rejected_rewards=s_l.detach(), metrics=metrics)


def mmpo_loss(batch: PreferenceBatch, p: MMPOParams, ctx: LossContext) -> LossOutput:
    """MMPO, the paper's listing.  L = −logsumexp(s_w, s_l) − log σ(s_w − s_l)  (= −s_w exactly)."""
    s_w, s_l, m = _scores(batch, p, ctx)
    return _output(_mml(s_w, s_l, aux=True), s_w, s_l, m)


def mmpo_no_aux_loss(batch: PreferenceBatch, p: MMPOParams, ctx: LossContext) -> LossOutput:
    """MMPO without the DPO-style auxiliary term.  L = −logsumexp(s_w, s_l)."""
    s_w, s_l, m = _scores(batch, p, ctx)
    return _output(_mml(s_w, s_l, aux=False), s_w, s_l, m)


def mmpo_no_norm_loss(batch: PreferenceBatch, p: MMPOParams, ctx: LossContext) -> LossOutput:
    """MMPO with raw rewards R instead of the in-batch normalized R̂."""
    s_w, s_l, m = _scores(batch, p, ctx, normalize=False)
    return _output(_mml(s_w, s_l, aux=True), s_w, s_l, m)


def mmpo_length_norm_loss(batch: PreferenceBatch, p: MMPOParams, ctx: LossContext) -> LossOutput:
    """MMPO on per-token average log-probs of policy and reference: log π(y|x)/|y|."""
    s_w, s_l, m = _scores(batch, p, ctx, average=True)
    return _output(_mml(s_w, s_l, aux=True), s_w, s_l, m)


def entropy_surrogate(token_logps: Tensor, entropies: Tensor, mask: Tensor) -> Tensor:
    """Per-sequence surrogate whose gradient is ∇P1 + ∇P2 of the paper's appendix; its value is Σ_t H_t.

    P1 = Σ_t log π(z_<t|x) · H(π(·|z_<t, x))  with H held constant (score-function term)
    P2 = Σ_t H(π(·|z_<t, x))                   (pathwise term)
    log π(z_<t|x) is the exclusive cumulative sum of the token log-probs.
    """
    m = mask.to(token_logps.dtype)  # (B, T)
    lp = token_logps * m
    prefix = torch.cumsum(lp, dim=1) - lp  # (B, T) log π(z_<t | x)
    h = entropies * m  # (B, T) H_t
    p1 = (prefix * h.detach()).sum(dim=1)  # (B,)
    p2 = h.sum(dim=1)  # (B,)
    return p2 + (p1 - p1.detach())  # value Σ_t H_t, gradient ∇P1 + ∇P2


def mmpo_entropy_loss(batch: PreferenceBatch, p: MMPOEntropyParams, ctx: LossContext) -> LossOutput:
    """MMPO plus entropy maximization: L = L_MMPO − β·Ĥ, Ĥ averaged over the pair's two completions."""
    s_w, s_l, m = _scores(batch, p, ctx)
    tw, tl, hw, hl, mw, ml = require(
        batch, "policy_chosen_token_logps", "policy_rejected_token_logps", "chosen_token_entropies",
        "rejected_token_entropies", "chosen_mask", "rejected_mask",
    )  # fmt: skip
    h = 0.5 * (entropy_surrogate(tw, hw, mw) + entropy_surrogate(tl, hl, ml))  # (B,)
    weight = p.beta if p.entropy_beta is None else p.entropy_beta
    m["mmpo/entropy"] = h.detach().mean()
    return _output(_mml(s_w, s_l, aux=True) - weight * h, s_w, s_l, m)


_SCORES = r"$s_w, s_l$: $\log\pi_\theta(y\mid x)$ plus the in-batch min-max normalized reward (paper, appendix)"
_REF = frozenset({Need.REFERENCE})

_COMMON: dict[str, Any] = dict(family="mmpo", paper=PAPER, scores=_SCORES, batch_coupled=True)


# every spec this module registers, in catalogue order: declarations are data
_SPECS: tuple[LossSpec, ...] = (
    LossSpec(
        name="mmpo",
        fn=mmpo_loss,
        params_cls=MMPOParams,
        formula_tex=r"-\operatorname{logsumexp}(s_w, s_l) - \log\sigma(s_w - s_l)\quad(\equiv -s_w)",
        needs=_REF,
        description="MMPO as listed in the paper: the MML logsumexp term plus the DPO-style auxiliary term, "
        r"on rewards $r + \beta\cdot\log\pi_{\mathrm{ref}}$ min-max normalized over the gathered batch.",
        notes=r"The two terms sum to $-s_w$ exactly, so the gradient is $-\nabla\log\pi(y_w\mid x)$: NLL on the chosen "
        r"response, independent of $\beta$, $r_\varepsilon$, the reference and the rejected response.",
        **_COMMON,
    ),
    LossSpec(
        name="mmpo-no-aux",
        fn=mmpo_no_aux_loss,
        params_cls=MMPOParams,
        formula_tex=r"-\operatorname{logsumexp}(s_w, s_l)",
        needs=_REF,
        monotone=False,
        description=r"Ablation: MMPO without the auxiliary $-\log\sigma(s_w - s_l)$ term. Its gradient is Theorem "
            r"3.1's "
        r"$-\sigma(s_w - s_l)\nabla\log\pi(y_w) - \sigma(s_l - s_w)\nabla\log\pi(y_l)$.",
        notes=r"Raises the likelihood of both responses ($\partial L/\partial\log\pi(y_l) = -\sigma(s_l - s_w) \le "
            r"0$), weighting the "
        r"chosen one more when $s_w > s_l$.",
        **_COMMON,
    ),
    LossSpec(
        name="mmpo-no-norm",
        fn=mmpo_no_norm_loss,
        params_cls=MMPOParams,
        formula_tex=r"-\operatorname{logsumexp}(s_w, s_l) - \log\sigma(s_w - s_l),\quad s = \log\pi + "
                    r"R\;\text{(unnormalized)}",
        needs=_REF,
        description=r"Ablation: MMPO with raw rewards $R = r + \beta\cdot\log\pi_{\mathrm{ref}}$, no in-batch "
            r"normalization.",
        notes="Still ≡ −s_w; without normalization no example depends on another.",
        **{**_COMMON, "batch_coupled": False},
    ),
    LossSpec(
        name="mmpo-length-norm",
        fn=mmpo_length_norm_loss,
        params_cls=MMPOParams,
        formula_tex=r"\text{MMPO with } \frac{\log\pi(y\mid x)}{\lvert y\rvert} \text{ and } "
                    r"\frac{\log\pi_{\mathrm{ref}}(y\mid x)}{\lvert y\rvert}",
        needs=_REF | {Need.LENGTHS},
        description="Ablation: MMPO on per-token average log-probs of the policy and the reference.",
        notes=r"Still $\equiv -s_w$: its gradient is $-\nabla\log\pi(y_w\mid x)/\lvert y_w\rvert$, a per-token NLL.",
        **_COMMON,
    ),
    LossSpec(
        name="mmpo-entropy",
        fn=mmpo_entropy_loss,
        params_cls=MMPOEntropyParams,
        formula_tex=r"-\operatorname{logsumexp}(s_w, s_l) - \log\sigma(s_w - s_l) - \beta\cdot\hat{H}(\pi(\cdot\mid "
                    r"x))",
        needs=_REF | {Need.TOKEN_LOGPS, Need.TOKEN_ENTROPIES},
        monotone=False,
        description=r"Ablation: MMPO plus entropy maximization with the appendix's estimator $\nabla P_1 + \nabla P_2$ "
            r"over "
        "per-token log-probs and entropies of both completions.",
        notes=r"$\hat{H}$'s value is $\sum_t H_t$; its gradient is the score-function term $\nabla P_1$ plus the "
        r"pathwise $\nabla P_2$.",
        **_COMMON,
    ),
    )


prefzoo_register_losses = registers(_SPECS)
