"""Atomic accelerate checkpoints: written to a temp folder, fsynced, marked complete, renamed; resume validation.

A kill at any moment (even ``kill -9`` inside ``save_state``) leaves the newest *complete* checkpoint intact.  The
*writer* of a folder is global rank 0 when the output dir is shared, else each node's local rank 0 (node-local
disks, :mod:`prefzoo.train.checkpoint.nodes`); the save is two-phase across nodes:

1. every process writes its state into ``checkpoints/.tmp-step-N`` on its node (a name ``--resume auto`` never looks
   at): on node-local disks each node's local rank 0 writes the model and optimizer, every rank its RNG state;
2. each writer fsyncs those files, then writes the completion marker ``prefzoo_checkpoint.json`` last, holding the
   run info and a manifest (relative path -> size) of every file of its folder;
3. barrier: every node's folder is complete; each writer renames its folder to ``step-N`` (atomic on one
   filesystem) and fsyncs the parent folder; barrier;
4. only then are checkpoints beyond ``--save-total-limit`` deleted (rank 0 picks the steps, every writer deletes the
   same ones), oldest first, and stale ``.tmp-*`` folders of killed writes removed.

A checkpoint counts as complete only if its marker parses and every file of the manifest is present with its size.
A full disk (ENOSPC) on any process during steps 1-3 removes the temp folder and stops the run on every process with
:class:`DiskFullError` (path, space needed, space free); the previous checkpoint stays the newest complete one.
"""

from __future__ import annotations

import errno
import json
import logging
import os
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

from prefzoo.train.guard import TrainingAborted

__all__ = [
    "COMPLETE_MARKER",
    "DiskFullError",
    "ResumeError",
    "checkpoint_step",
    "complete_checkpoints",
    "find_latest_checkpoint",
    "is_complete",
    "read_marker",
    "save_checkpoint",
]

log = logging.getLogger(__name__)

COMPLETE_MARKER = "prefzoo_checkpoint.json"  # written last inside the temp folder; its presence = complete


class ResumeError(ValueError):
    """A checkpoint cannot be resumed (missing, incomplete, or from a different loss/model)."""


class DiskFullError(TrainingAborted):
    """The disk filled up (ENOSPC) while a checkpoint was written; the message names the path and the space needed."""


def _checkpoint_root(output_dir: str | Path) -> Path:
    return Path(output_dir) / "checkpoints"


def _fsync(path: Path) -> None:
    """Flush a file's (or a folder's entries') data to disk; best effort where the OS refuses folders."""
    try:
        fd = os.open(str(path), os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def _manifest(folder: Path) -> dict[str, int]:
    return {
        str(p.relative_to(folder)): p.stat().st_size
        for p in sorted(folder.rglob("*"))
        if p.is_file() and p.name != COMPLETE_MARKER
    }


def save_checkpoint(
    accelerator: Any,
    output_dir: str | Path,
    step: int,
    info: dict[str, Any],
    keep: int,
    before_marker: Callable[[Path], None] | None = None,
    node_local: bool = False,
    write: Callable[[Path], None] | None = None,
    save_shards: Callable[[Path], None] | None = None,
) -> Path:
    """Save accelerate state for optimizer step ``step``; returns the final folder (never half-written).

    ``node_local``: every node has its own ``output_dir`` (each node's local rank 0 writes a complete folder).
    ``before_marker(tmp_folder)`` runs on the main process once the state files are fsynced, before the marker.
    ``write(tmp_folder)`` (called on every process) replaces ``accelerator.save_state`` (``--save-only-model``).
    ``save_shards(tmp_folder)`` runs on every process after accelerate's state: what accelerate does not save (an
    engine's model and optimizer shards, :meth:`prefzoo.train.engines.Engine.save_shards`; the density-ratio
    classifier), each rank its own files in its node's folder; they are fsynced and listed in the manifest with
    accelerate's.
    """
    root = _checkpoint_root(output_dir)
    final = root / f"step-{step:08d}"
    tmp = root / f".tmp-step-{step:08d}"
    writer = accelerator.is_local_main_process if node_local else accelerator.is_main_process
    if writer:
        if tmp.exists():
            shutil.rmtree(tmp)
        tmp.mkdir(parents=True)
    accelerator.wait_for_everyone()
    full = _enospc(lambda: _save_state(accelerator, tmp, write, save_shards))
    if _any_process(accelerator, full is not None):
        raise _disk_full(accelerator, output_dir, step, tmp, full, writer)
    full = None
    if writer:
        hook = before_marker if accelerator.is_main_process else None
        full = _enospc(lambda: _seal(tmp, step, info, hook))
    if _any_process(accelerator, full is not None):  # phase 1 done: every node's folder is complete, or none renames
        raise _disk_full(accelerator, output_dir, step, tmp, full, writer)
    if writer:
        _rename(tmp, final, root)
    accelerator.wait_for_everyone()  # phase 2 done: step-N exists on every node
    doomed = [p.name for p in complete_checkpoints(output_dir)[:-keep]] if accelerator.is_main_process else None
    if accelerator.num_processes > 1:
        from accelerate.utils import broadcast_object_list

        doomed = broadcast_object_list([doomed])[0]  # rank 0's choice: every node prunes the same steps
    if writer:
        _prune(root, doomed or [], step)
    accelerator.wait_for_everyone()
    return final


def _prune(root: Path, doomed: list[str], step: int) -> None:
    """Delete the checkpoints beyond the limit, each renamed to a temp name first (a kill inside the delete leaves a
    ``.tmp-step-*`` folder, never a half-deleted ``step-N``), then what killed writes and deletes left: temp folders,
    and incomplete ``step-N`` folders older than ``step`` (never resumed)."""
    for name in doomed:
        gone = root / f".tmp-step-pruned-{name}"
        try:
            (root / name).rename(gone)
        except OSError:
            continue
        shutil.rmtree(gone, ignore_errors=True)
    older = [p for p in root.glob("step-*") if p.name[5:].isdigit() and checkpoint_step(p) < step]
    stale = [*root.glob(".tmp-step-*"), *older]
    for folder in stale:
        if folder.name.startswith(".tmp-") or not is_complete(folder):
            shutil.rmtree(folder, ignore_errors=True)


def _save_state(
    accelerator: Any, tmp: Path, write: Callable[[Path], None] | None, save_shards: Callable[[Path], None] | None
) -> None:
    if write is not None:
        write(tmp)
    else:
        accelerator.save_state(str(tmp))
    if save_shards is not None:
        save_shards(tmp)


def _seal(tmp: Path, step: int, info: dict[str, Any], before_marker: Callable[[Path], None] | None) -> None:
    """A writer: fsync the state files, write the completion marker last."""
    manifest = _manifest(tmp)
    for rel in manifest:
        _fsync(tmp / rel)
    if before_marker is not None:
        before_marker(tmp)  # the callbacks' on_save_files (tests kill -9 here: state written, no marker yet)
    marker = tmp / COMPLETE_MARKER
    marker.write_text(json.dumps({**info, "step": step, "files": manifest}, indent=1, default=str))
    _fsync(marker)
    _fsync(tmp)


def _rename(tmp: Path, final: Path, root: Path) -> None:
    """A writer: move the sealed folder into place (atomic on one filesystem: 'final' is either absent or complete)."""
    _move_into_place(tmp, final)
    _fsync(root)


def _move_into_place(tmp: Path, final: Path) -> None:
    """Rename the finished folder ``tmp`` to ``final``, removing an older ``final`` first (a symbolic link there: the
    link itself, never what it points to)."""
    if final.is_symlink():
        final.unlink()
    elif final.exists():
        shutil.rmtree(final)
    tmp.rename(final)


def _enospc(write: Callable[[], None]) -> OSError | None:
    """Run ``write``; a full disk is returned (so every process can agree on it), any other error raises."""
    try:
        write()
    except OSError as e:
        if e.errno not in (errno.ENOSPC, errno.EDQUOT):
            raise
        return e
    return None


def _any_process(accelerator: Any, flag: bool) -> bool:
    """``flag`` or-ed over processes (one tiny all-reduce when there are several)."""
    if accelerator.num_processes == 1:
        return flag
    import torch

    return bool(accelerator.reduce(torch.tensor([float(flag)], device=accelerator.device), "sum").item() > 0)


def _bytes(folder: Path | None) -> int:
    if folder is None or not folder.is_dir():
        return 0
    return sum(p.stat().st_size for p in folder.rglob("*") if p.is_file())


def _measure_and_remove(accelerator: Any, tmp: Path, writer: bool) -> int:
    """Bytes in the partial folder ``tmp``, measured on every process; then, after a barrier, its writer removes it
    (without the barrier a process still walking the folder meets the removal)."""
    written = _bytes(tmp)
    accelerator.wait_for_everyone()
    if writer:
        shutil.rmtree(tmp, ignore_errors=True)
    return written


def free_and_where(tmp: Path, err: OSError | None) -> tuple[int, Path | str]:
    """(bytes free beside ``tmp``, the file the full disk refused, else ``tmp``) for a disk-full message."""
    return shutil.disk_usage(tmp.parent).free, (err.filename if err is not None and err.filename else None) or tmp


def _disk_full(
    accelerator: Any, output_dir: str | Path, step: int, tmp: Path, err: OSError | None, writer: bool
) -> DiskFullError:
    """Remove the half-written folder and say what is kept, how much space a checkpoint needs, and how to go on."""
    latest = find_latest_checkpoint(output_dir)
    written = _measure_and_remove(accelerator, tmp, writer)
    needed = max(_bytes(latest), written)  # the previous checkpoint's size; at least what this one had written
    free, where = free_and_where(tmp, err)
    kept = f"the newest complete checkpoint {latest} is kept" if latest else "no earlier checkpoint exists"
    return DiskFullError(
        f"disk full (ENOSPC) writing checkpoint {step} at {where}: a checkpoint needs about {needed / 1e6:.1f} MB, "
        f"{free / 1e6:.1f} MB are free in {tmp.parent}; the partial folder was removed and {kept}. Free space (or "
        "lower --save-total-limit, or use an --output-dir on a larger disk) and rerun with --resume auto"
    )


def is_complete(path: str | Path) -> bool:
    """Whether ``path`` holds a parseable marker and every file its manifest lists, with the listed sizes."""
    p = Path(path)
    try:
        info = json.loads((p / COMPLETE_MARKER).read_text())
    except (OSError, ValueError):
        return False
    files = info.get("files") if isinstance(info, dict) else None
    if not isinstance(files, dict):
        return isinstance(info, dict)  # a marker from before manifests: trust its presence
    for rel, size in files.items():
        f = p / rel
        if not f.is_file() or f.stat().st_size != size:
            log.warning("checkpoint %s is incomplete: %s is missing or has the wrong size", p, rel)
            return False
    return True


def complete_checkpoints(output_dir: str | Path) -> list[Path]:
    """Complete checkpoints under ``output_dir/checkpoints``, oldest first."""
    root = _checkpoint_root(output_dir)
    if not root.is_dir():
        return []
    found = [p for p in root.iterdir() if p.name.startswith("step-") and is_complete(p)]
    return sorted(found, key=lambda p: p.name)


def checkpoint_step(checkpoint: Path) -> int:
    """The optimizer step a checkpoint folder was saved at, from its name (``step-00000016`` → 16)."""
    return int(checkpoint.name.rsplit("-", 1)[-1])


def find_latest_checkpoint(output_dir: str | Path) -> Path | None:
    """The latest complete checkpoint under ``output_dir/checkpoints`` (temp and incomplete folders are skipped)."""
    found = complete_checkpoints(output_dir)
    return found[-1] if found else None


def read_marker(path: str | Path) -> dict[str, Any]:
    """The completion marker of checkpoint ``path``, or a ResumeError saying why it cannot be resumed."""
    p = Path(path)
    marker = p / COMPLETE_MARKER
    if not p.is_dir():
        raise ResumeError(f"--resume {path}: no such checkpoint folder")
    if not marker.is_file():
        raise ResumeError(f"--resume {path}: incomplete checkpoint (no {COMPLETE_MARKER}); resume from an earlier one")
    if not is_complete(p):
        raise ResumeError(
            f"--resume {path}: incomplete or corrupt checkpoint ({COMPLETE_MARKER} unreadable, or a file it lists is "
            "missing or truncated); resume from an earlier one (--resume auto picks the newest complete one)"
        )
    return dict(json.loads(marker.read_text()))
