"""Resuming: the checkpoint every rank resumes from, checked against this run, and its state loaded."""

from __future__ import annotations

import dataclasses
import pickle
from pathlib import Path
from typing import TYPE_CHECKING, Any

from prefzoo._attrs import field_defaults
from prefzoo.errors import ConfigError
from prefzoo.train.checkpoint.final import loss_params
from prefzoo.train.checkpoint.nodes import Storage, agree_on_resume
from prefzoo.train.checkpoint.save import ResumeError, read_marker
from prefzoo.train.checkpoint.state import load_loss_state, restore_rng

if TYPE_CHECKING:
    from prefzoo.train.config.sections import CheckpointSection, LossSection, OptimizationSection

__all__ = ["batch_fits", "check_resumable", "fit_batch_to_checkpoint", "load_resumed_state", "resume_point"]


def resume_point(
    ckpt: CheckpointSection, cfg: LossSection, accelerator: Any, storage: Storage, loss: Any
) -> tuple[Path | None, dict[str, Any]]:
    """(the checkpoint every rank resumes from, its marker), the same step on all (see
    :mod:`prefzoo.train.checkpoint.nodes`), checked against the run's loss settings ``cfg`` and its ``loss`` (its
    effective parameters, defaults included, are compared); (None, {}) for a fresh start."""
    path = agree_on_resume(accelerator, storage, ckpt.output_dir, ckpt.resume)
    if path is None:
        return None, {}  # 'auto' with nothing saved yet: a fresh start
    info = read_marker(path)
    if info.get("model_only"):
        raise ResumeError(
            f"--resume {path}: this checkpoint was saved with --save-only-model (weights only, no optimizer, "
            f"scheduler or data position), so it cannot be resumed; start a new run from it with --model {path}"
        )
    same_mods = info.get("modifiers", []) == [str(m) for m in cfg.modifiers]
    if not same_mods or info.get("loss") != cfg.loss:
        raise ResumeError(
            f"--resume {path}: checkpoint was trained with loss {info.get('loss')!r} {info.get('loss_params')}, "
            f"this run asks for {cfg.loss!r} {cfg.loss_params}; use the same loss or a new --output-dir"
        )
    differ = _differing_params(info.get("loss_params") or {}, loss)
    if differ:
        was = ", ".join(f"{k}={v[0]}" for k, v in differ.items())
        now = ", ".join(f"{k}={v[1]}" for k, v in differ.items())
        raise ResumeError(
            f"--resume {path}: checkpoint was trained with loss {cfg.loss!r} {was}, this run has {now} (defaults "
            "included); give the same --loss-param values or use a new --output-dir"
        )
    return path, info


def _differing_params(saved: dict[str, Any], loss: Any) -> dict[str, tuple[str, str]]:
    """{name: (checkpoint's, this run's)} for each parameter of the run's ``loss`` whose effective value differs,
    compared as text.

    A marker records every parameter with the value the run used; one written before that records only those set
    on the command line (as text), the others being the defaults of the loss's params class.
    """
    now = {k: str(v) for k, v in loss_params(loss).items()}
    was = {**{k: str(v) for k, v in _default_params(loss).items()}, **{k: str(v) for k, v in saved.items()}}
    names = sorted(set(was) | set(now))
    return {k: (was.get(k, "unset"), now.get(k, "unset")) for k in names if was.get(k) != now.get(k)}


def _default_params(loss: Any) -> dict[str, Any]:
    """The defaults of the loss's params class, read from its fields (a parameter without one is left out: only
    what the marker lists is compared for it)."""
    params = getattr(loss, "params", None)
    if params is None or not dataclasses.is_dataclass(params):
        return {}
    return field_defaults(type(params))


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


def batch_fits(was: list[int], processes: int, batch_coupled: bool) -> list[tuple[int, int]]:
    """The (per-device batch, accumulation) pairs that keep a checkpoint's examples per step (``was``: its
    [processes, per-device batch, accumulation]) on ``processes`` processes, its per-device batch kept first; a
    batch-coupled loss also keeps the examples per micro-batch, so it has at most one."""
    p0, b0, a0 = was
    total = p0 * b0 * a0
    if batch_coupled:
        return [(p0 * b0 // processes, a0)] if (p0 * b0) % processes == 0 else []
    fits = [(b0, total // (processes * b0))] if total % (processes * b0) == 0 else []
    if total % (processes * a0) == 0 and (total // (processes * a0), a0) not in fits:
        fits.append((total // (processes * a0), a0))
    return fits


def fit_batch_to_checkpoint(
    cfg: OptimizationSection, chosen: bool, saved: dict[str, Any], processes: int, batch_coupled: bool
) -> str | None:
    """A checkpoint resumed on another number of processes, with neither --per-device-batch-size nor --grad-accum
    given (``chosen``: one was): set the pair in ``cfg`` that keeps its examples per step (:func:`batch_fits`, the
    first one) and return the line that says so; None when nothing changed (the same examples per step, a flag
    given, or no pair fits)."""
    was = saved.get("batch")
    if not was or chosen:
        return None
    p0, b0, a0 = was
    now = (processes, cfg.per_device_batch_size, cfg.grad_accum)
    if p0 * b0 * a0 == processes * now[1] * now[2] and (not batch_coupled or p0 * b0 == processes * now[1]):
        return None
    fits = batch_fits(was, processes, batch_coupled)
    if not fits:
        return None
    cfg.per_device_batch_size, cfg.grad_accum = fits[0]
    return (
        f"resuming a checkpoint of {p0} processes × {b0} per device × {a0} accumulation = {p0 * b0 * a0} examples "
        f"per step on {processes} process{'es' if processes > 1 else ''}: --per-device-batch-size "
        f"{cfg.per_device_batch_size} --grad-accum {cfg.grad_accum} keep them (set either flag to choose otherwise)"
    )


def _flags(fits: list[tuple[int, int]]) -> str:
    return " or ".join(f"--per-device-batch-size {b} --grad-accum {a}" for b, a in fits)


def _check_batch(path: Path, was: list[int] | None, now: list[int], batch_coupled: bool) -> None:
    if not was or was == now:
        return
    (p0, b0, a0), (p1, b1, a1) = was, now
    fits = batch_fits(was, p1, batch_coupled)
    if p0 * b0 * a0 != p1 * b1 * a1:
        way = f"set {_flags(fits)}" if fits else f"resume on {p0} processes (no whole per-device batch fits)"
        raise ResumeError(
            f"--resume {path}: checkpoint trained {p0 * b0 * a0} examples per step ({p0} processes × {b0} per device "
            f"× {a0} accumulation), this run {p1 * b1 * a1} ({p1} × {b1} × {a1}); {way}, so that processes × "
            f"per-device batch × accumulation = {p0 * b0 * a0}"
        )
    if batch_coupled and p0 * b0 != p1 * b1:
        way = f"set {_flags(fits)}" if fits else f"resume on {p0} processes"
        raise ResumeError(
            f"--resume {path}: this loss couples the examples of a micro-batch across processes, and the checkpoint's "
            f"had {p0 * b0} ({p0} × {b0}), this run's {p1 * b1} ({p1} × {b1}); keep processes × per-device batch = "
            f"{p0 * b0}: {way}"
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
