"""Files a run writes, opened without following a symbolic link, and the one-line refusal of a link in their place.

Anyone who can write in an output folder (or a cache) could leave a symlink where prefzoo writes next: its
``metrics.jsonl``, its lock file, its ``final`` folder.  Followed, the link would send prefzoo's writes (an append,
a truncation, a delete) to the link's target.  Every file prefzoo opens for writing there goes through
:func:`open_nofollow` (``O_NOFOLLOW``: a link in the last component fails with :class:`SymlinkError`), and a run
refuses a link among the names it writes before it starts (:func:`refuse_symlinks`, used by
:mod:`prefzoo.train.checkpoint.outdir`).
"""

from __future__ import annotations

import errno
import os
from collections.abc import Iterable
from pathlib import Path
from typing import IO

__all__ = ["SymlinkError", "open_nofollow", "refuse_symlinks", "write_text_nofollow"]

# mode -> os.open flags; "x": a new file (a temp name), "a": append, "w": replace the contents, "r+": read and write
_FLAGS = {
    "x": os.O_WRONLY | os.O_CREAT | os.O_EXCL,
    "a": os.O_WRONLY | os.O_CREAT | os.O_APPEND,
    "w": os.O_WRONLY | os.O_CREAT | os.O_TRUNC,
    "r+": os.O_RDWR | os.O_CREAT,
}
_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)  # 0 where the OS has no such flag (Windows)


class SymlinkError(OSError):
    """A symbolic link where prefzoo writes; the message names it and the fix."""


def _refusal(path: Path) -> SymlinkError:
    try:
        target = f" (to {os.readlink(path)})"
    except OSError:
        target = ""
    return SymlinkError(
        f"{path} is a symbolic link{target}: prefzoo writes there and follows no link (a link would send the write "
        "to its target); remove the link, or give the run another --output-dir"
    )


def open_nofollow(path: str | os.PathLike[str], mode: str = "a") -> IO[str]:
    """Open ``path`` as text for writing (``mode``: ``x`` new, ``a`` append, ``w`` replace, ``r+`` read/write,
    created if missing) without following a symbolic link: a link raises :class:`SymlinkError`."""
    p = Path(path)
    try:
        fd = os.open(p, _FLAGS[mode] | _NOFOLLOW, 0o666)
    except OSError as e:
        if e.errno in (errno.ELOOP, errno.EMLINK) or (e.errno == errno.EEXIST and p.is_symlink()):
            raise _refusal(p) from None
        raise
    return os.fdopen(fd, mode, encoding="utf-8")


def write_text_nofollow(path: str | os.PathLike[str], text: str, mode: str = "w") -> None:
    """``Path.write_text`` through :func:`open_nofollow` (``mode`` ``x`` for a fresh temp name)."""
    with open_nofollow(path, mode) as f:
        f.write(text)


def refuse_symlinks(paths: Iterable[Path]) -> None:
    """Raise :class:`SymlinkError` for the first of ``paths`` that is a symbolic link (dangling ones too)."""
    for p in paths:
        if p.is_symlink():
            raise _refusal(p)
