"""FSDP2, the second sharding engine (``--fsdp``): torch's ``fully_shard`` per decoder layer, then the policy root.

accelerate 1.15 ignores its own FSDP plugin without a GPU (it runs DDP), so prefzoo shards the model itself: the
policy is *not* passed to ``accelerator.prepare`` (no DDP wrapper); the optimizer is wrapped in accelerate's
``AcceleratedOptimizer`` (gradient accumulation steps it only at step boundaries) without being registered for
accelerate's checkpoints, whose ``torch.save`` of the optimizer on rank 0 alone would lose the other ranks' shards.

``--fsdp-sharding hybrid`` (HSDP) shards within a group of ``--fsdp-shard-size`` ranks (by default the processes of
one node, ``LOCAL_WORLD_SIZE``) and replicates across the groups: a 2-D mesh (replicas, shard) handed to
``fully_shard``, whose parameters become DTensors placed ``(Replicate(), Shard(0))``.  Gradients are reduce-scattered
inside a node and all-reduced across nodes, so the slow inter-node links carry 1/shard of the model per step while
each rank holds 1/shard of it.  Ranks are laid out row-major, so a group is ``shard`` consecutive ranks: one node
under torchrun and accelerate, which number a node's processes consecutively.

Checkpoints: every rank writes its own shards of the model and the optimizer state (plain local tensors, read back
with ``torch.load(weights_only=True)``) into ``fsdp/rank-R.pt`` of the checkpoint folder, so node-local disks hold
what their ranks need and no cross-node metadata exists.  Resuming needs the same number of processes (the
checkpoint's batch geometry is already checked).  The final model is gathered into a full state dict on rank 0.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import torch
from torch import nn

from prefzoo.train.config import ConfigError

__all__ = ["FsdpEngine", "check_fsdp", "mesh_shape"]


def mesh_shape(cfg: Any, num_processes: int) -> tuple[int, ...]:
    """The device mesh: ``(N,)`` for full / shard_grad_op, ``(N / shard, shard)`` (replicas, shard) for hybrid."""
    if cfg.fsdp_sharding != "hybrid":
        return (num_processes,)
    shard = cfg.fsdp_shard_size or int(os.environ.get("LOCAL_WORLD_SIZE") or num_processes)
    source = f"--fsdp-shard-size {shard}" if cfg.fsdp_shard_size else f"{shard} processes per node (LOCAL_WORLD_SIZE)"
    if num_processes % shard:
        raise ConfigError(
            f"--fsdp-sharding hybrid: shard groups of {source} do not divide the {num_processes} processes: "
            f"set --fsdp-shard-size to a divisor of {num_processes} (usually the processes per node)"
        )
    return (num_processes // shard, shard)


def check_fsdp(cfg: Any, num_processes: int, no_gpu: bool) -> None:
    """``--fsdp`` where it cannot apply: one line saying what to run instead (never a silent DDP or a traceback)."""
    if not cfg.fsdp:
        if cfg.fsdp_cpu_offload:
            raise ConfigError("fsdp_cpu_offload=true needs --fsdp: add --fsdp, or drop --fsdp-cpu-offload")
        return
    if cfg.fsdp_shard_size is not None and cfg.fsdp_sharding != "hybrid":
        raise ConfigError(
            f"--fsdp-shard-size {cfg.fsdp_shard_size} with --fsdp-sharding {cfg.fsdp_sharding}: it sizes the shard "
            "groups of --fsdp-sharding hybrid; add that, or drop --fsdp-shard-size"
        )
    if cfg.deepspeed:
        raise ConfigError(f"--fsdp together with --deepspeed {cfg.deepspeed}: choose one sharding engine")
    if getattr(cfg, "online", False):
        raise ConfigError("--fsdp with --online is not supported yet (sampling needs the whole model): drop --fsdp")
    if num_processes < 2:
        raise ConfigError(
            "--fsdp with one process has nothing to shard across: launch >= 2 processes (torchrun --nproc_per_node N "
            "or accelerate launch --multi_gpu --num_processes N), or drop --fsdp to train unsharded"
        )
    if cfg.fsdp_cpu_offload and no_gpu:
        raise ConfigError(
            "--fsdp-cpu-offload without a GPU: the model already lives in CPU memory (torch's CPU offload needs an "
            "accelerator device); drop --fsdp-cpu-offload"
        )
    mesh_shape(cfg, num_processes)  # hybrid: the shard groups divide the processes


def _decoder_layers(module: nn.Module) -> list[nn.Module]:
    """The transformer blocks: modules whose class the model names in ``_no_split_modules`` (accelerate's rule)."""
    names: set[str] = set()
    for m in module.modules():
        names.update(getattr(m, "_no_split_modules", None) or [])
    return [m for m in module.modules() if type(m).__name__ in names]


class FsdpEngine:
    """Shards modules on a 1-D mesh over every process (2-D for hybrid); saves, loads and gathers the sharded policy."""

    def __init__(self, cfg: Any, accelerator: Any) -> None:
        from torch.distributed.device_mesh import init_device_mesh

        self.accelerator = accelerator
        device = accelerator.device
        shape = mesh_shape(cfg, accelerator.num_processes)
        names = ("replicate", "shard") if len(shape) == 2 else ("shard",)
        self.mesh = init_device_mesh(device.type, shape, mesh_dim_names=names)
        n = accelerator.num_processes  # what the start-up line says the mesh is
        self.layout = (
            f"{n} processes" if len(shape) == 1 else f"{shape[1]} ranks, replicated {shape[0]}× ({n} processes)"
        )
        self.kwargs: dict[str, Any] = {"reshard_after_forward": cfg.fsdp_sharding != "shard_grad_op"}
        if cfg.fsdp_cpu_offload:
            from torch.distributed.fsdp import CPUOffloadPolicy

            self.kwargs["offload_policy"] = CPUOffloadPolicy()

    def shard(self, module: nn.Module) -> int:
        """``fully_shard`` every decoder layer, then ``module`` (the root whose forward is called); layers sharded."""
        from torch.distributed.fsdp import fully_shard

        module.to(self.accelerator.device)
        layers = _decoder_layers(module)
        if not layers:
            raise ConfigError(
                f"--fsdp: {type(module).__name__} names no decoder layer class (_no_split_modules); this model "
                "cannot be sharded per layer here: drop --fsdp (or use --deepspeed zero3)"
            )
        for layer in layers:
            fully_shard(layer, mesh=self.mesh, **self.kwargs)
        fully_shard(module, mesh=self.mesh, **self.kwargs)
        return len(layers)

    def wrap_optimizer(self, optimizer: Any) -> Any:
        """accelerate's step gating under gradient accumulation, without accelerate's rank-0-only optimizer save."""
        from accelerate.optimizer import AcceleratedOptimizer

        return AcceleratedOptimizer(optimizer, device_placement=False, scaler=self.accelerator.scaler)

    # -- checkpoints ------------------------------------------------------------------------------------------------
    @staticmethod
    def _file(folder: Path, rank: int) -> Path:
        return Path(folder) / "fsdp" / f"rank-{rank:05d}.pt"

    def save(self, policy: nn.Module, optimizer: Any, folder: Path) -> None:
        """This rank's model and optimizer shards into ``folder/fsdp/rank-R.pt`` (every rank writes its own)."""
        from torch.distributed.checkpoint.state_dict import get_state_dict

        model_sd, optim_sd = get_state_dict(policy, _inner(optimizer))
        path = self._file(folder, self.accelerator.process_index)
        path.parent.mkdir(parents=True, exist_ok=True)
        mesh = list(self.mesh.shape)  # the layout of the shards: resuming on another one would misplace them
        torch.save({"model": _local(model_sd), "optim": _local(optim_sd), "mesh": mesh}, path)

    def load(self, policy: nn.Module, optimizer: Any, folder: Path) -> None:
        """Put this rank's saved shards back into the sharded policy and its optimizer (exactly, same world size)."""
        from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

        path = self._file(folder, self.accelerator.process_index)
        saved = torch.load(path, weights_only=True)
        mesh = list(self.mesh.shape)
        if saved.get("mesh", mesh) != mesh:  # same world size, other hybrid groups (a checkpoint without it: 1-D)
            raise ConfigError(
                f"--resume {folder}: its FSDP2 shards were saved on a device mesh of {saved['mesh']} (replicas × "
                f"shard for hybrid), this run's is {mesh}: resume with the same --fsdp-sharding / --fsdp-shard-size"
            )
        model_sd, optim_sd = get_state_dict(policy, _inner(optimizer))  # the sharded layout to fill
        set_state_dict(
            policy,
            _inner(optimizer),
            model_state_dict=_restore(model_sd, saved["model"]),
            optim_state_dict=_restore(optim_sd, saved["optim"]),
        )

    def full_state_dict(self, policy: nn.Module) -> dict[str, Any]:
        """The whole policy's parameters on rank 0 (an empty dict elsewhere); every rank must call it."""
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

        options = StateDictOptions(full_state_dict=True, cpu_offload=True)
        return get_model_state_dict(policy, options=options)


def _inner(optimizer: Any) -> Any:
    return getattr(optimizer, "optimizer", optimizer)  # AcceleratedOptimizer -> torch optimizer


def _local(obj: Any) -> Any:
    """A state dict with every DTensor replaced by this rank's local shard (plain tensors: weights_only-loadable)."""
    from torch.distributed.tensor import DTensor

    if isinstance(obj, DTensor):
        return obj.to_local().detach().clone()
    if isinstance(obj, dict):
        return {k: _local(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return type(obj)(_local(v) for v in obj)
    return obj


def _restore(layout: Any, saved: Any) -> Any:
    """``saved`` (local shards) rebuilt as DTensors with the placements of ``layout`` (the current sharded state)."""
    from torch.distributed.tensor import DTensor

    if isinstance(layout, DTensor):
        return DTensor.from_local(
            saved.to(layout.device), layout.device_mesh, layout.placements, shape=layout.shape, stride=layout.stride()
        )
    if isinstance(layout, dict):
        return {k: _restore(layout[k], saved[k]) if k in layout else v for k, v in saved.items()}
    return saved
