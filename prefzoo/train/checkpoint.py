"""Atomic accelerate checkpoints: written to a temp folder, marked complete, then renamed; resume validation."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

__all__ = ["COMPLETE_MARKER", "ResumeError", "find_latest_checkpoint", "read_marker", "save_checkpoint"]

COMPLETE_MARKER = "prefzoo_checkpoint.json"  # written last inside the temp folder; its presence = complete


class ResumeError(ValueError):
    """A checkpoint cannot be resumed (missing, incomplete, or from a different loss/model)."""


def _checkpoint_root(output_dir: str | Path) -> Path:
    return Path(output_dir) / "checkpoints"


def save_checkpoint(accelerator: Any, output_dir: str | Path, step: int, info: dict[str, Any], keep: int) -> Path:
    """Save accelerate state for optimizer step ``step``; returns the final folder (never half-written)."""
    root = _checkpoint_root(output_dir)
    final = root / f"step-{step:08d}"
    tmp = root / f".tmp-step-{step:08d}"
    if accelerator.is_main_process:
        if tmp.exists():
            shutil.rmtree(tmp)
        tmp.mkdir(parents=True)
    accelerator.wait_for_everyone()
    accelerator.save_state(str(tmp))
    accelerator.wait_for_everyone()
    if accelerator.is_main_process:
        (tmp / COMPLETE_MARKER).write_text(json.dumps({**info, "step": step}, indent=1, default=str))
        if final.exists():
            shutil.rmtree(final)
        tmp.rename(final)  # atomic on one filesystem: 'final' is either absent or complete
        for old in _complete_checkpoints(root)[:-keep]:
            shutil.rmtree(old, ignore_errors=True)
    accelerator.wait_for_everyone()
    return final


def _complete_checkpoints(root: Path) -> list[Path]:
    if not root.is_dir():
        return []
    found = [p for p in root.iterdir() if p.name.startswith("step-") and (p / COMPLETE_MARKER).is_file()]
    return sorted(found, key=lambda p: p.name)


def find_latest_checkpoint(output_dir: str | Path) -> Path | None:
    """The latest complete checkpoint under ``output_dir/checkpoints`` (temp folders are ignored)."""
    found = _complete_checkpoints(_checkpoint_root(output_dir))
    return found[-1] if found else None


def read_marker(path: str | Path) -> dict[str, Any]:
    """The completion marker of checkpoint ``path``, or a ResumeError saying why it cannot be resumed."""
    p = Path(path)
    marker = p / COMPLETE_MARKER
    if not p.is_dir():
        raise ResumeError(f"--resume {path}: no such checkpoint folder")
    if not marker.is_file():
        raise ResumeError(f"--resume {path}: incomplete checkpoint (no {COMPLETE_MARKER}); resume from an earlier one")
    return dict(json.loads(marker.read_text()))
