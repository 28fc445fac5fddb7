"""What a run's steps use, built once by :func:`prefzoo.train.setup.setup`."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from prefzoo.spec import Loss
from prefzoo.train.checkpoint import Storage
from prefzoo.train.config import TrainConfig
from prefzoo.train.engines import Engine

__all__ = ["Parts"]


@dataclass
class Parts:
    """Everything a run's steps use (built once by :func:`prefzoo.train.setup.setup`)."""

    cfg: TrainConfig
    loss: Loss
    engine: Engine  # how the policy is spread over processes, saved and gathered
    accelerator: Any
    tokenizer: Any
    policy: Any  # the engine-wrapped PolicyLogps
    trainable: list[Any]
    optimizer: Any
    schedule: Any
    train_dl: Any  # None for on-policy runs (each round builds its batches)
    eval_dl: Any  # None without an eval split
    reference: Any  # a Reference, or None for reference-free losses
    gather: Any
    info: dict[str, Any]  # run identity written into every checkpoint marker
    data_stats: dict[str, Any]
    model_defaults: Any  # ModelDefaults: the dropout turned off (or kept) and the token limits used
    steps_per_epoch: int
    total_steps: int
    num_epochs: int
    collate: Any  # the collator of the batches' shape
    storage: Storage
    density_ratio: Any = None  # --density-ratio: batch -> (N,) BCO's density-ratio weights (DensityRatioWeights)
    timings: dict[str, float] = field(default_factory=dict)
    resume_path: Path | None = None  # the checkpoint this run resumed from
    start_step: int = 0  # optimizer steps already done (resume)
    start_skipped: int = 0  # skipped steps already counted (resume)
    skip_record: list[int] | None = None  # [start step, N] of the --skip-batches N this run applies (or applied)
    source: Any = None  # where the micro-batches come from: EpochBatches, or OnlineRounds (--online); set last
