"""Progress of the long phases before and around training (tokenizing, the reference precompute, evaluation).

On a terminal (stderr is a TTY) a tqdm bar, redrawn at most twice a second.  Anywhere else (a log file, a pipe, CI)
whole lines and never a carriage return: one at ``delay`` seconds, then one at most every ``every`` seconds, and a last
one with the time taken.  A phase shorter than ``delay`` (a cache hit, a small dataset) shows nothing, and a phase that
fails or is interrupted adds no line of its own (the error says what happened).

Rows mapped by ``datasets.map`` are counted by :func:`counted`, whose function calls the module-level :func:`tick`:
the bar is not in the mapped function's closure, so its fingerprint (datasets' cache key) does not depend on it.  Only
the process that opened the bar counts (with ``num_proc`` > 1 the workers' rows are not counted: the bar shows the
phase and its time).  Whoever opens a bar says whether it shows (``Progress(..., enabled=False)``: a run with
``--no-progress``, processes other than the main one); the functions that open one take a ``progress`` argument.
"""

from __future__ import annotations

import contextlib
import os
import sys
import time
from collections.abc import Callable, Iterator
from types import TracebackType
from typing import Any, TextIO

__all__ = ["Progress", "counted", "length", "tick"]


class _State:
    """The bar :func:`tick` counts on, as a class attribute: datasets pickles a module-level class by name when it
    hashes a mapped function, so the bar never reaches the function's fingerprint (a dict here would)."""

    current: Progress | None = None  # set by Progress.counting()


def tick(n: int = 1) -> None:
    """Count ``n`` more rows on the bar :func:`counted` opened (nothing when none is open)."""
    bar = _State.current
    if bar is not None:
        bar.update(n)


def counted(fn: Callable[..., Any]) -> Callable[..., Any]:
    """``fn`` that counts each call on the open bar (:meth:`Progress.counting`): one call per row of a map."""

    def call(*args: Any, **kwargs: Any) -> Any:
        tick()
        return fn(*args, **kwargs)

    return call


def length(items: Any) -> int:
    """``len(items)``, or 0 for an iterable without one (a bar then counts without a total)."""
    try:
        return len(items)
    except TypeError:
        return 0


def _is_tty(stream: Any) -> bool:
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError):  # no isatty, or a closed stream
        return False


class Progress:
    """``with Progress(total, "tokenizing pairs", unit="pairs") as bar: ... bar.update(n)``.

    ``delay``: seconds before anything shows; ``every``: seconds between two lines when stderr is not a terminal;
    ``initial``: units already done (a resumed run); ``leave``: the terminal bar stays when it ends; ``enabled``:
    False shows nothing (the count is still kept).
    """

    def __init__(
        self, total: int, desc: str, *, unit: str = "rows", delay: float = 2.0, every: float = 10.0,
        initial: int = 0, leave: bool = False, stream: TextIO | None = None, enabled: bool = True,
    ) -> None:  # fmt: skip
        self.total, self.desc, self.unit, self.delay, self.every = total, desc, unit, delay, every
        self.stream = stream if stream is not None else sys.stderr
        self.enabled = bool(enabled)
        self.initial = self.n = initial  # units done, counting those before this bar
        self.pid = os.getpid()  # a forked worker's copy counts nothing
        self.t0 = self.last = time.monotonic()
        self.lines = 0  # lines written (not a terminal)
        self.postfix = ""
        self.bar: Any = None
        if self.enabled and _is_tty(self.stream):
            from tqdm.auto import tqdm

            self.bar = tqdm(total=total, initial=initial, desc=desc, unit=f" {unit}", delay=delay, mininterval=0.5,
                            file=self.stream, dynamic_ncols=True, leave=leave)  # fmt: skip

    def update(self, n: int = 1) -> None:
        if not self.enabled or os.getpid() != self.pid:
            return
        self.n += n
        if self.bar is not None:
            self.bar.update(n)
            return
        now = time.monotonic()
        if now - self.t0 >= self.delay and (self.lines == 0 or now - self.last >= self.every):
            self.last = now
            done = min(self.n, self.total)
            rate = (done - self.initial) / max(now - self.t0, 1e-9)
            left = f", about {(self.total - done) / rate:.0f} s left" if rate > 0 and done < self.total else ""
            self._line(f"{done}/{self.total} {self.unit} ({100 * done // max(self.total, 1)}%), "
                       f"{now - self.t0:.0f} s{left}{self.postfix}")  # fmt: skip

    def set_postfix(self, **values: Any) -> None:
        """Values shown after the count (the terminal bar's postfix; the next line's tail in a log)."""
        if self.bar is not None:
            self.bar.set_postfix(**values)
        self.postfix = "".join(f", {k} {v}" for k, v in values.items())

    def write(self, message: str) -> None:
        """``message`` on standard output, on a line of its own (above the terminal bar)."""
        if self.bar is not None:
            self.bar.write(message)
        else:
            print(message, flush=True)

    def _line(self, text: str) -> None:
        self.lines += 1
        try:
            print(f"{self.desc}: {text}", file=self.stream, flush=True)
        except (OSError, ValueError):  # a closed or broken stream: progress is not worth failing a run for
            self.enabled = False

    def close(self, finished: bool = True) -> None:
        """End the bar; a finished phase that lasted at least ``delay`` says so in a last line (not on a terminal).
        Closing twice does nothing."""
        if self.bar is not None:
            self.bar.close()
        elif self.enabled and finished and (self.lines or time.monotonic() - self.t0 >= self.delay):
            done = min(self.n, self.total) if self.n > self.initial else self.total  # uncounted: num_proc > 1
            self._line(f"{done}/{self.total} {self.unit} in {time.monotonic() - self.t0:.1f} s{self.postfix}")
        self.enabled = False

    @contextlib.contextmanager
    def counting(self) -> Iterator[Progress]:
        """Within the block, :func:`tick` counts on this bar."""
        before = _State.current
        _State.current = self
        try:
            yield self
        finally:
            _State.current = before

    def __enter__(self) -> Progress:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close(finished=exc_type is None)
