"""List losses: K ≥ 2 ranked completions z_1..z_K of one prompt (a GroupBatch), one loss per group.

The ranking is the batch's (``GroupBatch.ranking_scores``: the scores, ties allowed,
else column order).  Padding slots are masked out of every sum, softmax and pair.
Plackett–Luce factors use the Breslow convention for ties: completion i's factor
normalises over every completion ranked no higher than i (tied ones included),
which is the plain Plackett–Luce likelihood when there are no ties and is
unchanged by reordering tied completions.

- ``mml``: the paper's n-sample MML estimator (Eq. 4) with the listing's rewards and normalisation.
- ``mmpo-list``: ``mml`` plus the Plackett–Luce NLL of the ranking under s (K = 2: the listing, ``mmpo``).
- ``dpo-pl``: Plackett–Luce DPO (Rafailov et al. 2023, appendix A.3; K = 2: ``dpo``).
- ``lipo``: LiPO-λ (Liu et al. 2024), pairwise logistic losses weighted by LambdaLoss's ΔNDCG.
- ``rrhf``: RRHF (Yuan et al. 2023), a ranking hinge on length-normalised log-probs plus SFT on the best.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

from prefzoo.losses._common import gathered_bounds, minmax_scale, registers
from prefzoo.losses.mmpo import PAPER as MMPO_PAPER
from prefzoo.losses.mmpo import MMPOParams
from prefzoo.losses.shapes import best_worst_columns
from prefzoo.spec import LossParams, LossSpec, param
from prefzoo.types import GroupBatch, GroupBatchError, LossContext, LossOutput, Need, Shape

__all__ = ["MMLParams", "best_mask", "plackett_luce_nll"]

LISTS = frozenset({Shape.LIST})


@dataclass(frozen=True, kw_only=True)
class MMLParams(MMPOParams):
    reward_from: str = param(
        "rank",
        r"where $r_k$ comes from: 'rank' ($r_\varepsilon$ for the best completion, rejected_reward for the rest) or "
        "'score' "
        "(the scores, or without scores the rank grade, the number of completions ranked below, min-max scaled to "
        "[0, 1] over the gathered batch)",
        choices=("rank", "score"),
    )


@dataclass(frozen=True, kw_only=True)
class PLDPOParams(LossParams):
    beta: float = param(0.1, r"$\beta$: inverse temperature of the implicit reward "
        r"$\beta\cdot\log(\pi/\pi_{\mathrm{ref}})$", gt=0.0)


@dataclass(frozen=True, kw_only=True)
class RRHFParams(LossParams):
    sft_weight: float = param(1.0, r"weight of the SFT term $-\log\pi(z_{\mathrm{best}}\mid x)$", ge=0.0)


# --- shared pieces ------------------------------------------------------------------------------------------------


def best_mask(batch: GroupBatch) -> Tensor:
    """(G, K) bool: the real completions ranked first (several where the top score ties)."""
    r, valid = batch.ranking_scores, batch.valid
    top = torch.where(valid, r, -torch.inf).amax(dim=1, keepdim=True)  # (G, 1)
    return valid & (r == top)


def plackett_luce_nll(s: Tensor, batch: GroupBatch) -> Tensor:
    """−log PL(ranking | s) per group: Σ_i logsumexp_{j: r_j ≤ r_i} (s_j − s_i) over real completions i.  (G,)

    Without ties this is Σ_{j=1}^{K} −log( e^{s_π(j)} / Σ_{m ≥ j} e^{s_π(m)} ) for the ranking π (its last factor
    is 1).  Each factor is a logsumexp of differences s_j − s_i (0 for j = i), not logsumexp(s) − s_i, which
    would cancel catastrophically at |s| ~ 1e4 in float32.  Every risk set holds i itself, so no logsumexp is
    over an empty set (no −inf, no NaN gradient).
    """
    r, valid = batch.ranking_scores, batch.valid  # (G, K)
    k = r.shape[1]
    eye = torch.eye(k, dtype=torch.bool, device=r.device)
    risk = ((r[:, None, :] <= r[:, :, None]) & valid[:, None, :]) | eye  # (G, K_i, K_j): j in i's risk set
    diff = s[:, None, :] - s[:, :, None]  # (G, K_i, K_j) s_j − s_i
    factors = torch.logsumexp(diff.masked_fill(~risk, -torch.inf), dim=2)  # (G, K) −log P(i first among its set)
    return factors.masked_fill(~valid, 0.0).sum(dim=1)  # (G,)


def _output(losses: Tensor, s: Tensor, batch: GroupBatch, metrics: dict[str, Tensor]) -> LossOutput:
    """Per-completion scores s (0 on padding); chosen / rejected: the best / worst completion's."""
    best, worst = best_worst_columns(batch)  # (G,)
    sd = s.detach().masked_fill(~batch.valid, 0.0)  # (G, K)
    return LossOutput(losses=losses, chosen_rewards=sd.gather(1, best[:, None])[:, 0],
                      rejected_rewards=sd.gather(1, worst[:, None])[:, 0], metrics=metrics, rewards=sd)


def _require(batch: GroupBatch, name: str) -> Tensor:
    t = getattr(batch, name)
    if t is None:
        raise GroupBatchError(f"GroupBatch.{name} is None but this loss needs it")
    return t


# --- mml and mmpo-list ----------------------------------------------------------------------------------------------


def _mml_scores(batch: GroupBatch, p: MMLParams, ctx: LossContext) -> tuple[Tensor, dict[str, Tensor]]:
    """s_k = log π_θ(z_k|x) + R̂_k, R_k = r_k + β·log π_ref(z_k|x) min-max normalised over the gathered batch.  (G, K)"""
    valid = batch.valid
    ref = _require(batch, "ref_logps").detach()  # (G, K)
    if p.reward_from == "rank":
        r = torch.where(best_mask(batch), ref.new_tensor(p.reward_epsilon), ref.new_tensor(p.rejected_reward))
    else:
        v = batch.ranking_scores.to(ref.dtype)  # (G, K)
        lo_v, hi_v = gathered_bounds(v[valid], ctx.gather)
        r = minmax_scale(v, lo_v, hi_v, 0.0)  # (G, K) in [0, 1]; 0 when every score ties
    R = r + p.beta * ref  # (G, K) r_k + β·log π_ref(z_k|x)
    lo, hi = gathered_bounds(R[valid], ctx.gather)  # over the real completions of every process
    s = batch.policy_logps + minmax_scale(R, lo, hi, p.norm_eps)  # (G, K)
    weight = torch.softmax(s.detach().masked_fill(~valid, -torch.inf), dim=1)  # Theorem 3.1's softmax(s)
    metrics = {"mmpo/reward_min": lo.detach(), "mmpo/reward_max": hi.detach(),
               "mml/weight_best": (weight * best_mask(batch)).sum(dim=1).mean()}
    return s, metrics


def _neg_lse(s: Tensor, valid: Tensor) -> Tensor:
    """−logsumexp over the real completions of each group.  (G,)"""
    return -torch.logsumexp(s.masked_fill(~valid, -torch.inf), dim=1)


def mml_loss(batch: GroupBatch, p: MMLParams, ctx: LossContext) -> LossOutput:
    """The paper's n-sample MML estimator (Eq. 4).  L = −logsumexp_k s_k over the group's completions."""
    s, m = _mml_scores(batch, p, ctx)
    return _output(_neg_lse(s, batch.valid), s, batch, m)


def mmpo_list_loss(batch: GroupBatch, p: MMLParams, ctx: LossContext) -> LossOutput:
    """MML plus the Plackett–Luce NLL of the ranking under s.  L = −logsumexp_k s_k − log PL(ranking | s).

    With a unique best z_1 the first PL factor cancels the logsumexp (docs/theory.md): L = −s_1 + PL NLL of the
    ranking of z_2..z_K, whose terms do not involve s_1; ∂L/∂log π(z_1|x) = −1.
    """
    s, m = _mml_scores(batch, p, ctx)
    pl = plackett_luce_nll(s, batch)  # (G,)
    m["mmpo-list/pl_nll"] = pl.detach().mean()
    return _output(_neg_lse(s, batch.valid) + pl, s, batch, m)


# --- dpo-pl, lipo, rrhf -------------------------------------------------------------------------------------------


def _implicit_rewards(batch: GroupBatch, beta: float) -> Tensor:
    """u_k = β·(log π_θ(z_k|x) − log π_ref(z_k|x)).  (G, K)"""
    return beta * (batch.policy_logps - _require(batch, "ref_logps").detach())


def dpo_pl_loss(batch: GroupBatch, p: PLDPOParams, ctx: LossContext) -> LossOutput:
    """Plackett–Luce DPO (Rafailov et al. 2023, arXiv:2305.18290, appendix A.3, Eq. 18).

    L = −Σ_{k=1}^{K} log( exp(u_{τ(k)}) / Σ_{j ≥ k} exp(u_{τ(j)}) ),  u = β·log(π_θ/π_ref), τ the ranking.
    """
    u = _implicit_rewards(batch, p.beta)
    return _output(plackett_luce_nll(u, batch), u, batch, {})


def lambda_weights(u: Tensor, batch: GroupBatch) -> Tensor:
    """LiPO-λ's Δ_ij = |G_i − G_j|·|1/D(τ(i)) − 1/D(τ(j))| for ψ_i > ψ_j (real slots), else 0.  (G, K, K), constant.

    G = 2^ψ − 1 (ψ: the ranking scores), D(τ) = log₂(1 + τ), τ(i) the rank of u_i among the group's real
    completions (1 = highest u).  Where u ties, the sort order is arbitrary, so the rank term is its mean over
    every order of the tied completions: the mean of |1/D(x) − 1/D(y)| over positions x ≠ y that i and j can
    take.  Without ties that is the formula as written; with ties the weights do not depend on slot order, and a
    tied pair keeps the weight of adjacent ranks instead of dropping to 0.
    """
    psi, valid = batch.ranking_scores.to(u.dtype), batch.valid
    gain = torch.exp2(psi)  # 2^ψ (the −1 cancels in G_i − G_j)
    if not bool(torch.isfinite(gain[valid]).all()):
        raise GroupBatchError("GroupBatch.scores: lipo's gain 2^score overflows; rescale the scores (e.g. to [0, 10])")
    ud = u.detach()
    k = u.shape[1]
    pair = valid[:, :, None] & valid[:, None, :]  # (G, K, K)
    first = 1 + ((ud[:, None, :] > ud[:, :, None]) & pair).sum(dim=2)  # (G, K) best rank i can take
    count = ((ud[:, None, :] == ud[:, :, None]) & pair).sum(dim=2)  # (G, K) size of i's tie block (itself too)
    ranks = torch.arange(1, k + 1, device=u.device)  # (P,) positions 1..K
    pos = ((ranks >= first[..., None]) & (ranks < (first + count)[..., None])).to(u.dtype)  # (G, K, P)
    inv_d = 1.0 / torch.log2(1.0 + ranks.to(u.dtype))  # (P,) 1/D(x)
    gap = (inv_d[:, None] - inv_d[None, :]).abs()  # (P, P) |1/D(x) − 1/D(y)|, 0 on the diagonal
    total = torch.einsum("gip,pq,gjq->gij", pos, gap, pos)  # (G, K, K) Σ over x ∈ P_i, y ∈ P_j
    n = count.to(u.dtype)
    shared = torch.einsum("gip,gjp->gij", pos, pos)  # (G, K, K) |P_i ∩ P_j|: the x = y terms left out
    den = n[:, :, None] * n[:, None, :] - shared
    rank_term = torch.where(den > 0, total / den.clamp(min=1), torch.zeros_like(total))  # E|1/D(τ_i) − 1/D(τ_j)|
    delta = (gain[:, :, None] - gain[:, None, :]).abs() * rank_term
    better = (psi[:, :, None] > psi[:, None, :]) & pair  # (G, K_i, K_j) ψ_i > ψ_j
    return torch.where(better, delta, torch.zeros_like(delta))


def lipo_loss(batch: GroupBatch, p: PLDPOParams, ctx: LossContext) -> LossOutput:
    """LiPO-λ (Liu et al. 2024, arXiv:2402.01878, Eq. 5).  L = Σ_{ψ_i > ψ_j} Δ_ij · −log σ(u_i − u_j)."""
    u = _implicit_rewards(batch, p.beta)
    w = lambda_weights(u, batch)  # (G, K, K)
    pairwise = F.softplus(u[:, None, :] - u[:, :, None])  # (G, K_i, K_j) −log σ(u_i − u_j)
    return _output((w * pairwise).sum(dim=(1, 2)), u, batch, {"lipo/weight_sum": w.sum(dim=(1, 2)).mean()})


def rrhf_loss(batch: GroupBatch, p: RRHFParams, ctx: LossContext) -> LossOutput:
    """RRHF (Yuan et al. 2023, arXiv:2304.05302, Eqs. 1–3).

    p_k = log π(z_k|x)/|z_k|;  L = Σ_{r_i < r_j} max(0, p_i − p_j) − sft_weight·log π(z_best|x)
    (the SFT term averaged over tied bests).
    """
    valid = batch.valid
    lengths = _require(batch, "lengths")
    pk = batch.policy_logps / lengths.clamp(min=1).to(batch.policy_logps.dtype)  # (G, K) length-normalised
    r = batch.ranking_scores
    worse = (r[:, :, None] < r[:, None, :]) & valid[:, :, None] & valid[:, None, :]  # (G, K_i, K_j) r_i < r_j
    hinge = torch.relu(pk[:, :, None] - pk[:, None, :])  # (G, K_i, K_j) max(0, p_i − p_j)
    rank = torch.where(worse, hinge, torch.zeros_like(hinge)).sum(dim=(1, 2))  # (G,)
    top = best_mask(batch)
    sft = -(batch.policy_logps * top).sum(dim=1) / top.sum(dim=1)  # (G,) −log π(z_best|x)
    metrics = {"rrhf/rank": rank.detach().mean(), "rrhf/sft": sft.detach().mean()}
    return _output(rank + p.sft_weight * sft, pk, batch, metrics)


# --- registration -------------------------------------------------------------------------------------------------

_MML_SCORES = (
    r"$s_k = \log\pi_\theta(z_k\mid x) + \hat{R}_k$ ($R = r + \beta\cdot\log\pi_{\mathrm{ref}}$, min-max "
    r"normalised over the gathered batch)"
)
_DPO_SCORES = r"$u_k = \beta\cdot(\log\pi_\theta(z_k\mid x) - \log\pi_{\mathrm{ref}}(z_k\mid x))$ (DPO implicit reward)"
_REF = frozenset({Need.REFERENCE})

_MML_COMMON: dict[str, Any] = dict(family="mmpo", params_cls=MMLParams, scores=_MML_SCORES, needs=_REF,
                                   batch_coupled=True, shapes=LISTS)
_DPO_LIST: dict[str, Any] = dict(family="dpo", params_cls=PLDPOParams, scores=_DPO_SCORES, needs=_REF,
                                 shift_invariant=True, shapes=LISTS)


# every spec this module registers, in catalogue order: declarations are data
_SPECS: tuple[LossSpec, ...] = (
    LossSpec(
        name="mml",
        fn=mml_loss,
        formula_tex=r"-\operatorname{logsumexp}_k s_k\quad\text{over the K completions}",
        paper=f"{MMPO_PAPER}; Eq. 4 (the n-sample MML estimator)",
        monotone=False,
        description=r"The paper's MML estimator with $n = K$ samples per prompt: $\hat{J} = \operatorname{logsumexp}_k "
        r"s_k$, rewards $r_k$ from the rank ($r_\varepsilon$ for the best, the listing's 0.1 for the rest) or from the "
        r"scores, plus $\beta\cdot\log\pi_{\mathrm{ref}}$, "
        "min-max normalised over the whole gathered batch as in the listing. K = 2 with reward_from='rank' is "
        "mmpo-no-aux exactly.",
        notes=r"Theorem 3.1 for $n$ samples: $-\partial L/\partial\log\pi(z_k\mid x) = \mathrm{softmax}(s)_k$, so "
        "every completion's likelihood rises, the highest-scored most.",
        **_MML_COMMON,
    ),
    LossSpec(
        name="mmpo-list",
        fn=mmpo_list_loss,
        formula_tex=r"-\operatorname{logsumexp}_k s_k - \log\mathrm{PL}(\text{ranking}\mid s)\quad(\equiv "
                    r"-s_{\mathrm{best}} + \text{PL NLL of the ranking of the rest})",
        paper=f"{MMPO_PAPER}, generalised to K completions with a Plackett–Luce auxiliary term",
        description="MMPO for lists: the MML logsumexp plus the Plackett–Luce negative log-likelihood of the "
        r"ranking under $s$, the list generalisation of the listing's $-\log\sigma(s_w - s_l)$. $K = 2$ is mmpo "
            r"exactly.",
        notes=r"The first Plackett–Luce factor cancels the logsumexp: with a unique best, $L = -s_{\mathrm{best}} + "
        r"\sum_{j\geq2} [\operatorname{logsumexp}_{m\geq{}j} s_{\pi(m)} - s_{\pi(j)}]$, NLL on the best plus a "
        "ranking loss over the rest that does "
        "not involve the best (docs/theory.md).",
        **_MML_COMMON,
    ),
    LossSpec(
        name="dpo-pl",
        fn=dpo_pl_loss,
        **_DPO_LIST,
        formula_tex=r"-\sum_k \log\frac{e^{u_{\tau(k)}}}{\sum_{j\geq k} e^{u_{\tau(j)}}},\quad u = "
                    r"\beta\cdot(\log\pi_\theta - \log\pi_{\mathrm{ref}})",
        paper="Rafailov et al. 2023, arXiv:2305.18290 (DPO), appendix A.3 (Plackett–Luce)",
        description="Plackett–Luce DPO: the negative log-likelihood of the whole ranking under the implicit "
        "reward. K = 2 is dpo.",
    ),
    LossSpec(
        name="lipo",
        fn=lipo_loss,
        **_DPO_LIST,
        formula_tex=r"\sum_{\psi_i > \psi_j} \Delta_{ij}\cdot\bigl(-\log\sigma(u_i - u_j)\bigr),\quad \Delta_{ij} = "
                    r"\lvert 2^{\psi_i} - 2^{\psi_j}\rvert\cdot\left\lvert\frac{1}{\log_2(1 + \tau_i)} - "
                    r"\frac{1}{\log_2(1 + \tau_j)}\right\rvert",
        paper="Liu et al. 2024, arXiv:2402.01878 (LiPO-λ), Eq. 5",
        description=r"LiPO-$\lambda$: every correctly labelled pair's DPO loss weighted by LambdaLoss's "
        r"$\Delta\mathrm{NDCG}$, the change of NDCG if the pair swapped places in the ranking by $u$ ($\tau$). "
        r"Labels $\psi$ are the scores (without scores, the "
        "rank grade: how many completions are ranked below).",
        notes=r"$\Delta$ is held constant (the ranks $\tau$ come from a sort). $D$ uses $\log_2$ as NDCG does; a "
        r"natural log only scales every $\Delta$ by $\ln 2$.",
    ),
    LossSpec(
        name="rrhf",
        fn=rrhf_loss,
        params_cls=RRHFParams,
        family="rrhf",
        formula_tex=r"\sum_{r_i < r_j} \max(0, p_i - p_j) - \log\pi(z_{\mathrm{best}}\mid x),\quad p = "
                    r"\frac{\log\pi_\theta(z\mid x)}{\lvert z\rvert}",
        paper="Yuan et al. 2023, arXiv:2304.05302 (RRHF), Eqs. 1–3",
        scores=r"$p_k = \log\pi_\theta(z_k\mid x)/\lvert z_k\rvert$ (length-normalised log-prob)",
        needs=frozenset({Need.LENGTHS}),
        shapes=LISTS,
        description="RRHF: a ranking hinge on length-normalised log-probs over every ordered pair, plus SFT "
        "(summed NLL) on the best completion; no reference model.",
        notes="Tied completions are never paired; tied bests share the SFT term.",
    ),
    )


prefzoo_register_losses = registers(_SPECS)
