"""Preemption: SIGTERM/SIGINT set a flag that the loop turns into a checkpoint at the next optimizer-step boundary.

The handlers only record the signal; the loop asks ``should_stop()`` once per optimizer step, and with several
processes the flag is all-reduced so every rank stops at the same step (each may receive the signal at a different
moment).  A second SIGINT while the first is pending raises ``KeyboardInterrupt`` at once (a user who insists).
Handlers are installed only from the main thread and restored on exit.

An ignored SIGINT stays ignored.  Python's own convention: it installs ``default_int_handler`` only when SIGINT is
not ignored at start-up, because a process started with SIGINT ignored (``nohup``, ``cmd &`` from a script, many
CI runners and schedulers) was told by its parent that Ctrl-C is not for it.  Such a run is preempted by SIGTERM
only.  SIGTERM is always handled, even if inherited as ignored: it is how schedulers announce preemption before
SIGKILL, and the answer (a checkpoint and a clean exit) loses nothing.
"""

from __future__ import annotations

import signal
import threading
from types import FrameType, TracebackType
from typing import Any

import torch

__all__ = ["PreemptionHandler"]

_SIGNALS = (signal.SIGTERM, signal.SIGINT)


class PreemptionHandler:
    """``with PreemptionHandler(accelerator) as pre: ... if pre.should_stop(): save and exit``."""

    def __init__(self, accelerator: Any = None) -> None:
        self.accelerator = accelerator
        self.received: str | None = None  # name of the first signal received
        self._previous: dict[int, Any] = {}
        self.handled: tuple[str, ...] = ()  # the signals this handler listens to (set on __enter__)

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        name = signal.Signals(signum).name
        if self.received == "SIGINT" and name == "SIGINT":
            raise KeyboardInterrupt
        if self.received is None:
            self.received = name

    def __enter__(self) -> PreemptionHandler:
        if threading.current_thread() is threading.main_thread():
            for s in _SIGNALS:
                previous = signal.getsignal(s)
                if s == signal.SIGINT and previous == signal.SIG_IGN:
                    continue  # ignored by whoever started us (nohup, a background job): leave it ignored
                if previous is None:
                    continue  # a handler installed outside Python: it could not be restored
                self._previous[s] = previous
                signal.signal(s, self._handle)
            self.handled = tuple(signal.Signals(s).name for s in self._previous)
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        for s, prev in self._previous.items():
            signal.signal(s, prev)
        self._previous.clear()
        self.handled = ()

    def should_stop(self) -> bool:
        """True on every process when any process received SIGTERM/SIGINT (one all-reduce when distributed)."""
        acc = self.accelerator
        local = self.received is not None
        if acc is None or acc.num_processes == 1:
            return local
        flag = torch.tensor([1.0 if local else 0.0], device=acc.device)
        return bool(acc.reduce(flag, reduction="sum").item() > 0)

    def reason(self) -> str:
        return self.received or "a signal on another process"
