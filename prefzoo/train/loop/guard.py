"""What makes a step skip or a run stop: non-finite steps, dead or hung peers, and the errors that say so.

Non-finite steps.  The trainer checks the policy/reference log-probs *before* it builds a ``PreferenceBatch`` (whose
constructor keeps raising for user-built batches), then the per-pair losses, then the clipped gradient norm.  Any
non-finite value on any process marks the optimizer step as skipped on every process (one all-reduced flag): no
backward for the rest of the step, no ``optimizer.step()``, no scheduler step, gradients zeroed.  Skips are counted,
logged with the offending example ids, and after ``max_consecutive_skips`` in a row the run stops with a checkpoint.

An engine that steps inside ``backward`` (:attr:`prefzoo.train.engines.Engine.steps_in_backward`) says how it
drops a bad step instead (see its module).

Fault injection for tests is a callback the tests install (``tests/faults/injector.py``), not part of the package.
"""

from __future__ import annotations

import logging
import re
import sys
from typing import Any

import torch
from torch import Tensor

from prefzoo.train.errors import TrainingAborted

__all__ = ["NonFiniteGuard", "NonFiniteStepsError", "PeerFailureError", "is_peer_failure", "nonfinite_ids"]

log = logging.getLogger(__name__)


class NonFiniteStepsError(TrainingAborted):
    """Too many consecutive optimizer steps had non-finite losses or gradients."""


class PeerFailureError(TrainingAborted):
    """A collective failed or timed out: another process died or hung."""


def nonfinite_ids(ids: list[str], *tensors: Tensor | None) -> list[str]:
    """Example ids whose row is non-finite in any of ``tensors`` ((B,) or (B, T) each; None skipped)."""
    bad = torch.zeros(len(ids), dtype=torch.bool)
    for t in tensors:
        if t is None:
            continue
        finite = torch.isfinite(t.detach())
        rows = finite.reshape(finite.shape[0], -1).all(dim=1)  # (B,)
        bad |= ~rows.cpu()
    return [i for i, b in zip(ids, bad.tolist(), strict=True) if b]


class NonFiniteGuard:
    """Agrees across processes on whether a step is bad, and keeps the skip counts and logs."""

    def __init__(self, accelerator: Any, max_consecutive: int, writer: Any = None) -> None:
        self.accelerator = accelerator
        self.max_consecutive = max_consecutive  # 0 = never stop
        self.writer = writer
        self.skipped = 0  # optimizer steps skipped in this run
        self.consecutive = 0
        self.last_ids: list[str] = []

    def any_rank(self, local_bad: bool) -> bool:
        """True on every process when ``local_bad`` is True on at least one (one all-reduce when distributed)."""
        acc = self.accelerator
        if acc.num_processes == 1:
            return local_bad
        flag = torch.tensor([1.0 if local_bad else 0.0], device=acc.device)
        return bool(acc.reduce(flag, reduction="sum").item() > 0)

    def all_ids(self, local_ids: list[str]) -> list[str]:
        """The offending ids of every process (call on every process, only after ``any_rank`` said True)."""
        if self.accelerator.num_processes == 1:
            return list(local_ids)
        from accelerate.utils import gather_object

        return [str(i) for i in gather_object(list(local_ids))]

    def record_skip(self, step: int, reason: str, ids: list[str], fault: bool = True) -> None:
        """Count optimizer step ``step`` as skipped and log it (main process writes the JSON line); ``fault=False``
        (asked for, e.g. ``--skip-batches``) does not count towards ``max_consecutive_skips``."""
        self.skipped += 1
        self.consecutive += 1 if fault else 0
        self.last_ids = ids
        msg = (
            f"prefzoo train: step {step} skipped ({reason}; examples {ids[:8]}{' ...' if len(ids) > 8 else ''}); "
            f"{self.skipped} skipped so far, {self.consecutive} in a row"
        )
        if self.accelerator.is_main_process:
            print(msg, file=sys.stderr, flush=True)
            if self.writer is not None:
                self.writer.write({"event": "skipped_step", "step": step, "reason": reason, "example_ids": ids})
        log.warning(msg)

    def record_ok(self) -> None:
        self.consecutive = 0

    def exhausted(self) -> bool:
        return self.max_consecutive > 0 and self.consecutive >= self.max_consecutive


_PEER_PATTERNS = re.compile(
    r"timed out|timeout|connection closed|connection reset|broken pipe|peer|NCCL|gloo|socket", re.IGNORECASE
)


def is_peer_failure(e: BaseException) -> bool:
    """Whether ``e`` looks like a failed collective (timeout, or a peer that went away)."""
    names = {c.__name__ for c in type(e).__mro__}
    if names & {"DistBackendError", "DistNetworkError", "DistStoreError", "DistError"}:
        return True
    return isinstance(e, RuntimeError) and bool(_PEER_PATTERNS.search(str(e)))
