"""The DPO family with the semantics of TRL 1.16's DPOTrainer, plus cDPO, R-DPO and f-DPO.

Every loss here is a function of the log-ratios
    ρ_w = log π_θ(y_w|x) − log π_ref(y_w|x),   ρ_l = log π_θ(y_l|x) − log π_ref(y_l|x)
and its scores are the implicit rewards β·ρ (Rafailov et al. 2023).  The
reward-difference losses accept f-DPO's divergence (Wang et al. 2023,
arXiv:2309.16240), which replaces ρ by f'(π/π_ref) before taking Δ = f'_w − f'_l.
DPO-Positive (Smaug) adds a penalty on ρ_w < 0 inside the sigmoid.

Exponentials and IPO's square are capped without losing their gradient (``exp_capped``, ``square_capped``):
equal to TRL's values below the cap, finite and still increasing beyond it, so a pair far out (ρ < −80 with
forward KL) is pulled back instead of sitting on a flat loss with zero gradient.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

from prefzoo.losses._common import (
    EXP_CAP,
    NLL_NOTE,
    average_policy_logps,
    chosen_nll,
    exp_capped,
    exp_capped_diff,
    logratios,
    nll_coupled,
    nll_reduction_param,
    registers,
    require,
    sorted_pair_loss,
    square_capped,
)
from prefzoo.spec import LossFn, LossParams, LossSpec, param
from prefzoo.types import LossContext, LossOutput, Need, PreferenceBatch

F_DIVERGENCES = ("reverse_kl", "forward_kl", "js_divergence", "alpha_divergence")
_CAP_NOTE = (
    r"forward_kl and alpha_divergence: $e^x$ is TRL's up to $x = 80$ (TRL's own $\alpha$-divergence clamp), then "
    r"$e^{80}\cdot(1 + 0.1\cdot u/(0.1 + u))$ with $u = x - 80$: same slope at 80, still increasing (non-zero "
    r"gradient) and at most $1.1\cdot e^{80}$, where TRL's forward KL overflows float32 ($x > 88.7$) and its "
    r"$\alpha$-divergence is flat with zero gradient."
)
_IPO_MAX_DELTA = 1e18  # (1e18)² = 1e36 < float32 max 3.4e38; only exponential f-divergences get this far


@dataclass(frozen=True, kw_only=True)
class DPOParams(LossParams):
    beta: float = param(0.1, r"$\beta$: inverse temperature of the implicit reward "
        r"$\beta\cdot\log(\pi/\pi_{\mathrm{ref}})$", gt=0.0)


@dataclass(frozen=True, kw_only=True)
class FDPOParams(DPOParams):
    f_divergence: str = param("reverse_kl", "f-DPO divergence (reverse_kl is plain DPO)", choices=F_DIVERGENCES)
    alpha_divergence_coef: float = param(0.5, r"$\alpha$ of the alpha_divergence $f'(t) = (t^{\alpha-1} - 1)/(\alpha - "
        r"1)$", gt=0.0)


@dataclass(frozen=True, kw_only=True)
class CDPOParams(FDPOParams):
    label_smoothing: float = param(0.1, r"$\varepsilon$: probability that a preference label is "
        r"flipped", ge=0.0, lt=0.5)


@dataclass(frozen=True, kw_only=True)
class EXOParams(FDPOParams):
    label_smoothing: float = param(1e-3, r"$\varepsilon$ of the target distribution $[1 - \varepsilon, \varepsilon]$ "
        r"(EXO paper: 1e-3)", gt=0.0, lt=1.0)


@dataclass(frozen=True, kw_only=True)
class AOTParams(DPOParams):
    label_smoothing: float = param(0.0, r"$\varepsilon$: label smoothing of the sorted logistic loss", ge=0.0, lt=0.5)


@dataclass(frozen=True, kw_only=True)
class DiscoPOPParams(FDPOParams):
    tau: float = param(0.05, r"$\tau$: temperature of the logistic/exponential mixing (DiscoPOP paper: 0.05)", gt=0.0)


@dataclass(frozen=True, kw_only=True)
class RDPOParams(FDPOParams):
    alpha: float = param(0.01, r"$\alpha$: weight of the length difference $\lvert y_w\rvert - \lvert y_l\rvert$ "
        r"inside the sigmoid")


@dataclass(frozen=True, kw_only=True)
class DPOPParams(DPOParams):
    dpop_lambda: float = param(
        50.0, r"$\lambda$: weight of the penalty $\max(0, -\rho_w)$, active once $\log\pi(y_w) < "
            r"\log\pi_{\mathrm{ref}}(y_w)$ "
        r"(Smaug: 50)", ge=0.0
    )


@dataclass(frozen=True, kw_only=True)
class SFTParams(LossParams):
    nll_reduction: str = nll_reduction_param()


def f_scores(rho_w: Tensor, rho_l: Tensor, p: FDPOParams) -> tuple[Tensor, Tensor]:
    """f'(π/π_ref) of f-DPO applied to the log-ratios; identity for reverse KL."""
    kind = p.f_divergence
    # e^x is capped by exp_capped: equal to TRL up to x = 80, then bounded but still increasing (with a gradient)
    if kind == "forward_kl":  # f'(t) = 1 − 1/t
        return 1 - exp_capped(-rho_w), 1 - exp_capped(-rho_l)
    if kind == "js_divergence":  # f'(t) = log 2 + log σ(log t)
        return math.log(2) + F.logsigmoid(rho_w), math.log(2) + F.logsigmoid(rho_l)
    if kind == "alpha_divergence" and abs(p.alpha_divergence_coef - 1.0) >= 1e-6:  # f'(t) = (t^(α−1) − 1)/(α − 1)
        a = p.alpha_divergence_coef - 1.0
        return _expm1_capped(a * rho_w) / a, _expm1_capped(a * rho_l) / a
    return rho_w, rho_l  # reverse KL (and the α → 1 limit)


def _expm1_capped(x: Tensor) -> Tensor:
    """e^x − 1, precise near 0 (expm1) and capped like :func:`exp_capped` above 80."""
    return torch.where(x > 1.0, exp_capped(x) - 1, torch.expm1(x.clamp(max=1.0)))


def _out(losses: Tensor, rho_w: Tensor, rho_l: Tensor, beta: float, **metrics: Tensor) -> LossOutput:
    return LossOutput(losses, (beta * rho_w).detach(), (beta * rho_l).detach(), dict(metrics))


def f_delta(rho_w: Tensor, rho_l: Tensor, p: FDPOParams) -> Tensor:
    """Δ = f'_w − f'_l, without the cancellation of two capped exponentials past the cap (both ≈ 1.1·e^80)."""
    kind, a = p.f_divergence, p.alpha_divergence_coef - 1.0
    if kind == "forward_kl":  # (1 − e^{−ρ_w}) − (1 − e^{−ρ_l})
        return exp_capped_diff(-rho_l, -rho_w)
    if kind == "alpha_divergence" and abs(a) >= 1e-6:
        f_w, f_l = f_scores(rho_w, rho_l, p)
        both = (a * rho_w > 1.0) & (a * rho_l > 1.0)  # past 1 both are exp_capped − 1: take their difference
        return torch.where(both, exp_capped_diff(a * rho_w, a * rho_l) / a, f_w - f_l)
    f_w, f_l = f_scores(rho_w, rho_l, p)
    return f_w - f_l


def _both_capped(rho_w: Tensor, rho_l: Tensor, p: FDPOParams) -> Tensor:
    """Where both f'-scores are past the cap of :func:`exp_capped` (forward KL and α-divergence only): there both are
    about (1 + h)·e^80, and flat, so their float32 rounding is all the error their difference has."""
    kind, a = p.f_divergence, p.alpha_divergence_coef - 1.0
    if kind == "forward_kl":
        return (-rho_w > EXP_CAP) & (-rho_l > EXP_CAP)
    if kind == "alpha_divergence" and abs(a) >= 1e-6:
        return (a * rho_w > EXP_CAP) & (a * rho_l > EXP_CAP)
    return torch.zeros_like(rho_w, dtype=torch.bool)


def _averaged_delta(batch: PreferenceBatch, rho_w: Tensor, rho_l: Tensor, p: FDPOParams) -> Tensor:
    """f'_w/|y_w| − f'_l/|y_l|; with equal lengths Δ/|y_w| (Δ without the cancellation of two capped exponentials).
    With different lengths, the two terms as they are (rewriting them around Δ would cancel in bfloat16), except where
    both scores are past the cap: there the two terms, each about 1.1·e^80/|y|, cancel to their length difference's
    share, and their float32 rounding (relative 2⁻²⁴ of each) would be |y| times the result's; the rewrite
    Δ/|y_w| + f'_l·(|y_l| − |y_w|)/(|y_w|·|y_l|) has no such cancellation."""
    lw, ll = require(batch, "chosen_lengths", "rejected_lengths")
    f_w, f_l = f_scores(rho_w, rho_l, p)
    lw, ll = lw.to(f_l.dtype), ll.to(f_l.dtype)
    delta = f_delta(rho_w, rho_l, p)
    around = delta / lw + f_l * ((ll - lw) / (lw * ll))
    apart = torch.where(_both_capped(rho_w, rho_l, p), around, f_w / lw - f_l / ll)
    return torch.where(lw == ll, delta / lw, apart)


def _delta(batch: PreferenceBatch, p: FDPOParams) -> tuple[Tensor, Tensor, Tensor]:
    rho_w, rho_l = logratios(batch)  # (B,)
    return f_delta(rho_w, rho_l, p), rho_w, rho_l  # Δ = f'_w − f'_l


def _smoothed_logit(batch: PreferenceBatch, p: CDPOParams | EXOParams) -> tuple[Tensor, float, Tensor, Tensor]:
    """(z = βΔ, the label smoothing ε, ρ_w, ρ_l) of a loss whose preference label is smoothed by ε."""
    d, rw, rl = _delta(batch, p)
    return p.beta * d, p.label_smoothing, rw, rl


def dpo_loss(batch: PreferenceBatch, p: FDPOParams, ctx: LossContext) -> LossOutput:
    """DPO (Rafailov et al. 2023, arXiv:2305.18290, Eq. 7).  L = −log σ(β·Δ)."""
    d, rw, rl = _delta(batch, p)
    return _out(-F.logsigmoid(p.beta * d), rw, rl, p.beta)


def cdpo_loss(batch: PreferenceBatch, p: CDPOParams, ctx: LossContext) -> LossOutput:
    """Conservative DPO (Mitchell 2023).  L = −(1 − ε)·log σ(βΔ) − ε·log σ(−βΔ)."""
    d, rw, rl = _delta(batch, p)
    e = p.label_smoothing
    return _out(-(1 - e) * F.logsigmoid(p.beta * d) - e * F.logsigmoid(-p.beta * d), rw, rl, p.beta)


def hinge_loss(batch: PreferenceBatch, p: FDPOParams, ctx: LossContext) -> LossOutput:
    """SLiC hinge (Zhao et al. 2023, arXiv:2305.10425).  L = max(0, 1 − βΔ)."""
    d, rw, rl = _delta(batch, p)
    return _out(torch.relu(1 - p.beta * d), rw, rl, p.beta)


def ipo_loss(batch: PreferenceBatch, p: FDPOParams, ctx: LossContext) -> LossOutput:
    """IPO (Azar et al. 2023, arXiv:2310.12036, Eq. 17) on per-token averages.  L = (Δ̄ − 1/(2β))²."""
    rho_w, rho_l = logratios(batch)
    d = _averaged_delta(batch, rho_w, rho_l, p)  # Δ̄: per-token averaged scores, as TRL
    # exponential f' (forward KL, α) grow past e^80: beyond |u| = 1e18 the square grows like log|u| (finite, with a
    # gradient) instead of overflowing float32; TRL's (u)² is finite only up to |u| ≈ 1.8e19
    return _out(square_capped(d - 1 / (2 * p.beta), _IPO_MAX_DELTA), rho_w, rho_l, p.beta)


def robust_loss(batch: PreferenceBatch, p: CDPOParams, ctx: LossContext) -> LossOutput:
    """Robust DPO (Chowdhury et al. 2024, arXiv:2403.00409).  L = (−(1−ε)log σ(βΔ) + ε log σ(−βΔ)) / (1 − 2ε).

    Evaluated as the algebraically equal −log σ(z) − ε/(1 − 2ε)·z with z = βΔ (log σ(−z) = log σ(z) − z): the
    listed form cancels in the numerator and divides the rounding error by 1 − 2ε, which is tiny as ε → 0.5.
    """
    z, e, rw, rl = _smoothed_logit(batch, p)
    losses = -F.logsigmoid(z) - (e / (1 - 2 * e)) * z
    return _out(losses, rw, rl, p.beta)


def exo_pair_loss(batch: PreferenceBatch, p: EXOParams, ctx: LossContext) -> LossOutput:
    """EXO-pref (Ji et al. 2024, arXiv:2402.00856, Eq. 16).  L = KL([σ(βΔ), σ(−βΔ)] ‖ [1 − ε, ε])."""
    z, e, rw, rl = _smoothed_logit(batch, p)
    losses = torch.sigmoid(z) * (F.logsigmoid(z) - math.log1p(-e)) + torch.sigmoid(-z) * (
        F.logsigmoid(-z) - math.log(e)
    )
    return _out(losses, rw, rl, p.beta)


def nca_pair_loss(batch: PreferenceBatch, p: DPOParams, ctx: LossContext) -> LossOutput:
    """NCA (Chen et al. 2024, arXiv:2402.05369).  L = −log σ(βρ_w) − ½log σ(−βρ_w) − ½log σ(−βρ_l)."""
    rw, rl = logratios(batch)
    a, b = p.beta * rw, p.beta * rl
    return _out(-F.logsigmoid(a) - 0.5 * F.logsigmoid(-a) - 0.5 * F.logsigmoid(-b), rw, rl, p.beta)


def bco_pair_loss(batch: PreferenceBatch, p: DPOParams, ctx: LossContext) -> LossOutput:
    """BCO, paired (Jung et al. 2024, arXiv:2404.04656) as TRL 1.16.  L = −log σ(βρ_w) − log σ(−βρ_l)."""
    rw, rl = logratios(batch)
    return _out(-F.logsigmoid(p.beta * rw) - F.logsigmoid(-p.beta * rl), rw, rl, p.beta)


def sppo_hard_loss(batch: PreferenceBatch, p: DPOParams, ctx: LossContext) -> LossOutput:
    """SPPO, hard labels (Wu et al. 2024, arXiv:2405.00675).  L = (ρ_w − 1/(2β))² + (ρ_l + 1/(2β))²."""
    rw, rl = logratios(batch)
    return _out((rw - 0.5 / p.beta) ** 2 + (rl + 0.5 / p.beta) ** 2, rw, rl, p.beta)


def _smoothed_logistic(beta: float, e: float) -> Callable[[Tensor], Tensor]:
    return lambda d: -(1 - e) * F.logsigmoid(beta * d) - e * F.logsigmoid(-beta * d)


def aot_loss(batch: PreferenceBatch, p: AOTParams, ctx: LossContext) -> LossOutput:
    """AOT, paired (Melnyk et al. 2024, arXiv:2406.05882): sorted (log π_w − log π_l) against sorted reference margins.

    Sorting spans the gathered batch (all processes), so the result does not depend on sharding.
    """
    pw, pl, qw, ql = require(
        batch, "policy_chosen_logps", "policy_rejected_logps", "ref_chosen_logps", "ref_rejected_logps"
    )
    margin, ref_margin = pw - pl, (qw - ql).detach()  # (B,)
    losses = sorted_pair_loss(margin, ref_margin, ctx.gather, _smoothed_logistic(p.beta, p.label_smoothing))
    rw, rl = logratios(batch)
    return _out(losses, rw, rl, p.beta)


def aot_unpaired_loss(batch: PreferenceBatch, p: AOTParams, ctx: LossContext) -> LossOutput:
    """AOT, unpaired (Melnyk et al. 2024): sorted ρ_w against sorted ρ_l over the gathered batch."""
    rw, rl = logratios(batch)
    losses = sorted_pair_loss(rw, rl, ctx.gather, _smoothed_logistic(p.beta, p.label_smoothing))
    return _out(losses, rw, rl, p.beta)


def apo_zero_loss(batch: PreferenceBatch, p: DPOParams, ctx: LossContext) -> LossOutput:
    """APO-zero (D'Oosterlinck et al. 2024, arXiv:2408.06266, Eq. 7).  L = 1 − σ(βρ_w) + σ(βρ_l)."""
    rw, rl = logratios(batch)
    return _out(1 - torch.sigmoid(p.beta * rw) + torch.sigmoid(p.beta * rl), rw, rl, p.beta)


def apo_down_loss(batch: PreferenceBatch, p: DPOParams, ctx: LossContext) -> LossOutput:
    """APO-down (D'Oosterlinck et al. 2024, Eq. 8).  L = σ(βρ_w) + 1 − σ(β(ρ_w − ρ_l))."""
    rw, rl = logratios(batch)
    return _out(torch.sigmoid(p.beta * rw) + 1 - torch.sigmoid(p.beta * (rw - rl)), rw, rl, p.beta)


def discopop_loss(batch: PreferenceBatch, p: DiscoPOPParams, ctx: LossContext) -> LossOutput:
    """DiscoPOP (Chan Lu et al. 2024, arXiv:2406.08414, Eq. 5): log-ratio modulated logistic/exponential blend.

    z = βΔ, m = σ(z/τ):  L = −log σ(z)·(1 − m) + exp(−z)·m
    """
    d, rw, rl = _delta(batch, p)
    z = p.beta * d
    m = torch.sigmoid(z / p.tau)
    # exp(−z)·m = exp(−z + log m): for z ≪ 0 and τ < 1, m ≈ exp(z/τ) decays faster than exp(−z) grows; for τ > 1
    # it grows like exp(−z(1 − 1/τ)), and exp_capped keeps it finite with a gradient that still raises the margin.
    expo = exp_capped(-z + F.logsigmoid(z / p.tau))
    return _out(-F.logsigmoid(z) * (1 - m) + expo, rw, rl, p.beta)


def sigmoid_norm_loss(batch: PreferenceBatch, p: FDPOParams, ctx: LossContext) -> LossOutput:
    """DPO on per-token averaged scores (TRL 'sigmoid_norm').  L = −log σ(β(f'_w/|y_w| − f'_l/|y_l|))."""
    rho_w, rho_l = logratios(batch)
    d = _averaged_delta(batch, rho_w, rho_l, p)
    return _out(-F.logsigmoid(p.beta * d), rho_w, rho_l, p.beta)


def rdpo_loss(batch: PreferenceBatch, p: RDPOParams, ctx: LossContext) -> LossOutput:
    """R-DPO (Park et al. 2024, arXiv:2403.19159, Eq. 9).  L = −log σ(βΔ + α(|y_w| − |y_l|))."""
    d, rw, rl = _delta(batch, p)
    lw, ll = require(batch, "chosen_lengths", "rejected_lengths")
    return _out(-F.logsigmoid(p.beta * d + p.alpha * (lw - ll).to(d.dtype)), rw, rl, p.beta)


def dpop_loss(batch: PreferenceBatch, p: DPOPParams, ctx: LossContext) -> LossOutput:
    """DPO-Positive (Pal et al. 2024, arXiv:2402.13228): the penalty sits inside β(…), as in the paper's loss.

    L = −log σ(β·(ρ_w − ρ_l − λ·max(0, log π_ref(y_w|x) − log π_θ(y_w|x))))
    """
    rw, rl = logratios(batch)  # (B,)
    penalty = torch.relu(-rw)  # (B,) max(0, log π_ref(y_w) − log π(y_w))
    losses = -F.logsigmoid(p.beta * (rw - rl - p.dpop_lambda * penalty))
    return _out(losses, rw, rl, p.beta, **{"dpop/penalty": penalty.detach().mean()})


def sft_loss(batch: PreferenceBatch, p: SFTParams, ctx: LossContext) -> LossOutput:
    """Supervised NLL of the chosen response, per token.  L = −log π_θ(y_w|x) / |y_w| (or TRL's batch token mean)."""
    avg_w, avg_l = average_policy_logps(batch)
    return LossOutput(chosen_nll(batch, p.nll_reduction, ctx), avg_w.detach(), avg_l.detach(), {})


_REF = frozenset({Need.REFERENCE})
_REF_LEN = frozenset({Need.REFERENCE, Need.LENGTHS})
_SCORES = r"$\beta\cdot(\log\pi_\theta(y\mid x) - \log\pi_{\mathrm{ref}}(y\mid x))$ (DPO implicit reward)"


def _reverse_kl(p: Any) -> bool:
    """A function of β·(ρ_w − ρ_l) only for plain DPO's divergence (f-DPO's f' is not a log-ratio)."""
    return bool(p.f_divergence == "reverse_kl")


def _spec(name: str, fn: LossFn, params_cls: type[LossParams], formula_tex: str, paper: str, **kw: Any) -> LossSpec:
    kw.setdefault("needs", _REF)
    kw.setdefault("shift_invariant", True)
    kw.setdefault("scores", _SCORES)
    return LossSpec(name=name, fn=fn, params_cls=params_cls, family="dpo", formula_tex=formula_tex, paper=paper,
                    **kw)


# every spec this module registers, in catalogue order: declarations are data
_SPECS: tuple[LossSpec, ...] = (
    _spec(
        "dpo",
        dpo_loss,
        FDPOParams,
        r"-\log\sigma(\beta\Delta),\quad \Delta = f'_w - f'_l \;(= \rho_w - \rho_l \text{ for reverse KL})",
        "Rafailov et al. 2023, arXiv:2305.18290",
        reward_difference=_reverse_kl,
        description="Direct Preference Optimization, TRL loss_type='sigmoid'.",
        notes=_CAP_NOTE,
    ),
    _spec(
        "cdpo",
        cdpo_loss,
        CDPOParams,
        r"-(1 - \varepsilon)\cdot\log\sigma(\beta\Delta) - \varepsilon\cdot\log\sigma(-\beta\Delta)",
        "Mitchell 2023, 'A note on DPO with noisy preferences' (cDPO)",
        monotone=False,
        reward_difference=_reverse_kl,
        description=r"Conservative DPO: DPO with label smoothing $\varepsilon$ (labels flipped with probability "
            r"$\varepsilon$).",
    ),
    _spec(
        "hinge",
        hinge_loss,
        FDPOParams,
        r"\max(0, 1 - \beta\Delta)",
        "Zhao et al. 2023, arXiv:2305.10425 (SLiC)",
        reward_difference=_reverse_kl,
        description="SLiC's hinge loss on the reward margin, TRL loss_type='hinge'.",
    ),
    _spec(
        "ipo",
        ipo_loss,
        FDPOParams,
        r"\left(\frac{\Delta}{\lvert y\rvert} - \frac{1}{2\beta}\right)^2\quad\text{(log-ratios averaged per token)}",
        "Azar et al. 2023, arXiv:2310.12036",
        needs=_REF_LEN,
        monotone=False,
        description="Identity Preference Optimization, squared loss on per-token averaged log-ratios (as TRL).",
        notes=r"Past $\lvert\bar{\Delta} - 1/(2\beta)\rvert = 10^{18}$ (reached only through exponential "
        r"f-divergences) the square continues as $10^{36}\cdot(1 + 2\cdot\log(\lvert u\rvert/10^{18}))$: finite in "
        "float32 and still pulling back, where a clamp would be flat. "
        + _CAP_NOTE,
    ),
    _spec(
        "robust",
        robust_loss,
        CDPOParams,
        r"\frac{-(1 - \varepsilon)\cdot\log\sigma(\beta\Delta) + \varepsilon\cdot\log\sigma(-\beta\Delta)}{1 - "
        r"2\varepsilon}",
        "Chowdhury et al. 2024, arXiv:2403.00409",
        reward_difference=_reverse_kl,
        description=r"Robust DPO: an unbiased loss under preference labels flipped with probability $\varepsilon$.",
    ),
    _spec(
        "exo-pair",
        exo_pair_loss,
        EXOParams,
        r"\sigma(\beta\Delta)\bigl(\log\sigma(\beta\Delta) - \log(1 - \varepsilon)\bigr) + "
        r"\sigma(-\beta\Delta)\bigl(\log\sigma(-\beta\Delta) - \log\varepsilon\bigr)",
        "Ji et al. 2024, arXiv:2402.00856 (EXO)",
        monotone=False,
        reward_difference=_reverse_kl,
        description=r"Efficient Exact Optimization: reverse KL between the pair's model distribution and "
        r"$[1 - \varepsilon, \varepsilon]$.",
    ),
    _spec(
        "nca-pair",
        nca_pair_loss,
        DPOParams,
        r"-\log\sigma(\beta\rho_w) - \tfrac{1}{2}\cdot\log\sigma(-\beta\rho_w) - "
        r"\tfrac{1}{2}\cdot\log\sigma(-\beta\rho_l)",
        "Chen et al. 2024, arXiv:2402.05369 (NCA)",
        monotone=False,
        description="Noise Contrastive Alignment, paired form: absolute rather than relative likelihoods.",
    ),
    _spec(
        "bco-pair",
        bco_pair_loss,
        DPOParams,
        r"-\log\sigma(\beta\rho_w) - \log\sigma(-\beta\rho_l)",
        "Jung et al. 2024, arXiv:2404.04656 (BCO)",
        description="Binary Classifier Optimization, paired form as in TRL 1.16 (no running reward shift).",
    ),
    _spec(
        "sppo-hard",
        sppo_hard_loss,
        DPOParams,
        r"\left(\rho_w - \frac{1}{2\beta}\right)^2 + \left(\rho_l + \frac{1}{2\beta}\right)^2",
        "Wu et al. 2024, arXiv:2405.00675 (SPPO)",
        monotone=False,
        description="Self-Play Preference Optimization with hard win probabilities (1 for y_w, 0 for y_l).",
    ),
    _spec(
        "aot",
        aot_loss,
        AOTParams,
        r"-\log\sigma\bigl(\beta\cdot(\operatorname{sort}(\log\pi_w - \log\pi_l) - "
        r"\operatorname{sort}(\log\pi_{\mathrm{ref},w} - \log\pi_{\mathrm{ref},l}))\bigr)",
        "Melnyk et al. 2024, arXiv:2406.05882 (AOT)",
        batch_coupled=True,
        shift_invariant=False,  # shifting one response moves only that pair's margins: the sort order changes
        monotone=lambda p: p.label_smoothing == 0.0,
        description="Alignment via Optimal Transport, paired: first-order stochastic dominance of the policy's "
        "margins over the reference's, by sorting over the whole gathered batch (all processes).",
        notes="Per-example losses split each sorted slot's loss between the two examples that fill it; "
        "their mean equals TRL's, and sharding across processes does not change them.",
    ),
    _spec(
        "aot-unpaired",
        aot_unpaired_loss,
        AOTParams,
        r"-\log\sigma\bigl(\beta\cdot(\operatorname{sort}(\rho_w) - \operatorname{sort}(\rho_l))\bigr)",
        "Melnyk et al. 2024, arXiv:2406.05882 (AOT)",
        batch_coupled=True,
        monotone=lambda p: p.label_smoothing == 0.0,
        description="Alignment via Optimal Transport, unpaired: sorted chosen log-ratios against sorted "
        "rejected log-ratios over the whole gathered batch (all processes).",
        notes="Sorting spans the gathered batch, unlike TRL which sorts the local batch.",
    ),
    _spec(
        "apo-zero",
        apo_zero_loss,
        DPOParams,
        r"1 - \sigma(\beta\rho_w) + \sigma(\beta\rho_l)",
        "D'Oosterlinck et al. 2024, arXiv:2408.06266 (APO)",
        description="Anchored Preference Optimization, zero: raise the chosen and lower the rejected likelihood.",
    ),
    _spec(
        "apo-down",
        apo_down_loss,
        DPOParams,
        r"\sigma(\beta\rho_w) + 1 - \sigma\bigl(\beta(\rho_w - \rho_l)\bigr)",
        "D'Oosterlinck et al. 2024, arXiv:2408.06266 (APO)",
        monotone=False,
        description="Anchored Preference Optimization, down: lower both likelihoods, the rejected one more.",
    ),
    _spec(
        "discopop",
        discopop_loss,
        DiscoPOPParams,
        r"-\log\sigma(\beta\Delta)\cdot\bigl(1 - \sigma(\beta\Delta/\tau)\bigr) + "
        r"\exp(-\beta\Delta)\cdot\sigma(\beta\Delta/\tau)",
        "Chan Lu et al. 2024, arXiv:2406.08414 (DiscoPOP)",
        monotone=False,
        reward_difference=_reverse_kl,
        description="Discovered Preference Optimization: log-ratio modulated blend of logistic and exponential.",
        notes=r"With $\tau > 1$ the exponential term grows like $\exp(-\beta\Delta(1 - 1/\tau))$ as "
        r"$\Delta \to -\infty$; past an exponent of 80 it is capped like f-DPO's $e^x$ (bounded, still increasing) "
        r"instead of overflowing, where TRL's $\exp(-\beta\Delta)$ is inf beyond 88.7.",
    ),
    _spec(
        "sigmoid-norm",
        sigmoid_norm_loss,
        FDPOParams,
        r"-\log\sigma\left(\beta\left(\frac{f'_w}{\lvert y_w\rvert} - \frac{f'_l}{\lvert y_l\rvert}\right)\right)",
        "TRL 1.16 loss_type='sigmoid_norm'",
        needs=_REF_LEN,
        description="DPO on log-ratios averaged per completion token.",
    ),
    _spec(
        "rdpo",
        rdpo_loss,
        RDPOParams,
        r"-\log\sigma\bigl(\beta\Delta + \alpha(\lvert y_w\rvert - \lvert y_l\rvert)\bigr)",
        "Park et al. 2024, arXiv:2403.19159 (R-DPO)",
        needs=_REF_LEN,
        reward_difference=_reverse_kl,
        description="Length-regularized DPO: the length difference shifts the margin.",
    ),
    _spec(
        "dpop",
        dpop_loss,
        DPOPParams,
        r"-\log\sigma\bigl(\beta(\rho_w - \rho_l - \lambda\cdot\max(0, -\rho_w))\bigr)",
        "Pal et al. 2024, arXiv:2402.13228 (Smaug, DPO-Positive)",
        description="DPO-Positive: DPO plus a penalty, inside the sigmoid, whenever the chosen response becomes "
        "less likely than under the reference.",
    ),
    LossSpec(
        name="sft",
        fn=sft_loss,
        params_cls=SFTParams,
        family="dpo",
        formula_tex=r"-\frac{\log\pi_\theta(y_w\mid x)}{\lvert y_w\rvert}",
        paper="TRL 1.16 loss_type='sft' (the SFT term of MPO, arXiv:2411.10442)",
        scores=r"$\log\pi_\theta(y\mid x)/\lvert y\rvert$ (per-token average log-prob)",
        needs=frozenset({Need.LENGTHS}),
        batch_coupled=nll_coupled,
        description="Supervised fine-tuning on the chosen response, per-token NLL; reference-free.",
        notes=NLL_NOTE,
    ),
    )


prefzoo_register_losses = registers(_SPECS)
