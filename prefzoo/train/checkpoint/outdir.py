"""What a run checks about its ``--output-dir`` before it loads anything: another run using it, or a finished run.

* One run per output dir: the first process of each node (local rank 0) holds ``fcntl.flock`` on
  ``output_dir/.prefzoo-train.lock`` for the whole run; a second ``prefzoo train`` on the same folder stops at once
  with :class:`OutputDirLockedError` instead of interleaving checkpoints.  The OS drops the lock when the holder dies
  (even by ``kill -9``), so a stale lock file never blocks a resume.
* A finished run resumed (``--resume``) is reported by :func:`finished_run` and left untouched.  The final model is
  written once (node 0); each node's writer also leaves :data:`FINISHED_MARKER`, so a node whose disk is its own
  knows the run finished and returns with node 0 instead of waiting for it in a collective.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any, NoReturn

from prefzoo._filelock import file_lock
from prefzoo.train.checkpoint.save import find_latest_checkpoint, read_marker
from prefzoo.train.guard import TrainingAborted

__all__ = ["FINISHED_MARKER", "LOCK_FILE", "OutputDirLockedError", "finished_run", "mark_finished", "output_dir_lock"]

LOCK_FILE = ".prefzoo-train.lock"
FINISHED_MARKER = ".prefzoo-finished.json"  # {"step": N, "final": path}: written once the final model is complete


class OutputDirLockedError(TrainingAborted):
    """Another ``prefzoo train`` holds the lock of this ``--output-dir``."""


def _local_rank() -> int:
    return int(os.environ.get("LOCAL_RANK", "0") or 0)


@contextlib.contextmanager
def output_dir_lock(output_dir: str | Path) -> Iterator[None]:
    """Hold the output dir's lock for the block on each node's local rank 0 (other ranks and non-POSIX: no-op)."""
    if _local_rank() != 0:
        yield
        return
    out = Path(output_dir)
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
        yield


def finished_run(cfg: Any) -> dict[str, Any] | None:
    """The marker of the checkpoint ``cfg.resume`` points to when it ends a finished run with this length, else None.

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
    same_length = info.get("max_steps") == cfg.max_steps and info.get("epochs") == cfg.epochs
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
    tmp.write_text(json.dumps({"step": step, "final": str(final)}))
    os.replace(tmp, path)


def _marked_step(output_dir: str | Path) -> int | None:
    import json

    try:
        return int(json.loads((Path(output_dir) / FINISHED_MARKER).read_text())["step"])
    except (OSError, ValueError, KeyError, TypeError):
        return None
