"""Atomic accelerate checkpoints: written to a temp folder, fsynced, marked complete, renamed; resume validation.

A kill at any moment (even ``kill -9`` inside ``save_state``) leaves the newest *complete* checkpoint intact.  The
*writer* of a folder is global rank 0 when the output dir is shared, else each node's local rank 0 (node-local
disks, :mod:`prefzoo.train.checkpoint.nodes`); the save is two-phase across nodes:

1. every process writes its state into ``checkpoints/.tmp-step-N`` on its node (a name ``--resume auto`` never looks
   at): on node-local disks each node's local rank 0 writes the model and optimizer, every rank its RNG state;
2. each writer reads every file of its folder once, hashing and fsyncing it, then writes the completion marker
   ``prefzoo_checkpoint.json`` last, holding the run info and, for every file, its size and sha256
   (:mod:`prefzoo.train.checkpoint.verify`);
3. barrier: every node's folder is complete; each writer renames its folder to ``step-N`` (atomic on one
   filesystem) and fsyncs the parent folder; barrier;
4. only then are checkpoints beyond ``--save-total-limit`` deleted (rank 0 picks the steps, every writer deletes the
   same ones), oldest first, and stale ``.tmp-*`` folders of killed writes removed.

A checkpoint counts as complete only if its marker parses and every file of the manifest is present with its size;
it is resumed only if, besides, every file's sha256 matches (:func:`verify_checkpoint`, run before anything loads).
A full disk (ENOSPC) on any process during steps 1-3 removes the temp folder and stops the run on every process with
:class:`DiskFullError` (path, space needed, space free); the previous checkpoint stays the newest complete one.  The
disk is full also when torch or safetensors say so in their own errors (``RuntimeError: ... unexpected pos``,
``SafetensorError: ... No space left on device``): such an error is checked against the disk itself.
"""

from __future__ import annotations

import contextlib
import errno
import json
import logging
import os
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

from prefzoo.train.checkpoint.verify import Verdict, digest_folder, verify_files
from prefzoo.train.errors import TrainingAborted

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
    "verify_checkpoint",
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
    ``before_marker(tmp_folder)`` runs on the main process once the state files are written, before they are hashed
    and the marker is written (the files it adds are hashed with them).
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
    full = _enospc(lambda: _save_state(accelerator, tmp, write, save_shards), tmp)
    if _any_process(accelerator, full is not None):
        raise _disk_full(accelerator, output_dir, step, tmp, full, writer)
    full = None
    if writer:
        hook = before_marker if accelerator.is_main_process else None
        full = _enospc(lambda: _seal(tmp, step, info, hook), tmp)
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
    """A writer: the main process's extra files, then every file hashed and fsynced, the completion marker last."""
    if before_marker is not None:
        before_marker(tmp)  # the callbacks' on_save_files (tests kill -9 here: state written, no marker yet)
    sizes, digests = digest_folder(tmp, COMPLETE_MARKER)  # each file read once: its sha256, then fsync
    marker = tmp / COMPLETE_MARKER
    marker.write_text(json.dumps({**info, "step": step, "files": sizes, "sha256": digests}, indent=1, default=str))
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


def _enospc(write: Callable[[], None], folder: Path | None = None) -> OSError | None:
    """Run ``write``; a full disk is returned (so every process can agree on it), any other error raises.

    torch and safetensors report a full disk in errors of their own (``RuntimeError: [enforce fail at
    inline_container.cc] . unexpected pos ...``, ``SafetensorError: ... No space left on device (os error 28)``):
    an error that is not an OSError counts as a full disk when it says so, or when ``folder`` (where ``write``
    writes) then refuses a small write with ENOSPC or EDQUOT.
    """
    try:
        write()
    except OSError as e:
        if e.errno not in (errno.ENOSPC, errno.EDQUOT):
            raise
        return e
    except TrainingAborted:
        raise  # a stop on purpose (e.g. non-finite weights refused), not a write that failed
    except Exception as e:  # re-raised unless the disk is full
        if not (_says_disk_full(e) or (folder is not None and _refuses_writes(folder))):
            raise
        first = (str(e).strip().splitlines() or [type(e).__name__])[0][:200]
        return OSError(errno.ENOSPC, f"{os.strerror(errno.ENOSPC)} ({type(e).__name__}: {first})")
    return None


_FULL_DISK_WORDS = (os.strerror(errno.ENOSPC), os.strerror(errno.EDQUOT), "No space left on device",
                    "Disk quota exceeded", f"os error {errno.ENOSPC}", f"os error {errno.EDQUOT}")  # fmt: skip


def _says_disk_full(e: BaseException) -> bool:
    text = str(e)
    return any(w in text for w in _FULL_DISK_WORDS)


def _refuses_writes(folder: Path, probe_bytes: int = 1 << 20) -> bool:
    """Whether writing and fsyncing ``probe_bytes`` in ``folder`` fails with ENOSPC or EDQUOT (the probe is removed)."""
    probe = folder / f".prefzoo-space-probe-{os.getpid()}"
    try:
        fd = os.open(probe, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | getattr(os, "O_NOFOLLOW", 0), 0o600)
        try:
            os.write(fd, b"\0" * probe_bytes)
            os.fsync(fd)
        finally:
            os.close(fd)
    except OSError as e:
        return e.errno in (errno.ENOSPC, errno.EDQUOT)
    finally:
        with contextlib.suppress(OSError):
            probe.unlink()
    return False


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


def verify_checkpoint(path: str | Path) -> Verdict:
    """Whether checkpoint ``path`` holds exactly the files its marker lists, each with its recorded size and sha256
    (:func:`prefzoo.train.checkpoint.verify.verify_files`); reads every file once."""
    p = Path(path)
    try:
        marker = json.loads((p / COMPLETE_MARKER).read_text())
    except OSError:
        return Verdict(False, False, f"{COMPLETE_MARKER} is missing (the write never finished)")
    except ValueError:
        return Verdict(False, False, f"{COMPLETE_MARKER} is not valid JSON")
    if not isinstance(marker, dict):
        return Verdict(False, False, f"{COMPLETE_MARKER} is not a JSON object")
    return verify_files(p, marker, COMPLETE_MARKER)
