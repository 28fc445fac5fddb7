"""Shared pieces of the built-in losses: per-token averages, DPO log-ratios, in-batch min-max normalization, the NLL
term of the chosen response, and exponentials and squares that stay finite without losing their gradient."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import Tensor

from prefzoo.hookspecs import hookimpl
from prefzoo.spec import LossSpec, param
from prefzoo.types import LossContext, PreferenceBatch, PreferenceBatchError

__all__ = [
    "EXP_CAP",
    "EXP_HEADROOM",
    "NLL_NOTE",
    "NLL_REDUCTIONS",
    "average_logps",
    "average_pair",
    "average_policy_logps",
    "chosen_nll",
    "exp_capped",
    "exp_capped_diff",
    "gathered_bounds",
    "log1mexp",
    "logratios",
    "minmax_normalize",
    "minmax_scale",
    "nll_coupled",
    "nll_reduction_param",
    "registers",
    "require",
    "sorted_pair_loss",
    "square_capped",
]

EXP_CAP = 80.0  # exp(80) ≈ 5.5e34 stays finite in float32 and bfloat16 (TRL clamps its α-divergence at the same value)
EXP_HEADROOM = 0.1  # past the cap e^x grows by at most 10% more: β·2·1.1e^80/(1 − 2ε) stays finite as TRL's clamp does
NLL_REDUCTIONS = ("example", "batch-tokens")
NLL_NOTE = (
    "nll_reduction defaults to 'example' (each example's NLL averaged over its own tokens): an example's loss then "
    "does not depend on the batch it is in, so gradient accumulation is exact and long and short answers weigh the "
    "same. TRL averages over all chosen tokens of the batch ('batch-tokens'), which weighs examples by length and "
    "makes the loss depend on the batch; prefzoo counts those tokens over the gathered batch (all processes)."
)


def require(batch: PreferenceBatch, *names: str) -> tuple[Tensor, ...]:
    """The named batch fields, or a clear error naming the first missing one."""
    out = []
    for n in names:
        t = getattr(batch, n)
        if t is None:
            raise PreferenceBatchError(f"PreferenceBatch.{n} is None but this loss needs it")
        out.append(t)
    return tuple(out)


def average_logps(logps: Tensor, lengths: Tensor) -> Tensor:
    """Per-token average log-prob: log π(y|x) / |y|."""
    return logps / lengths.to(logps.dtype)  # (B,)


def average_pair(batch: PreferenceBatch, chosen: Tensor, rejected: Tensor) -> tuple[Tensor, Tensor]:
    """``chosen`` / |y_w| and ``rejected`` / |y_l|: per-example sums over the completions averaged per token."""
    lw, ll = require(batch, "chosen_lengths", "rejected_lengths")
    return average_logps(chosen, lw), average_logps(rejected, ll)


def average_policy_logps(batch: PreferenceBatch) -> tuple[Tensor, Tensor]:
    """(log π(y_w|x)/|y_w|, log π(y_l|x)/|y_l|): the policy's per-token average log-probs, (B,) each."""
    return average_pair(batch, batch.policy_chosen_logps, batch.policy_rejected_logps)


def nll_reduction_param() -> Any:
    """The ``nll_reduction`` hyperparameter of a loss with an NLL term on the chosen response."""
    return param(
        "example",
        "NLL averaged per example ('example') or over all chosen tokens of the batch ('batch-tokens', TRL's)",
        choices=NLL_REDUCTIONS,
    )


def registers(specs: Sequence[LossSpec]) -> Callable[[], list[LossSpec]]:
    """A family module's ``prefzoo_register_losses`` hook implementation: it returns ``specs`` (declarations are
    data), through the same hook as a third-party plugin's."""

    @hookimpl
    def prefzoo_register_losses() -> list[LossSpec]:
        return list(specs)

    return prefzoo_register_losses


def logratios(batch: PreferenceBatch, average: bool = False) -> tuple[Tensor, Tensor]:
    """log π(y|x) − log π_ref(y|x) for chosen and rejected; per-token averages when ``average``."""
    pw, pl, rw, rl = require(
        batch, "policy_chosen_logps", "policy_rejected_logps", "ref_chosen_logps", "ref_rejected_logps"
    )
    rw, rl = rw.detach(), rl.detach()
    if average:
        return average_pair(batch, pw - rw, pl - rl)
    return pw - rw, pl - rl


def minmax_normalize(
    chosen: Tensor, rejected: Tensor, gather: Callable[[Tensor], Tensor], eps: float
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """In-batch min-max normalization of the MMPO listing: (R + ε − min) / (max + ε − min).

    min and max are taken over the rewards of both responses of the whole
    gathered batch.  Inputs are constants (they come from the reference), so
    only detached values are gathered.  Returns (chosen, rejected, min, max).
    With ε = 0 and all rewards equal, the normalized rewards are 0 rather than 0/0.
    """
    lo, hi = gathered_bounds(torch.cat((chosen, rejected), dim=0), gather)  # over (2·B_total,)
    return minmax_scale(chosen, lo, hi, eps), minmax_scale(rejected, lo, hi, eps), lo, hi


def gathered_bounds(values: Tensor, gather: Callable[[Tensor], Tensor]) -> tuple[Tensor, Tensor]:
    """(min, max) of the 1-D ``values`` over every process (the listing's ``gather_for_metrics``), detached."""
    gathered = gather(values.detach())
    return gathered.min(), gathered.max()


def minmax_scale(x: Tensor, lo: Tensor, hi: Tensor, eps: float) -> Tensor:
    """(x + ε − lo) / (hi + ε − lo), elementwise; 0 where the denominator is 0 (ε = 0 and lo = hi)."""
    denom = hi + eps - lo
    safe = torch.where(denom > 0, denom, torch.ones_like(denom))
    return torch.where(denom > 0, (x + eps - lo) / safe, torch.zeros_like(x))


def log1mexp(x: Tensor) -> Tensor:
    """log(1 − exp(x)) for x < 0, stable on both sides of −log 2 (Mächler 2012)."""
    return torch.where(x > -0.6931471805599453, torch.log(-torch.expm1(x)), torch.log1p(-torch.exp(x)))


def sorted_pair_loss(
    a: Tensor, b: Tensor, gather: Callable[[Tensor], Tensor], f: Callable[[Tensor], Tensor]
) -> Tensor:
    """Per-example share of Σ_k f(sort(A)_k − sort(B)_k) over the gathered batch.

    AOT pairs the k-th smallest of one quantity with the k-th smallest of the
    other over the whole (gathered) batch.  Example j owns half of the slot its
    ``a`` value sorts into and half of the slot its ``b`` value sorts into; tied
    values share their slots equally, so the result does not depend on how a
    sort breaks ties nor on how the batch is split across processes.  The value
    sums to the slot sum, and the gradient is exactly that of the slot sum.
    """
    a_all, _ = torch.sort(gather(a.detach()))  # (N,)
    b_all, _ = torch.sort(gather(b.detach()))  # (N,)
    n = a_all.shape[0]
    k = torch.arange(n, device=a.device)

    def share(v: Tensor, v_all: Tensor) -> Tensor:  # (B, N) weights of the slots v occupies
        lo = torch.searchsorted(v_all, v.detach(), right=False)
        hi = torch.searchsorted(v_all, v.detach(), right=True)
        w = ((k[None, :] >= lo[:, None]) & (k[None, :] < hi[:, None])).to(v.dtype)
        return w / w.sum(dim=1, keepdim=True)

    term_a = (share(a, a_all) * f(a[:, None] - b_all[None, :])).sum(dim=1)  # a_j against its partners
    term_b = (share(b, b_all) * f(a_all[None, :] - b[:, None])).sum(dim=1)  # b_j against its partners
    both = term_a + term_b
    return both - 0.5 * both.detach()


def nll_coupled(p: Any) -> bool:
    """Whether a loss with an ``nll_reduction`` parameter couples the examples of a batch (TRL's token mean)."""
    return bool(p.nll_reduction == "batch-tokens")


def chosen_nll(batch: PreferenceBatch, reduction: str, ctx: LossContext) -> Tensor:
    """Per-example shares of the NLL of the chosen response, −log π(y_w|x) per token.

    ``"example"``: each example's own token mean, −log π(y_w|x)/|y_w| (prefzoo's default: an example's loss does
    not depend on the batch it is in, so gradient accumulation is exact).  ``"batch-tokens"``: TRL's mean over every
    chosen token of the batch, −Σ_j log π(y_w,j|x_j) / Σ_j |y_w,j|, shared as N·(−log π(y_w,i|x_i))/Σ_j |y_w,j|
    so that the mean over the N examples is TRL's value.  The token count and N span the gathered batch (all
    processes); they are constants, so only detached lengths are gathered.
    """
    pw, lw = require(batch, "policy_chosen_logps", "chosen_lengths")
    if reduction == "example":
        return -average_logps(pw, lw)  # (B,)
    lengths = ctx.gather(lw.to(pw.dtype).detach())  # (N,) every chosen length of the gathered batch
    return -pw * (lengths.numel() / lengths.sum())  # (B,)


def exp_capped(x: Tensor, cap: float = EXP_CAP, headroom: float = EXP_HEADROOM) -> Tensor:
    """exp(x) up to ``cap``, then e^cap·(1 + h·u/(h + u)) with u = x − cap, h = ``headroom``: equal value and slope
    at ``cap``, still increasing beyond it (slope e^cap·h²/(h + u)² > 0) but never above (1 + h)·e^cap, so a loss
    that multiplies it by β/(1 − 2ε) (robust) stays as finite as with a flat clamp, which would have zero gradient.
    The slope stays representable in float32 up to u ≈ 1e18, far past any summed log-prob."""
    below = torch.exp(x.clamp(max=cap))
    u = (x.double() - cap).clamp(min=0)  # float64 inside: backward multiplies by e^cap before the small factors
    above = math.exp(cap) * (1 + headroom - headroom**2 / (headroom + u))  # = h·u/(h + u), its slope not cancelling
    return torch.where(x > cap, above.to(x.dtype), below)


def exp_capped_diff(a: Tensor, b: Tensor, cap: float = EXP_CAP, headroom: float = EXP_HEADROOM) -> Tensor:
    """exp_capped(a) − exp_capped(b) without cancelling (1 + h)·e^cap when both are past the cap:
    there it is e^cap·h²·(a − b)/((h + u_a)(h + u_b))."""
    ad, bd = a.double(), b.double()  # float64 inside, as in exp_capped: e^cap·(upstream gradient) overflows float32
    ua, ub = (ad - cap).clamp(min=0), (bd - cap).clamp(min=0)
    both = math.exp(cap) * headroom**2 * ((ad - bd) / (headroom + ua) / (headroom + ub))  # no 1/x − 1/y cancelling
    apart = exp_capped(a, cap, headroom) - exp_capped(b, cap, headroom)
    return torch.where((a > cap) & (b > cap), both.to(a.dtype), apart)


def square_capped(u: Tensor, cap: float) -> Tensor:
    """u² for |u| ≤ ``cap``, then cap²·(1 + 2·log(|u|/cap)): equal value and slope at ±cap, finite and still
    increasing in |u| beyond it, where u² would overflow float32 (cap² must stay well below 3.4e38)."""
    a = u.abs()
    above = cap**2 * (1 + 2 * torch.log1p((a - cap).clamp(min=0) / cap))
    return torch.where(a > cap, above, u.clamp(-cap, cap) ** 2)
