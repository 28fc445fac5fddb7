"""Resuming: the checkpoint every rank resumes from, checked against this run, and its state loaded."""

from __future__ import annotations

import pickle
from pathlib import Path
from typing import Any

from prefzoo.errors import ConfigError
from prefzoo.train.checkpoint.nodes import Storage, agree_on_resume
from prefzoo.train.checkpoint.save import ResumeError, read_marker
from prefzoo.train.checkpoint.state import load_loss_state, restore_rng

__all__ = ["check_resumable", "load_resumed_state", "resume_point"]


def resume_point(cfg: Any, accelerator: Any, storage: Storage) -> tuple[Path | None, dict[str, Any]]:
    """(the checkpoint every rank resumes from, its marker), the same step on all (see
    :mod:`prefzoo.train.checkpoint.nodes`), checked against ``cfg``; (None, {}) for a fresh start."""
    path = agree_on_resume(accelerator, storage, cfg.output_dir, cfg.resume)
    if path is None:
        return None, {}  # 'auto' with nothing saved yet: a fresh start
    info = read_marker(path)
    if info.get("model_only"):
        raise ResumeError(
            f"--resume {path}: this checkpoint was saved with --save-only-model (weights only, no optimizer, "
            f"scheduler or data position), so it cannot be resumed; start a new run from it with --model {path}"
        )
    same_mods = info.get("modifiers", []) == [str(m) for m in cfg.modifiers]
    if (not same_mods or info.get("loss") != cfg.loss
            or info.get("loss_params") != {k: str(v) for k, v in cfg.loss_params.items()}):  # fmt: skip
        raise ResumeError(
            f"--resume {path}: checkpoint was trained with loss {info.get('loss')!r} {info.get('loss_params')}, "
            f"this run asks for {cfg.loss!r} {cfg.loss_params}; use the same loss or a new --output-dir"
        )
    return path, info


def check_resumable(path: Path, saved: dict[str, Any], run: dict[str, Any], batch_coupled: bool) -> None:
    """Whether a checkpoint (its marker ``saved``) resumes in this run (``run``: its marker fields): one line before
    the model loads naming what differs and the way out.

    The position in the data is counted in optimizer steps, so the examples per step (processes × per-device batch ×
    accumulation) must match; a batch-coupled loss also needs the same examples per micro-batch.  The processes and
    the engine may change where the checkpoint's format allows (:mod:`prefzoo.train.engines.dcp`).
    """
    if "seed" in saved and saved["seed"] != run["seed"]:
        raise ResumeError(f"--resume {path}: checkpoint used seed {saved['seed']}, this run {run['seed']}; use the "
                          "same --seed (or start a new --output-dir)")  # fmt: skip
    _check_batch(path, saved.get("batch"), run["batch"], batch_coupled)
    from prefzoo.train.engines import resume_refusal

    refusal = resume_refusal(saved, run)
    if refusal:
        raise ResumeError(f"--resume {path}: {refusal}")


def _check_batch(path: Path, was: list[int] | None, now: list[int], batch_coupled: bool) -> None:
    if not was or was == now:
        return
    (p0, b0, a0), (p1, b1, a1) = was, now
    if p0 * b0 * a0 != p1 * b1 * a1:
        raise ResumeError(
            f"--resume {path}: checkpoint trained {p0 * b0 * a0} examples per step ({p0} processes × {b0} per device "
            f"× {a0} accumulation), this run {p1 * b1 * a1} ({p1} × {b1} × {a1}); choose --per-device-batch-size and "
            f"--grad-accum so that processes × per-device batch × accumulation = {p0 * b0 * a0}"
        )
    if batch_coupled and p0 * b0 != p1 * b1:
        raise ResumeError(
            f"--resume {path}: this loss couples the examples of a micro-batch across processes, and the checkpoint's "
            f"had {p0 * b0} ({p0} × {b0}), this run's {p1 * b1} ({p1} × {b1}); keep processes × per-device batch = "
            f"{p0 * b0} (--grad-accum {a0})"
        )


def load_resumed_state(
    accelerator: Any, engine: Any, policy: Any, optimizer: Any, path: Path, loss: Any = None,
    saved_processes: int | None = None,
) -> None:  # fmt: skip
    """The checkpoint's state through the engine (:meth:`prefzoo.train.engines.Engine.load_state`: accelerate's
    files, safetensors and ``torch.load(weights_only=True)`` only, and the model and optimizer in whichever form
    they were saved), then this rank's random state (of ``saved_processes``, the checkpoint's) and a stateful
    ``loss``'s state (:mod:`prefzoo.train.checkpoint.state`); unreadable files are one line naming the checkpoint."""
    try:
        engine.load_state(accelerator, policy, optimizer, path)
        restore_rng(path, accelerator, saved_processes)
        load_loss_state(loss, path)
    except (ResumeError, ConfigError):
        raise
    except (pickle.UnpicklingError, EOFError, RuntimeError, ValueError, OSError) as e:
        first = str(e).strip().splitlines()[0][:300] if str(e).strip() else type(e).__name__
        raise ResumeError(
            f"--resume {path}: the checkpoint's state files cannot be loaded ({type(e).__name__}: {first}); prefzoo "
            "reads only safetensors and torch.load(weights_only=True) data, so pickled objects are refused. Resume "
            "from another checkpoint"
        ) from e
