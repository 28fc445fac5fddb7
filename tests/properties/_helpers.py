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


class ThreadAccelerator:
    """One rank of an in-process group of threads with accelerate's ``gather`` and ``pad_across_processes`` semantics.

    ``gather(t)`` concatenates every rank's (equal-sized) ``t`` in rank order; ``pad_across_processes(t, dim=0)``
    zero-pads ``t`` to the largest size over ranks; ``wait_for_everyone`` and ``reduce(t, "sum")`` (rank 0 is the
    main process) are what checkpoint saving needs.  Lets the production ``make_gather`` run in one process (and under
    mutmut, which traces only its own process); tests/distributed runs it under real ``accelerate launch``.
    """

    device = "cpu"

    def __init__(self, rank: int, exchange: Any) -> None:
        self.process_index, self.num_processes, self._ex = rank, exchange.n, exchange
        self.is_main_process = self.is_local_main_process = rank == 0

    def gather(self, t: Tensor) -> Tensor:
        return self._ex.gather(self.process_index, t)

    def wait_for_everyone(self) -> None:
        self._ex.barrier.wait()

    def reduce(self, t: Tensor, reduction: str) -> Tensor:
        assert reduction == "sum"
        return self.gather(t).sum(0, keepdim=True)  # every rank's (1,) t, summed

    def pad_across_processes(self, t: Tensor, dim: int = 0) -> Tensor:
        assert dim == 0
        m = int(self._ex.gather(self.process_index, torch.tensor([t.shape[0]])).max())
        return torch.cat((t, t.new_zeros((m - t.shape[0], *t.shape[1:]))), dim=0)


def run_on_ranks(fn: Any, world: int) -> list[Any]:
    """``fn(rank, gather)`` on ``world`` threads, ``gather`` being prefzoo.train.engines.accelerator.make_gather of a
    ThreadAccelerator; results in rank order."""
    from prefzoo.testing.sharding import run_threads
    from prefzoo.train.engines.accelerator import make_gather

    return run_threads(lambda rank, ex: fn(rank, make_gather(ThreadAccelerator(rank, ex))), world)
