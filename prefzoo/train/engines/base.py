"""The engine interface, and the engine of every run without a sharding option: accelerate's DDP (or one process).

An engine decides how the policy is spread over processes: what the Accelerator is built with, how the policy and
its frozen reference are sharded and wrapped, what a checkpoint adds to accelerate's state, how the final model is
gathered, and what a non-finite step does to it.  The trainer asks its engine (:func:`prefzoo.train.engines.engine_for`)
and never tests which one it has; what an engine cannot run with is declared in :attr:`Engine.unsupported` and read.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

from prefzoo._thirdparty import loading_state_without_models
from prefzoo.errors import ConfigError

if TYPE_CHECKING:
    from prefzoo.train.config import TrainConfig

__all__ = ["Engine", "EngineSettings"]

# the option of each TrainConfig key an engine may refuse, as a user types it
_OPTIONS = {"merge_lora": "--merge-lora", "density_ratio": "--density-ratio", "online": "--online"}


@dataclass(frozen=True)
class EngineSettings:
    """What the engines and the Accelerator read of a run's settings (the TrainConfig fields of the same names)."""

    deepspeed: str | None = None  # zero2 | zero3 | a JSON config
    fsdp: bool = False
    fsdp_sharding: str = "full"
    fsdp_shard_size: int | None = None
    fsdp_cpu_offload: bool = False
    cpu: bool = False
    dist_timeout: float = 1800.0  # seconds a collective waits for a peer
    per_device_batch_size: int = 2
    grad_accum: int = 16
    max_grad_norm: float = 1.0
    mixed_precision: str = "no"
    seed: int = 42
    logp_chunk_size: int = 1024  # the frozen reference's log-prob chunks
    model: str | None = None  # ZeRO-3 loads the starting model again for its reference
    trust_remote_code: bool = False
    # the options an engine may refuse (Engine.unsupported)
    merge_lora: bool = False
    density_ratio: bool = False
    online: bool = False

    @classmethod
    def of(cls, cfg: TrainConfig | EngineSettings) -> EngineSettings:
        """The engine's share of a run's TrainConfig, built once where the run starts (:func:`prefzoo.train.setup`);
        the engines and :func:`~prefzoo.train.engines.build_accelerator` take only this."""
        if isinstance(cfg, cls):
            return cfg
        defaults = cls()
        return cls(**{f.name: getattr(cfg, f.name, getattr(defaults, f.name)) for f in fields(cls)})


class Engine:
    """accelerate's data parallelism: every process holds the whole model; ``accelerator.prepare`` wraps it in DDP.

    Subclasses override what differs; each attribute and method says what the trainer reads it for.
    """

    label: ClassVar[str] = "DDP"  # in start-up lines and messages
    # each process holds only part of every parameter: no generation from it, no log-prob self-check after wrapping
    partitions_params: ClassVar[bool] = False
    # the engine steps the optimizer inside backward at the accumulation boundary (a bad step cannot skip backward)
    steps_in_backward: ClassVar[bool] = False
    # the log-prob fast paths are checked against the model's own forward on the whole model before it is wrapped
    self_check: ClassVar[bool] = True
    # the log-prob fast paths' automatic choices were measured under this engine (else: off unless forced on)
    fast_paths_measured: ClassVar[bool] = True
    # TrainConfig keys this engine cannot run with -> why (one line each, before any model loads)
    unsupported: ClassVar[dict[str, str]] = {}

    def __init__(self, settings: EngineSettings) -> None:
        self.cfg = settings  # what the engine reads of the run's settings
        self.node_local = False  # each node writes its own output dir (set by use_node_local_storage)

    @property
    def checkpoint_format(self) -> str:
        """How this engine's checkpoints hold the model and optimizer (in every checkpoint's marker):
        ``accelerate`` (whole tensors, any number of processes), ``dcp`` (sharded by name, any layout), ``per-rank``
        (each rank's shards, the same processes and mesh only) or ``deepspeed``."""
        return "accelerate"

    @property
    def option(self) -> str:
        """The option that chose this engine, as the user typed it ('' for the default)."""
        return ""

    def checkpoint_globals(self) -> list[Any]:
        """Plain-data classes (records of attributes and numbers) this engine's checkpoint files name, allowed when
        they are read with ``torch.load(weights_only=True)`` (:mod:`prefzoo.train.checkpoint.state`)."""
        return []

    def marker(self, num_processes: int) -> dict[str, Any]:
        """What a checkpoint's marker records of the engine, read when a run resumes from it."""
        return {"engine": self.label, "checkpoint_format": self.checkpoint_format}

    # -- before the model loads ---------------------------------------------------------------------------------
    def accelerator_kwargs(self, no_gpu: bool, timeout: Any) -> dict[str, Any]:
        """What this engine adds to ``Accelerator(...)`` (the process group's timeout is ``timeout``)."""
        return {"cpu": no_gpu}

    def check(self, num_processes: int, no_gpu: bool) -> None:
        """Settings this engine cannot run with: one line naming the pair and the way out."""
        for key, why in self.unsupported.items():
            if getattr(self.cfg, key, None):
                raise ConfigError(f"{_OPTIONS.get(key, key)} with {self.option}: {why}")

    def use_node_local_storage(self, accelerator: Any) -> None:
        """Each node writes to its own disk: the engine's own state goes to every node's (accelerate's is set)."""
        self.node_local = True

    # -- building the run -----------------------------------------------------------------------------------------
    def frozen_reference(self, policy: Any, accelerator: Any) -> tuple[Any, str]:
        """(a frozen copy of the starting model for a reference, how it is made); built before wrapping."""
        from prefzoo.scoring import FrozenReference

        ref = FrozenReference(policy.lm, self.cfg.logp_chunk_size, policy.packing)
        ref.module.to(accelerator.device)
        return ref, "frozen copy of the starting model"

    def shard(self, accelerator: Any, policy: Any, reference: Any) -> str | None:
        """Shard ``policy`` (and a frozen ``reference``) in place before the optimizer is built; a start-up line."""
        return None

    def prepare(self, accelerator: Any, policy: Any, optimizer: Any, train_dl: Any, schedule: Any) -> tuple[Any, ...]:
        """(policy, optimizer, train_dl, schedule) wrapped: accelerate wraps all it is given (DDP, DeepSpeed)."""
        objs = [x for x in (policy, optimizer, train_dl, schedule) if x is not None]  # online: no train_dl
        out = accelerator.prepare(*objs)
        it = iter(out if isinstance(out, tuple | list) else [out])
        return tuple(next(it) if x is not None else None for x in (policy, optimizer, train_dl, schedule))

    # -- checkpoints and the final model -------------------------------------------------------------------------
    def save_shards(self, policy: Any, optimizer: Any, folder: Path) -> None:
        """Every rank, after accelerate's state: what accelerate's checkpoint leaves out (nothing here)."""

    def load_state(self, accelerator: Any, policy: Any, optimizer: Any, folder: Path) -> None:
        """Every rank: a checkpoint's state into this run, whichever engine and number of processes wrote it (the
        pair was checked before the model loaded): accelerate's files, or a sharding engine's DCP folder (its model
        and optimizer read whole on every process; accelerate's files then hold the rest)."""
        from prefzoo.train.engines.dcp import has_dcp, load_dcp

        if not has_dcp(folder):
            accelerator.load_state(str(folder))
            return
        with loading_state_without_models(accelerator):  # model and optimizer are not in accelerate's files: dcp/
            accelerator.load_state(str(folder))
        load_dcp(accelerator.unwrap_model(policy), getattr(optimizer, "optimizer", optimizer), folder)

    def full_state_dict(self, accelerator: Any, policy: Any) -> dict[str, Any] | None:
        """The whole policy's state dict on the main process (empty or None elsewhere); every process calls it."""
        return accelerator.get_state_dict(policy)  # type: ignore[no-any-return]

    # -- non-finite steps (engines that step inside backward) -----------------------------------------------------
    def drops_nonfinite_steps(self, wrapped: Any) -> bool:
        """Whether the wrapped engine drops, by itself, a step whose gradients are not finite."""
        return False

    def nonfinite_advice(self) -> str:
        """Why a non-finite step under accumulation stops the run here (engines that step inside backward)."""
        return ""

    def end(self, accelerator: Any) -> None:
        """The run is over on this process: undo process-wide switches the engine turned on."""
