"""Float64 reference formulas of the built-in losses, written independently of prefzoo.losses.

Each reference takes float64 tensors (the batch's fields cast to float64) and a
params object and returns the per-example losses (B,).  They follow the papers'
formulas literally (softplus for −log σ, the max trick for logsumexp) and are
the "known good" side of the comparisons in the property suite.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

from prefzoo.testing.reference_lists import pair_reference
from prefzoo.types import PreferenceBatch

__all__ = ["REFERENCES", "lse2", "naive_lse2", "reference_losses", "to_float64"]


def to_float64(batch: PreferenceBatch) -> dict[str, Tensor | None]:
    """The batch's fields as detached float64 tensors (masks and lengths keep their dtype, lengths become float64)."""
    out: dict[str, Tensor | None] = {}
    for name in PreferenceBatch.__dataclass_fields__:
        t = getattr(batch, name)
        if isinstance(t, Tensor):
            t = t.detach()
            out[name] = t if t.dtype == torch.bool else t.to(torch.float64)
        elif name != "example_ids":
            out[name] = None
    return out


def lse2(a: Tensor, b: Tensor) -> Tensor:
    """log(e^a + e^b) by the max trick: m + log1p(e^{−|a−b|})."""
    m = torch.maximum(a, b)
    return m + torch.log1p(torch.exp(-(a - b).abs()))


def naive_lse2(a: Tensor, b: Tensor) -> Tensor:
    """log(e^a + e^b) computed literally: underflows to −inf for a, b below about −745 (float64)."""
    return torch.log(torch.exp(a) + torch.exp(b))


def _nls(z: Tensor) -> Tensor:  # −log σ(z)
    return F.softplus(-z)


def _rho(x: dict[str, Any]) -> tuple[Tensor, Tensor]:
    return x["policy_chosen_logps"] - x["ref_chosen_logps"], x["policy_rejected_logps"] - x["ref_rejected_logps"]


def _exp80(x: Tensor) -> Tensor:
    """e^x up to x = 80, then e^80·(1 + 0.1·u/(0.1 + u)), u = x − 80 (prefzoo's cap: bounded, still increasing)."""
    u = torch.clamp(x - 80.0, min=0.0)
    return torch.where(x > 80.0, math.exp(80.0) * (1 + 0.1 * u / (0.1 + u)), torch.exp(torch.clamp(x, max=80.0)))


def _square1e18(u: Tensor) -> Tensor:
    """u² up to |u| = 1e18, then 1e36·(1 + 2·log(|u|/1e18)) (prefzoo's cap)."""
    a = u.abs()
    return torch.where(a > 1e18, 1e36 * (1 + 2 * torch.log(torch.clamp(a, min=1e18) / 1e18)),
                       torch.clamp(u, -1e18, 1e18) ** 2)


def _fprime(rho: Tensor, p: Any) -> Tensor:
    kind = p.f_divergence  # every DPO-family params class has it (FDPOParams)
    if kind == "forward_kl":
        return 1 - _exp80(-rho)
    if kind == "js_divergence":
        return math.log(2) - F.softplus(-rho)
    if kind == "alpha_divergence" and abs(p.alpha_divergence_coef - 1.0) >= 1e-6:
        a = p.alpha_divergence_coef - 1.0
        return torch.where(a * rho > 1.0, _exp80(a * rho) - 1, torch.expm1(torch.clamp(a * rho, max=1.0))) / a
    return rho


def _delta(x: dict[str, Any], p: Any) -> Tensor:
    """f'(ρ_w) − f'(ρ_l); where both exponentials are past the cap, their difference taken algebraically
    (e^80·h²·(u_a − u_b)/((h + u_a)(h + u_b))), since subtracting two values near 1.1·e^80 loses ~1e-8 of it."""
    rw, rl = _rho(x)
    plain = _fprime(rw, p) - _fprime(rl, p)
    kind = p.f_divergence  # every DPO-family params class has it (FDPOParams)
    if kind == "forward_kl":  # e^{−ρ_l} − e^{−ρ_w}
        xa, xb, scale = -rl, -rw, 1.0
    elif kind == "alpha_divergence" and abs(p.alpha_divergence_coef - 1.0) >= 1e-6:  # (e^{aρ_w} − e^{aρ_l})/a
        a = p.alpha_divergence_coef - 1.0
        xa, xb, scale = a * rw, a * rl, 1.0 / a
    else:
        return plain
    ua, ub = xa - 80.0, xb - 80.0
    far = math.exp(80.0) * 0.01 * (ua - ub) / ((0.1 + ua.clamp(min=0)) * (0.1 + ub.clamp(min=0))) * scale
    return torch.where((xa > 80.0) & (xb > 80.0), far, plain)


def _mmpo_scores(x: dict[str, Any], p: Any, normalize: bool = True, average: bool = False) -> tuple[Tensor, Tensor]:
    pw, pl = x["policy_chosen_logps"], x["policy_rejected_logps"]
    qw, ql = x["ref_chosen_logps"], x["ref_rejected_logps"]
    if average:
        lw, ll = x["chosen_lengths"], x["rejected_lengths"]
        pw, pl, qw, ql = pw / lw, pl / ll, qw / lw, ql / ll
    R_w = p.reward_epsilon + p.beta * qw
    R_l = p.rejected_reward + p.beta * ql
    if normalize:
        both = torch.cat((R_w, R_l))
        lo, hi = both.min(), both.max()
        d = hi + p.norm_eps - lo
        if float(d) > 0:
            R_w, R_l = (R_w + p.norm_eps - lo) / d, (R_l + p.norm_eps - lo) / d
        else:
            R_w, R_l = torch.zeros_like(R_w), torch.zeros_like(R_l)
    return pw + R_w, pl + R_l


def _mmpo(x: dict[str, Any], p: Any, aux: bool = True, **kw: bool) -> Tensor:
    s_w, s_l = _mmpo_scores(x, p, **kw)
    loss = -lse2(s_w, s_l)
    return loss + _nls(s_w - s_l) if aux else loss


def _aot(a: Tensor, b: Tensor, p: Any) -> Tensor:
    """Per-example share of Σ_k f(sort(a)_k − sort(b)_k): the mean equals the slot mean (ties do not matter)."""
    sa, sb = torch.sort(a).values, torch.sort(b).values
    e = p.label_smoothing
    slots = (1 - e) * _nls(p.beta * (sa - sb)) + e * _nls(-p.beta * (sa - sb))
    return slots  # compared through the mean only; see reference_losses


def _orpo(x: dict[str, Any], p: Any) -> Tensor:
    aw = torch.clamp(x["policy_chosen_logps"] / x["chosen_lengths"], max=-1e-6)
    al = torch.clamp(x["policy_rejected_logps"] / x["rejected_lengths"], max=-1e-6)

    def log_odds(a: Tensor) -> Tensor:
        return a - torch.log(-torch.expm1(a))

    return _nll(x, p) + p.beta * _nls(log_odds(aw) - log_odds(al))


def _nll(x: dict[str, Any], p: Any, default: str = "example") -> Tensor:
    """−log π(y_w|x)/|y_w|, or with nll_reduction="batch-tokens" each example's share B·(−log π(y_w|x))/Σ|y_w| of
    TRL's mean over the batch's chosen tokens (the shares' mean is TRL's value)."""
    pw, lw = x["policy_chosen_logps"], x["chosen_lengths"]
    if getattr(p, "nll_reduction", default) == "batch-tokens":
        return -pw * (pw.numel() / lw.sum())
    return -pw / lw


def _sft(x: dict[str, Any], p: Any) -> Tensor:
    return _nll(x, p)


def _dpo_family(kind: str) -> Callable[[dict[str, Any], Any], Tensor]:
    def f(x: dict[str, Any], p: Any) -> Tensor:
        b = p.beta
        if kind in ("ipo", "sigmoid-norm"):
            rw, rl = _rho(x)
            d = _fprime(rw, p) / x["chosen_lengths"] - _fprime(rl, p) / x["rejected_lengths"]
            if kind == "ipo":  # prefzoo caps the square past |Δ̄ − 1/(2β)| = 1e18 so it stays finite in float32
                return _square1e18(d - 1 / (2 * b))
            return _nls(b * d)
        d = _delta(x, p)
        z = b * d
        if kind == "dpo":
            return _nls(z)
        if kind == "cdpo":
            e = p.label_smoothing
            return (1 - e) * _nls(z) + e * _nls(-z)
        if kind == "robust":
            e = p.label_smoothing
            return ((1 - e) * _nls(z) - e * _nls(-z)) / (1 - 2 * e)
        if kind == "hinge":
            return torch.clamp(1 - z, min=0)
        if kind == "exo-pair":
            e = p.label_smoothing
            return torch.sigmoid(z) * (-_nls(z) - math.log1p(-e)) + torch.sigmoid(-z) * (-_nls(-z) - math.log(e))
        if kind == "discopop":
            m = torch.sigmoid(z / p.tau)
            expo = _exp80(-z - _nls(z / p.tau))
            return _nls(z) * (1 - m) + expo
        if kind == "rdpo":
            return _nls(z + p.alpha * (x["chosen_lengths"] - x["rejected_lengths"]))
        raise KeyError(kind)

    return f


def _smoothed(z: Tensor, eps: float) -> Tensor:
    """TRL CPO's label smoothing: −(1 − ε)·log σ(z) − ε·log σ(−z)."""
    return (1 - eps) * _nls(z) + eps * _nls(-z)


def _simple(kind: str) -> Callable[[dict[str, Any], Any], Tensor]:
    def f(x: dict[str, Any], p: Any) -> Tensor:
        uses_rho = kind in {"nca-pair", "bco-pair", "sppo-hard", "apo-zero", "apo-down"}
        rho: tuple[Any, Any] = _rho(x) if uses_rho else (None, None)
        rw, rl = rho
        b = p.beta
        if kind == "nca-pair":
            return _nls(b * rw) + 0.5 * _nls(-b * rw) + 0.5 * _nls(-b * rl)
        if kind == "bco-pair":
            return _nls(b * rw) + _nls(-b * rl)
        if kind == "sppo-hard":
            return (rw - 0.5 / b) ** 2 + (rl + 0.5 / b) ** 2
        if kind == "apo-zero":
            return 1 - torch.sigmoid(b * rw) + torch.sigmoid(b * rl)
        if kind == "apo-down":
            return torch.sigmoid(b * rw) + 1 - torch.sigmoid(b * (rw - rl))
        pw, pl = x["policy_chosen_logps"], x["policy_rejected_logps"]
        lw, ll = x["chosen_lengths"], x["rejected_lengths"]
        if kind == "simpo":
            return _smoothed(b * (pw / lw - pl / ll - p.gamma_beta_ratio), p.label_smoothing)
        if kind == "cpo":
            return _smoothed(b * (pw - pl), p.label_smoothing) + p.alpha * _nll(x, p)
        if kind == "cpo-hinge":
            return torch.clamp(1 - b * (pw - pl), min=0) + p.alpha * _nll(x, p)
        if kind == "cpo-ipo":
            return (pw / lw - pl / ll - 1 / (2 * b)) ** 2 + p.alpha * _nll(x, p)
        if kind == "cpo-simpo":
            return _smoothed(b * (pw / lw - pl / ll - p.gamma_beta_ratio), p.label_smoothing) + p.alpha * _nll(x, p)
        raise KeyError(kind)

    return f


def _dpop(x: dict[str, Any], p: Any) -> Tensor:
    """Smaug's DPO-Positive: −log σ(β(ρ_w − ρ_l − λ·max(0, log π_ref(y_w) − log π(y_w))))."""
    rw, rl = _rho(x)
    return _nls(p.beta * (rw - rl - p.dpop_lambda * torch.clamp(-rw, min=0)))


def _simper(x: dict[str, Any], p: Any) -> Tensor:
    return torch.exp(x["policy_rejected_logps"] / x["rejected_lengths"]) - torch.exp(
        x["policy_chosen_logps"] / x["chosen_lengths"])


def _slic(x: dict[str, Any], p: Any) -> Tensor:
    pw, pl = x["policy_chosen_logps"], x["policy_rejected_logps"]
    return torch.clamp(p.delta - pw + pl, min=0) - p.reg_lambda * pw


def _rpo(x: dict[str, Any], p: Any) -> Tensor:
    rw, rl = _rho(x)
    return _nls(p.beta * (rw - rl)) + p.alpha * _nll(x, p, default="batch-tokens")


def _mpo(x: dict[str, Any], p: Any) -> Tensor:
    rw, rl = _rho(x)
    b = p.beta
    bco = _nls(b * rw) + _nls(-b * rl)
    return p.dpo_weight * _nls(b * (rw - rl)) + p.bco_weight * bco + p.sft_weight * _sft(x, p)


# name -> (reference, compare_mean_only): AOT's per-example split is an implementation choice; its mean is the paper's.
REFERENCES: dict[str, tuple[Callable[[dict[str, Any], Any], Tensor], bool]] = {
    "mmpo": (lambda x, p: _mmpo(x, p), False),
    "mmpo-no-aux": (lambda x, p: _mmpo(x, p, aux=False), False),
    "mmpo-no-norm": (lambda x, p: _mmpo(x, p, normalize=False), False),
    "mmpo-length-norm": (lambda x, p: _mmpo(x, p, average=True), False),
    **{k: (_dpo_family(k), False) for k in
       ("dpo", "cdpo", "robust", "hinge", "exo-pair", "discopop", "rdpo", "ipo", "sigmoid-norm")},
    **{k: (_simple(k), False) for k in ("nca-pair", "bco-pair", "sppo-hard", "apo-zero", "apo-down", "simpo", "cpo",
                                        "cpo-hinge", "cpo-ipo", "cpo-simpo")},
    "dpop": (_dpop, False),
    "simper": (_simper, False),
    "slic": (_slic, False),
    "rpo": (_rpo, False),
    "aot": (lambda x, p: _aot(x["policy_chosen_logps"] - x["policy_rejected_logps"],
                              x["ref_chosen_logps"] - x["ref_rejected_logps"], p), True),
    "aot-unpaired": (lambda x, p: _aot(*_rho(x), p), True),
    "orpo": (_orpo, False),
    "sft": (_sft, False),
    "mpo": (_mpo, False),
    **{k: (pair_reference(k), False) for k in ("mml", "mmpo-list", "dpo-pl", "lipo", "rrhf")},  # K = 2
}


def reference_losses(name: str, batch: PreferenceBatch, params: Any) -> tuple[Tensor, bool]:
    """(float64 reference losses, compare_mean_only) for built-in loss ``name``."""
    fn, mean_only = REFERENCES[name]
    return fn(to_float64(batch), params), mean_only
