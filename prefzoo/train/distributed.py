"""The accelerate side: building the Accelerator (DDP, DeepSpeed ZeRO-2/3, CPU/gloo) and a rank-ordered gather."""

from __future__ import annotations

import importlib
import json
import os
import socket
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

__all__ = ["DeepSpeedMissingError", "build_accelerator", "deepspeed_config", "end_accelerator", "make_gather"]


class DeepSpeedMissingError(RuntimeError):
    """``--deepspeed`` was given but deepspeed is not importable."""


def make_gather(accelerator: Any) -> Callable[[Tensor], Tensor]:
    """``gather(t)``: concatenation of ``t`` (dim 0, any per-rank length) over processes in rank order.

    gloo refuses uneven all_gathers, so sizes are gathered first, every rank pads to the largest, and the padding is
    trimmed afterwards.  Not differentiable (losses only gather detached tensors).
    """
    if accelerator.num_processes == 1:
        return lambda t: t

    def gather(t: Tensor) -> Tensor:
        t = t.detach().contiguous()
        sizes = accelerator.gather(torch.tensor([t.shape[0]], device=t.device)).tolist()  # (P,)
        padded = accelerator.pad_across_processes(t, dim=0)  # (max_size, ...)
        allt = accelerator.gather(padded)  # (P·max_size, ...)
        m = max(sizes)
        return torch.cat([allt[r * m : r * m + n] for r, n in enumerate(sizes)], dim=0)

    return gather


def deepspeed_config(
    spec: str, per_device_batch_size: int, grad_accum: int, max_grad_norm: float, mixed_precision: str
) -> dict[str, Any]:
    """A DeepSpeed config dict from ``zero2``, ``zero3`` or a JSON file path (its batch keys filled in)."""
    if spec in ("zero2", "zero3"):
        cfg: dict[str, Any] = {
            "zero_optimization": {"stage": int(spec[-1]), "overlap_comm": False, "contiguous_gradients": True},
            "zero_allow_untested_optimizer": True,  # the optimizer is ours (torch AdamW or bitsandbytes AdamW8bit)
        }
        if spec == "zero3":
            cfg["zero_optimization"].update({"stage3_gather_16bit_weights_on_model_save": True})
    else:
        cfg = _user_deepspeed_config(spec)
    cfg["train_micro_batch_size_per_gpu"] = per_device_batch_size
    cfg["gradient_accumulation_steps"] = grad_accum
    cfg.setdefault("gradient_clipping", max_grad_norm)
    cfg.setdefault("steps_per_print", 10**9)
    cfg.setdefault("bf16", {"enabled": mixed_precision == "bf16"})
    cfg.setdefault("fp16", {"enabled": mixed_precision == "fp16"})
    cfg.pop("train_batch_size", None)
    return cfg


def _user_deepspeed_config(spec: str) -> dict[str, Any]:
    """A user's DeepSpeed JSON, checked before anything loads: ZeRO-3 must gather 16-bit weights on save, since the
    final model is written with ``save_pretrained`` from gathered weights (without it the run trains, then fails)."""
    from prefzoo.train.config import ConfigError

    path = Path(spec)
    if not path.is_file():
        raise FileNotFoundError(f"--deepspeed {spec}: choose zero2, zero3 or an existing JSON config file")
    try:
        cfg = json.loads(path.read_text())
    except json.JSONDecodeError as e:
        raise ConfigError(f"--deepspeed {spec}: not valid JSON ({e.msg} at line {e.lineno}); fix the file") from None
    zero = cfg.get("zero_optimization") if isinstance(cfg, dict) else None
    if not isinstance(cfg, dict) or not isinstance(zero or {}, dict):
        raise ConfigError(f"--deepspeed {spec}: expected a JSON object with a 'zero_optimization' object")
    if zero and zero.get("stage") == 3:
        key = "stage3_gather_16bit_weights_on_model_save"
        if zero.get(key) is False:
            raise ConfigError(
                f"--deepspeed {spec}: zero_optimization.{key} is false, so the final model could not be saved after "
                "training; set it to true (or remove it: prefzoo sets it)"
            )
        zero[key] = True  # absent: what the zero3 preset sets; the final save needs it
    return cfg


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _prepare_deepspeed_on_cpu() -> None:
    """DeepSpeed without a GPU: CPU accelerator, skip the JIT shared-memory op build, single-process env vars."""
    os.environ.setdefault("DS_ACCELERATOR", "cpu")
    try:
        comm: Any = importlib.import_module("deepspeed.comm.torch")
        comm.build_shm_op = lambda: None  # identical results, no 40 s build
    except Exception:  # older/newer deepspeed without it: nothing to skip
        pass
    if "RANK" not in os.environ:  # plain `python`, not a launcher: a one-process group
        os.environ.update(
            RANK="0",
            LOCAL_RANK="0",
            WORLD_SIZE="1",
            LOCAL_WORLD_SIZE="1",
            MASTER_ADDR="127.0.0.1",
            MASTER_PORT=str(_free_port()),
        )


def _refuse_ignored_fsdp(cfg: Any, no_gpu: bool) -> None:
    """``accelerate launch --use_fsdp`` where accelerate would quietly run something else: one line, not silent DDP."""
    if os.environ.get("ACCELERATE_USE_FSDP", "").lower() not in ("1", "true", "yes"):
        return
    from prefzoo.train.config import ConfigError

    if cfg.deepspeed:
        raise ConfigError(
            f"accelerate launch --use_fsdp together with --deepspeed {cfg.deepspeed}: choose one sharding engine "
            "(drop --use_fsdp, or drop --deepspeed)"
        )
    if no_gpu:
        raise ConfigError(
            "accelerate launch --use_fsdp (ACCELERATE_USE_FSDP=true): without a GPU accelerate ignores FSDP and would "
            "run plain DDP, every process holding the whole model; drop --use_fsdp to train with DDP, or shard on CPU "
            "with prefzoo's own FSDP2 engine (--fsdp) or --deepspeed zero3"
        )


def build_accelerator(cfg: Any, log_with: list[str] | None, project_dir: str) -> Any:
    """An Accelerator for ``cfg`` (a TrainConfig): processes, accumulation, precision, DeepSpeed, trackers."""
    from accelerate import Accelerator
    from accelerate.state import AcceleratorState, GradientState
    from accelerate.utils import DataLoaderConfiguration, InitProcessGroupKwargs, ProjectConfiguration

    kwargs: dict[str, Any] = {
        "gradient_accumulation_steps": cfg.grad_accum,
        "mixed_precision": cfg.mixed_precision,
        "dataloader_config": DataLoaderConfiguration(use_seedable_sampler=True, data_seed=cfg.seed),
        "step_scheduler_with_optimizer": False,  # we step the schedule once per optimizer step ourselves
        "log_with": log_with,
        "project_config": ProjectConfiguration(project_dir=project_dir, logging_dir=str(Path(project_dir) / "tb")),
    }
    no_gpu = cfg.cpu or not torch.cuda.is_available()
    _refuse_ignored_fsdp(cfg, no_gpu)
    # a collective that waits longer than this for a dead or hung peer fails (the loop turns it into a message)
    timeout = timedelta(seconds=float(getattr(cfg, "dist_timeout", 1800.0)))
    if cfg.deepspeed:
        try:
            import deepspeed  # noqa: F401
        except ImportError:
            raise DeepSpeedMissingError(
                f"--deepspeed {cfg.deepspeed} needs deepspeed: pip install 'prefzoo[deepspeed]'"
            ) from None
        from accelerate.utils import DeepSpeedPlugin

        if no_gpu:
            _prepare_deepspeed_on_cpu()
            kwargs["kwargs_handlers"] = [InitProcessGroupKwargs(backend="gloo", timeout=timeout)]
        ds_cfg = deepspeed_config(
            cfg.deepspeed, cfg.per_device_batch_size, cfg.grad_accum, cfg.max_grad_norm, cfg.mixed_precision
        )
        kwargs["deepspeed_plugin"] = DeepSpeedPlugin(hf_ds_config=ds_cfg, zero3_init_flag=False)
    else:
        kwargs["cpu"] = no_gpu
    kwargs.setdefault("kwargs_handlers", [InitProcessGroupKwargs(timeout=timeout)])
    # a second run in the same interpreter (notebook, tests) may change precision/accumulation: start afresh
    AcceleratorState._reset_state()
    GradientState._reset_state()
    return Accelerator(**kwargs)


def end_accelerator(accelerator: Any) -> None:
    """The end of a run on this process: accelerate's ``end_training`` (trackers, the process group), then, under
    DeepSpeed, transformers' process-wide ZeRO-3 switch that accelerate turned on when the run began.  Left on, every
    later ``from_pretrained`` in the process (the default task scoring ``final/``, a user's own load) would partition
    the model with ``zero.Init`` and wait forever for a process group that is gone."""
    accelerator.end_training()
    if getattr(accelerator.state, "deepspeed_plugin", None) is not None:
        from transformers.integrations import unset_hf_deepspeed_config

        unset_hf_deepspeed_config()
