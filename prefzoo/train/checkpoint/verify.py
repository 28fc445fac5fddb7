"""The sha256 of every file a checkpoint holds: computed when the folder is sealed, checked before anything loads it.

A checkpoint's completion marker lists each of its files twice: ``files`` (relative path -> size, the cheap check
made whenever checkpoints are listed) and ``sha256`` (relative path -> hex digest).  :func:`digest_folder` reads each
file once (hashing and fsyncing it, a few files at a time); :func:`verify_files` reads each once more and names the
first file that is missing, of another size or content, not listed, or a symbolic link.  A marker without ``sha256``
(written before prefzoo recorded digests) cannot be verified: :attr:`Verdict.hashed` is False and only sizes count.
"""

from __future__ import annotations

import hashlib
import os
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any

__all__ = ["Verdict", "digest_folder", "file_sha256", "verify_files"]

_CHUNK = 1 << 20  # bytes read per call: hashlib releases the GIL on large updates, so files hash in parallel
_THREADS = 4  # files hashed at once (a checkpoint holds a handful; the model and optimizer files dominate)


@dataclass(frozen=True)
class Verdict:
    """Whether a checkpoint folder holds exactly the files its marker lists, byte for byte."""

    ok: bool  # nothing found wrong (with ``hashed`` False: sizes only)
    hashed: bool  # the marker records a sha256 per file
    why: str = ""  # the first problem, naming the file ('' when ok)
    files: int = 0  # files the marker lists


def file_sha256(path: Path, fsync: bool = False) -> str:
    """The hex sha256 of the file ``path`` (not followed if it is a symbolic link); ``fsync``: flush it to disk too."""
    h = hashlib.sha256()
    buf = bytearray(_CHUNK)
    view = memoryview(buf)
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0))
    try:
        with os.fdopen(fd, "rb", buffering=0, closefd=False) as f:
            while n := f.readinto(buf):
                h.update(view[:n])
        if fsync:
            try:
                os.fsync(fd)
            except OSError:
                pass  # best effort where the filesystem refuses
    finally:
        os.close(fd)
    return h.hexdigest()


def _regular_files(folder: Path, skip: str) -> tuple[list[str], list[str]]:
    """(regular files, symbolic links) under ``folder`` as sorted POSIX relative paths, ``skip`` (the marker) left out;
    links are listed, never followed."""
    files: list[str] = []
    links: list[str] = []
    for top, dirs, names in os.walk(folder, followlinks=False):
        for name in [*names, *(d for d in dirs if os.path.islink(os.path.join(top, d)))]:
            rel = Path(top, name).relative_to(folder).as_posix()
            if rel == skip:
                continue
            (links if os.path.islink(os.path.join(top, name)) else files).append(rel)
    return sorted(files), sorted(links)


def digest_folder(folder: Path, skip: str) -> tuple[dict[str, int], dict[str, str]]:
    """(relative path -> size, relative path -> sha256) of every file under ``folder`` but ``skip``; each file is read
    once, hashed and fsynced."""
    files, _ = _regular_files(folder, skip)
    with ThreadPoolExecutor(max_workers=max(1, min(_THREADS, len(files)))) as pool:
        digests = list(pool.map(lambda rel: file_sha256(folder / rel, fsync=True), files))
    return {rel: (folder / rel).stat().st_size for rel in files}, dict(zip(files, digests, strict=True))


def _unsafe(rel: str) -> bool:
    p = PurePosixPath(rel)
    return p.is_absolute() or ".." in p.parts or "\\" in rel or not p.parts


def verify_files(folder: Path, marker: dict[str, Any], skip: str) -> Verdict:
    """Check ``folder`` against its marker: every listed file present with its size and sha256, nothing unlisted, no
    symbolic link.  Sizes are checked for every file before any is hashed, so a truncated file fails at once."""
    sizes, digests = marker.get("files"), marker.get("sha256")
    if not isinstance(sizes, dict):
        return Verdict(True, False)  # a marker from before manifests: nothing to check against
    hashed = isinstance(digests, dict)
    present, links = _regular_files(folder, skip)

    def bad(why: str) -> Verdict:
        return Verdict(False, hashed, why, len(sizes))

    if links:
        return bad(f"{links[0]} is a symbolic link (a checkpoint holds regular files only)")
    for rel, size in sizes.items():
        if _unsafe(rel):
            return bad(f"the marker lists {rel!r}, a path outside the checkpoint folder")
        f = folder / rel
        if not f.is_file():
            return bad(f"{rel} is missing")
        if f.stat().st_size != size:
            return bad(f"{rel} has {f.stat().st_size} bytes, the marker says {size} (truncated or rewritten)")
    if not isinstance(digests, dict):
        return Verdict(True, False, "", len(sizes))
    unlisted = [rel for rel in present if rel not in sizes]
    if unlisted or set(digests) != set(sizes):
        what = unlisted[0] if unlisted else sorted(set(digests) ^ set(sizes))[0]
        return bad(f"{what} is not listed with a size and a sha256 in the marker")
    for rel in sizes:
        if file_sha256(folder / rel) != digests[rel]:
            return bad(f"{rel}: its sha256 differs from the one recorded when it was written (the file was changed)")
    return Verdict(True, True, "", len(sizes))
