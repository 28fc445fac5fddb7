"""Preemption: SIGTERM/SIGINT set a flag that the loop turns into a checkpoint at the next optimizer-step boundary.

Before the first optimizer step (``immediate``: loading the model, tokenizing, the reference precompute) there is
nothing to save, so a signal raises :class:`StoppedBeforeTraining` at once instead of waiting for a step boundary
that may be minutes away; the run calls :meth:`PreemptionHandler.start_training` when its loop begins.  Once
training, the handlers only record the signal; the loop asks ``should_stop()`` once per optimizer step, and with several
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

__all__ = ["PreemptionHandler", "StoppedBeforeTraining"]

_SIGNALS = (signal.SIGTERM, signal.SIGINT)


class StoppedBeforeTraining(KeyboardInterrupt):
    """SIGTERM/SIGINT before the first optimizer step: nothing to checkpoint, so the run ends at once.

    A ``KeyboardInterrupt`` so that no ``except Exception`` on the way (a library's retry, a cleanup) swallows it and
    libraries clean up as after Ctrl-C; ``exit_code`` is the shell's 128 + signal number (130 SIGINT, 143 SIGTERM).
    """

    def __init__(self, signal_name: str) -> None:
        super().__init__(
            f"stopped by {signal_name} before the first training step: nothing was trained or saved; rerun the same "
            "command to start again"
        )
        self.signal_name = signal_name
        self.exit_code = 128 + int(signal.Signals[signal_name])


class PreemptionHandler:
    """``with PreemptionHandler(accelerator) as pre: ... if pre.should_stop(): save and exit``.

    ``immediate=True``: until :meth:`start_training`, a signal raises :class:`StoppedBeforeTraining` at once.
    """

    def __init__(self, accelerator: Any = None, *, immediate: bool = False) -> None:
        self.accelerator = accelerator
        self.immediate = immediate  # True until the training loop starts: a signal stops the run at once
        self.received: str | None = None  # name of the first signal received
        self._previous: dict[int, Any] = {}
        self.handled: tuple[str, ...] = ()  # the signals this handler listens to (set on __enter__)

    def start_training(self) -> None:
        """The loop begins: from now on a signal is a flag turned into a checkpoint at the next step boundary."""
        self.immediate = False

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        name = signal.Signals(signum).name
        if self.immediate:
            raise StoppedBeforeTraining(name)
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
            # a signal blocked by whoever started us (a mask inherited through fork and exec) would never arrive:
            # the ones handled here are unblocked, as in a shell
            signal.pthread_sigmask(signal.SIG_UNBLOCK, set(self._previous))
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
