"""What a run checks about its ``--output-dir`` before any work: another run using it, a run it holds, a link in it.

* One run per output dir: the first process of each node (local rank 0) holds ``fcntl.flock`` on
  ``output_dir/.prefzoo-train.lock`` for the whole run; a second ``prefzoo train`` on the same folder stops at once
  with :class:`OutputDirLockedError` instead of interleaving checkpoints.  The OS drops the lock when the holder dies
  (even by ``kill -9``), so a stale lock file never blocks a resume.  ``prefzoo train`` takes it first thing
  (:func:`claim_output_dir`, before the default task is loaded and scored); :func:`prefzoo.train.train` takes it
  for runs started from Python (a process that holds it already goes on).
* One output dir holds one run: a folder where a run trained (a checkpoint, ``final/``, a metrics.jsonl record of
  a step >= 1) is refused without ``--resume`` (:class:`OutputDirHoldsRunError`, naming ``--resume auto`` and
  ``--overwrite-output-dir``); with ``--overwrite-output-dir`` its files (:data:`RUN_FILES`), and no others, are
  deleted first, as are the files of a run stopped before its first step (it trained nothing: the same command
  starts again).  Without the rule a second run would
  append to the first's ``metrics.jsonl`` and leave the first's newer checkpoints where ``--resume auto`` and
  ``prefzoo checkpoint info`` find them.
* No symbolic link where the run writes (:data:`RUN_FILES`, the lock, the entries of ``checkpoints/``): one line
  naming it (:class:`prefzoo._safefs.SymlinkError`); the files themselves are opened with ``O_NOFOLLOW``.
* A finished run resumed (``--resume``) is reported by :func:`finished_run` and left untouched.  The final model is
  written once (node 0); each node's writer also leaves :data:`FINISHED_MARKER`, so a node whose disk is its own
  knows the run finished and returns with node 0 instead of waiting for it in a collective.
"""

from __future__ import annotations

import contextlib
import errno
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any, NoReturn

from prefzoo._dist import local_rank
from prefzoo._filelock import file_lock
from prefzoo._safefs import refuse_symlinks, write_text_nofollow
from prefzoo.errors import ConfigError
from prefzoo.train.checkpoint.nodes import NODE_MARKER
from prefzoo.train.checkpoint.save import find_latest_checkpoint, read_marker
from prefzoo.train.config.sections import CheckpointSection, OptimizationSection
from prefzoo.train.errors import TrainingAborted

__all__ = [
    "FINISHED_MARKER",
    "LOCK_FILE",
    "RUN_FILES",
    "OutputDirError",
    "OutputDirHoldsRunError",
    "OutputDirLockedError",
    "check_output_dir",
    "claim_output_dir",
    "finished_run",
    "mark_finished",
    "output_dir_lock",
]

LOCK_FILE = ".prefzoo-train.lock"
FINISHED_MARKER = ".prefzoo-finished.json"  # {"step": N, "final": path}: written once the final model is complete
# what a run writes at the top of its output dir (the lock aside)
RUN_FILES = ("metrics.jsonl", "checkpoints", "final", FINISHED_MARKER, ".tmp-final", "tb", NODE_MARKER)
_held: set[str] = set()  # output dirs whose lock this process holds (the CLI's claim, then train()'s)


class OutputDirError(ConfigError):
    """``--output-dir`` cannot hold the run: a file, under a file, not writable, or on a read-only filesystem."""


def _first_existing(path: Path) -> Path:
    while not path.exists() and path != path.parent:
        path = path.parent
    return path


def check_output_dir(output_dir: str | os.PathLike[str]) -> None:
    """``output_dir`` is a folder this process can create and write in, or one line naming the path and the fix."""
    out = Path(output_dir).expanduser()
    fix = "give --output-dir a folder you can write to (it is created if missing)"
    if out.exists() and not out.is_dir():
        raise OutputDirError(f"--output-dir {out} is a file, not a folder: {fix}")
    ancestor = _first_existing(out)
    if not ancestor.is_dir():
        raise OutputDirError(f"--output-dir {out} lies under {ancestor}, which is a file: {fix}")
    try:
        out.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=out, prefix=".prefzoo-write-check-"):
            pass
    except OSError as e:
        why = "the filesystem is read-only" if e.errno == errno.EROFS else (e.strerror or type(e).__name__).lower()
        raise OutputDirError(f"--output-dir {out} cannot be written ({why}): {fix}") from None


class OutputDirLockedError(TrainingAborted):
    """Another ``prefzoo train`` holds the lock of this ``--output-dir``."""


class OutputDirHoldsRunError(ConfigError):
    """``--output-dir`` holds another run's files and neither ``--resume`` nor ``--overwrite-output-dir`` was given."""


def _local_rank() -> int:
    return local_rank()


@contextlib.contextmanager
def output_dir_lock(output_dir: str | Path) -> Iterator[None]:
    """Hold the output dir's lock for the block on each node's local rank 0 (other ranks and non-POSIX: no-op; a
    process that holds it already: no-op).  A symbolic link as the lock file raises :class:`SymlinkError`."""
    out = Path(output_dir)
    key = os.path.abspath(out)
    if _local_rank() != 0 or key in _held:
        yield
        return
    path = out / LOCK_FILE

    def in_use(f: IO[str]) -> NoReturn:
        f.seek(0)
        holder = f.read().strip() or "unknown"
        raise OutputDirLockedError(
            f"--output-dir {out} is in use by another prefzoo train ({holder}; lock {path}): wait for it to "
            "finish, or give this run a different --output-dir"
        ) from None

    with file_lock(path, on_busy=in_use) as f:
        if f is not None:  # who holds it, for the message of a second run
            f.seek(0)
            f.truncate()
            f.write(f"pid {os.getpid()} on {os.uname().nodename}\n")
            f.flush()
        _held.add(key)
        try:
            yield
        finally:
            _held.discard(key)


@contextlib.contextmanager
def claim_output_dir(cfg: CheckpointSection) -> Iterator[None]:
    """Make ``cfg.output_dir`` this run's, before any work, for the block: a writable folder (every process), then
    on each node's local rank 0 its lock, no symbolic link where the run writes, and no other run's files (refused
    without ``cfg.resume``; deleted first with ``cfg.overwrite_output_dir``).  A process that holds the claim
    already (``prefzoo train``, then :func:`prefzoo.train.train`) goes on."""
    out = Path(cfg.output_dir)
    if os.path.abspath(out) in _held:
        yield
        return
    check_output_dir(out)
    with output_dir_lock(out):
        if _local_rank() == 0:
            _check_run_files(out, cfg)
        yield


def _check_run_files(out: Path, cfg: CheckpointSection) -> None:
    root = out / "checkpoints"
    inside = sorted(root.iterdir()) if root.is_dir() and not root.is_symlink() else []
    refuse_symlinks([*(out / name for name in RUN_FILES), *inside])
    if cfg.resume:
        return
    found = _trained_here(out, bool(inside))
    if found and not getattr(cfg, "overwrite_output_dir", False):
        shown = [n + "/" if (out / n).is_dir() else n for n in found if not n.startswith(".")] or found
        raise OutputDirHoldsRunError(
            f"--output-dir {out} holds a run already ({', '.join(shown)}): continue it with --resume auto, start "
            "over with --overwrite-output-dir (deletes that run's files), or give another --output-dir"
        )
    for name in RUN_FILES:  # that run's files; or what a run stopped before its first step left (it trained nothing)
        _remove(out / name)


def _trained_here(out: Path, checkpoints: bool) -> list[str]:
    """The names that show a run trained in ``out``: a checkpoint (complete or not), ``final/``, the finished
    marker, or a metrics.jsonl record of a step >= 1 (a run stopped before its first step logged only its
    evaluation at the start)."""
    from prefzoo.train.loop.metrics import last_step

    held = {
        "metrics.jsonl": last_step(out / "metrics.jsonl") >= 1,
        "checkpoints": checkpoints,
        "final": (out / "final").exists(),
        FINISHED_MARKER: (out / FINISHED_MARKER).exists(),
    }
    return [name for name, there in held.items() if there]


def _remove(path: Path) -> None:
    """Delete a file, or a folder renamed to a temp name first (a process on another node sharing the folder may
    delete it at the same time: one rename wins, the other finds nothing)."""
    if not path.is_dir():
        path.unlink(missing_ok=True)
        return
    gone = path.with_name(f".prefzoo-overwritten-{path.name}-{os.getpid()}")
    try:
        path.rename(gone)
    except FileNotFoundError:
        return
    shutil.rmtree(gone)


def finished_run(cfg: CheckpointSection, opt: OptimizationSection) -> dict[str, Any] | None:
    """The marker of the checkpoint ``cfg.resume`` points to when it ends a finished run with this length (``opt``'s
    ``max_steps`` and ``epochs``), else None.

    Finished means: the checkpoint is at the run's last step (``total_steps`` in its marker), the run length settings
    (``max_steps``, ``epochs``) are unchanged, and ``output_dir/final`` holds the model (its run card is written
    last).  A longer run asked for (a larger ``--max-steps``) is not finished: it resumes and trains on.
    """
    if not cfg.resume:
        return None
    path = find_latest_checkpoint(cfg.output_dir) if cfg.resume == "auto" else Path(cfg.resume)
    if path is None or not path.is_dir():
        return None
    try:
        info = read_marker(path)
    except ValueError:
        return None  # setup reports the broken checkpoint
    total = info.get("total_steps")
    same_length = info.get("max_steps") == opt.max_steps and info.get("epochs") == opt.epochs
    final = Path(cfg.output_dir) / "final"
    if total is None or int(info["step"]) < int(total) or not same_length:
        return None
    if not (final / "run_card.json").is_file() and _marked_step(cfg.output_dir) != int(info["step"]):
        return None
    return {**info, "checkpoint": str(path), "final": str(final)}


def mark_finished(output_dir: str | Path, step: int, final: Path | None) -> None:
    """Record on this node's disk that the run finished at ``step`` with its final model in ``final``."""
    import json

    path = Path(output_dir) / FINISHED_MARKER
    for stale in path.parent.glob(f"{path.name}.tmp*"):  # a write killed before its rename
        stale.unlink(missing_ok=True)
    tmp = path.with_name(f"{path.name}.tmp{os.getpid()}")
    write_text_nofollow(tmp, json.dumps({"step": step, "final": str(final)}), "x")
    os.replace(tmp, path)


def _marked_step(output_dir: str | Path) -> int | None:
    import json

    try:
        return int(json.loads((Path(output_dir) / FINISHED_MARKER).read_text())["step"])
    except (OSError, ValueError, KeyError, TypeError):
        return None
