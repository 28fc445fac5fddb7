"""Small shared pieces of the property tests: float64 batches and independent MMPO scores."""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from prefzoo.testing.reference import _mmpo_scores, to_float64
from prefzoo.types import PreferenceBatch

F64 = torch.float64


def leaves64(batch: PreferenceBatch) -> PreferenceBatch:
    """A float64 copy whose policy log-probs are fresh leaves requiring grad."""
    ch: dict[str, Any] = {}
    for n in ("policy_chosen_logps", "policy_rejected_logps", "ref_chosen_logps", "ref_rejected_logps"):
        t = getattr(batch, n)
        if t is not None:
            ch[n] = t.detach().to(F64).clone().requires_grad_(n.startswith("policy"))
    return batch.replace(**ch)


def mmpo_scores(batch: PreferenceBatch, params: Any, **kw: bool) -> tuple[Tensor, Tensor]:
    """(s_w, s_l) from prefzoo.testing.reference, written independently of prefzoo.losses.mmpo."""
    return _mmpo_scores(to_float64(batch), params, **kw)


def batch64(pw, pl, rw=None, rl=None, lw=None, ll=None, grad: bool = True) -> PreferenceBatch:
    t = lambda xs: None if xs is None else torch.as_tensor(xs, dtype=F64)  # noqa: E731
    return PreferenceBatch(
        policy_chosen_logps=t(pw).clone().requires_grad_(grad),
        policy_rejected_logps=t(pl).clone().requires_grad_(grad),
        ref_chosen_logps=t(rw),
        ref_rejected_logps=t(rl),
        chosen_lengths=None if lw is None else torch.as_tensor(lw),
        rejected_lengths=None if ll is None else torch.as_tensor(ll),
    )
