"""The accelerate side of every engine: building the Accelerator with what the run's engine adds, and ending it."""

from __future__ import annotations

import os
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch

from prefzoo._thirdparty import reset_accelerate_state
from prefzoo.train.engines.base import EngineSettings
from prefzoo.train.engines.choice import engine_for

__all__ = ["build_accelerator", "end_accelerator"]


def _refuse_ignored_fsdp(deepspeed: str | None, no_gpu: bool) -> None:
    """``accelerate launch --use_fsdp`` where accelerate would quietly run something else: one line, not silent DDP."""
    if os.environ.get("ACCELERATE_USE_FSDP", "").lower() not in ("1", "true", "yes"):
        return
    from prefzoo.train.config import ConfigError

    if deepspeed:
        raise ConfigError(
            f"accelerate launch --use_fsdp together with --deepspeed {deepspeed}: choose one sharding engine "
            "(drop --use_fsdp, or drop --deepspeed)"
        )
    if no_gpu:
        raise ConfigError(
            "accelerate launch --use_fsdp (ACCELERATE_USE_FSDP=true): without a GPU accelerate ignores FSDP and would "
            "run plain DDP, every process holding the whole model; drop --use_fsdp to train with DDP, or shard on CPU "
            "with prefzoo's own FSDP2 engine (--fsdp) or --deepspeed zero3"
        )


def build_accelerator(
    cfg: EngineSettings, log_with: list[str] | None, project_dir: str, engine: Any = None
) -> Any:
    """An Accelerator for a run's :class:`EngineSettings`: processes, accumulation, precision, trackers, and what
    ``engine`` (by default the one ``cfg`` chooses, :func:`prefzoo.train.engines.engine_for`) adds."""
    from accelerate import Accelerator
    from accelerate.utils import DataLoaderConfiguration, InitProcessGroupKwargs, ProjectConfiguration

    engine = engine or engine_for(cfg)
    no_gpu = cfg.cpu or not torch.cuda.is_available()
    _refuse_ignored_fsdp(cfg.deepspeed, no_gpu)
    # a collective that waits longer than this for a dead or hung peer fails (the loop turns it into a message)
    timeout = timedelta(seconds=float(cfg.dist_timeout))
    kwargs: dict[str, Any] = {
        "gradient_accumulation_steps": cfg.grad_accum,
        "mixed_precision": cfg.mixed_precision,
        "dataloader_config": DataLoaderConfiguration(use_seedable_sampler=True, data_seed=cfg.seed),
        "step_scheduler_with_optimizer": False,  # we step the schedule once per optimizer step ourselves
        "log_with": log_with,
        "project_config": ProjectConfiguration(project_dir=project_dir, logging_dir=str(Path(project_dir) / "tb")),
        **engine.accelerator_kwargs(no_gpu, timeout),
    }
    kwargs.setdefault("kwargs_handlers", [InitProcessGroupKwargs(timeout=timeout)])
    # a second run in the same interpreter (notebook, tests) may change precision/accumulation: start afresh
    reset_accelerate_state()
    return Accelerator(**kwargs)


def end_accelerator(accelerator: Any, engine: Any = None) -> None:
    """The end of a run on this process: accelerate's ``end_training`` (trackers, the process group), then what the
    engine turned on process-wide (see :meth:`Engine.end <prefzoo.train.engines.Engine.end>`)."""
    accelerator.end_training()
    if engine is not None:
        engine.end(accelerator)
    elif getattr(accelerator.state, "deepspeed_plugin", None) is not None:  # a caller that built it without one
        from prefzoo.train.engines.deepspeed import end_zero3_switch

        end_zero3_switch()
