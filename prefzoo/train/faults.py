"""Fault handling in the training loop: non-finite step skipping, peer-failure messages, and test-only fault injection.

Non-finite steps.  The trainer checks the policy/reference log-probs *before* it builds a ``PreferenceBatch`` (whose
constructor keeps raising for user-built batches), then the per-pair losses, then the clipped gradient norm.  Any
non-finite value on any process marks the optimizer step as skipped on every process (one all-reduced flag): no
backward for the rest of the step, no ``optimizer.step()``, no scheduler step, gradients zeroed.  Skips are counted,
logged with the offending example ids, and after ``max_consecutive_skips`` in a row the run stops with a checkpoint.

Fault injection (tests only).  ``PREFZOO_FAULTS`` holds comma-separated ``KIND@STEP[:RANK]`` entries:
``nan_logps@3:1`` (rank 1's log-probs are NaN in optimizer step 3), ``nan_grad@2``, ``exit@2:1`` (rank 1 exits with
status 3 when step 2 starts), ``hang@2:1`` (rank 1 sleeps forever), ``raise@2:1``, ``sigterm@3:1`` (rank 1 sends
itself SIGTERM), ``sleep_step@0`` (every step sleeps ``PREFZOO_FAULT_SLEEP`` seconds, default 0.3) and
``ckpt_sleep@4`` (the writer of checkpoint 4 sleeps ``PREFZOO_FAULT_SLEEP`` seconds after the state is written and
before its completion marker).  STEP 0 matches every step.  Unset in production: ``FaultPlan.from_env()`` is then
empty and every hook returns at once.
"""

from __future__ import annotations

import logging
import os
import re
import signal
import sys
import time
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor

__all__ = [
    "FAULTS_ENV",
    "FaultPlan",
    "NonFiniteGuard",
    "NonFiniteStepsError",
    "PeerFailureError",
    "TrainingAborted",
    "is_peer_failure",
    "nonfinite_ids",
]

log = logging.getLogger(__name__)

FAULTS_ENV = "PREFZOO_FAULTS"
SLEEP_ENV = "PREFZOO_FAULT_SLEEP"
KINDS = ("nan_logps", "nan_grad", "exit", "hang", "raise", "sigterm", "sleep_step", "ckpt_sleep")


class TrainingAborted(RuntimeError):
    """The run stopped on purpose after a fault; the message says why and how to continue."""


class NonFiniteStepsError(TrainingAborted):
    """Too many consecutive optimizer steps had non-finite losses or gradients."""


class PeerFailureError(TrainingAborted):
    """A collective failed or timed out: another process died or hung."""


@dataclass(frozen=True)
class _Fault:
    kind: str
    step: int  # optimizer step (1-based) it fires in; 0 = every step
    rank: int | None  # None = every rank


@dataclass
class FaultPlan:
    """Faults to inject, parsed from ``PREFZOO_FAULTS`` (empty in production)."""

    faults: list[_Fault] = field(default_factory=list)
    sleep_s: float = 0.3

    @classmethod
    def from_env(cls) -> FaultPlan:
        raw = os.environ.get(FAULTS_ENV, "").strip()
        plan = cls(sleep_s=float(os.environ.get(SLEEP_ENV, "0.3")))
        for item in filter(None, (s.strip() for s in raw.split(","))):
            m = re.fullmatch(r"([a-z_]+)@(\d+)(?::(\d+))?", item)
            if not m or m.group(1) not in KINDS:
                raise ValueError(f"{FAULTS_ENV}={raw!r}: bad entry {item!r}; use KIND@STEP[:RANK], KIND in {KINDS}")
            plan.faults.append(_Fault(m.group(1), int(m.group(2)), int(m.group(3)) if m.group(3) else None))
        return plan

    def fires(self, kind: str, step: int, rank: int) -> bool:
        return any(f.kind == kind and f.step in (0, step) and f.rank in (None, rank) for f in self.faults)

    def at_step_start(self, step: int, rank: int) -> None:
        """Process-level faults at the start of optimizer step ``step`` (1-based)."""
        if not self.faults:
            return
        if self.fires("sleep_step", step, rank):
            time.sleep(self.sleep_s)
        if self.fires("exit", step, rank):
            print(f"prefzoo fault injection: rank {rank} exits at step {step}", file=sys.stderr, flush=True)
            os._exit(3)
        if self.fires("sigterm", step, rank):
            os.kill(os.getpid(), signal.SIGTERM)
        if self.fires("raise", step, rank):
            raise RuntimeError(f"prefzoo fault injection: rank {rank} raises at step {step}")
        if self.fires("hang", step, rank):
            print(f"prefzoo fault injection: rank {rank} hangs at step {step}", file=sys.stderr, flush=True)
            while True:
                time.sleep(3600)

    def in_checkpoint_write(self, step: int) -> None:
        """Between the state files and the completion marker of checkpoint ``step``."""
        if self.faults and self.fires("ckpt_sleep", step, 0):
            print(f"prefzoo fault injection: checkpoint {step} written, no marker yet", file=sys.stderr, flush=True)
            time.sleep(self.sleep_s)

    def poison_logps(self, logps: Tensor, step: int, rank: int) -> Tensor:
        """``logps`` (2B,) with NaN in its first row when ``nan_logps`` fires (keeps the autograd graph)."""
        if self.faults and self.fires("nan_logps", step, rank):
            poison = torch.zeros_like(logps)  # (2B,)
            poison[0] = float("nan")
            return logps + poison
        return logps

    def poison_grads(self, params: list[Any], step: int, rank: int) -> None:
        if self.faults and self.fires("nan_grad", step, rank):
            for p in params:
                if p.grad is not None:
                    p.grad.view(-1)[0] = float("nan")
                    return


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

    def record_skip(self, step: int, reason: str, ids: list[str]) -> None:
        """Count optimizer step ``step`` as skipped and log it (main process writes the JSON line)."""
        self.skipped += 1
        self.consecutive += 1
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
