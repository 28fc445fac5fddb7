"""An exclusive lock on a file between processes (``fcntl.flock``; no lock where there is no ``fcntl``).

Used by the default task's build cache (:mod:`prefzoo.data.default`) and by a run's output dir
(:mod:`prefzoo.train.checkpoint.outdir`).  The OS drops the lock when its holder dies, even by ``kill -9``.  The lock
file is opened without following a symbolic link (a link there raises :class:`prefzoo._safefs.SymlinkError`): the
holder writes its name into it, which through a link would overwrite the link's target.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import IO, NoReturn

from prefzoo._safefs import open_nofollow

__all__ = ["file_lock"]


@contextlib.contextmanager
def file_lock(path: Path, on_busy: Callable[[IO[str]], NoReturn] | None = None) -> Iterator[IO[str] | None]:
    """Hold an exclusive lock on ``path`` (created, with its folder) for the block; yields the open file, or None
    where there is no ``fcntl`` (non-POSIX: no lock).

    A symbolic link at ``path`` raises :class:`prefzoo._safefs.SymlinkError` (never followed).  Without ``on_busy``
    the lock is waited for; with it, a lock another process holds calls ``on_busy`` with the
    open file (to read what the holder wrote there), which raises.
    """
    try:
        import fcntl
    except ImportError:  # pragma: no cover - Windows
        yield None
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    with open_nofollow(path, "r+") as f:
        if on_busy is None:
            fcntl.flock(f, fcntl.LOCK_EX)
        else:
            try:
                fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                on_busy(f)
        try:
            yield f
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)
