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

Checkpoints: on a shared output dir the model and optimizer shards are saved with torch's Distributed Checkpoint
(``dcp/``, :mod:`prefzoo.train.engines.dcp`), which loads into any mesh, number of processes or engine.  On
node-local disks every rank writes its own shards (plain local tensors, read back with
``torch.load(weights_only=True)``) into ``fsdp/rank-R.pt``, so each node holds what its ranks need and no cross-node
metadata exists; those resume on the same processes and mesh only.  A checkpoint of the default engine (whole
tensors) loads here too.  The final model is gathered into a full state dict on rank 0.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, ClassVar

import torch
from torch import nn

from prefzoo._dist import local_world_size
from prefzoo._thirdparty import no_split_modules
from prefzoo.errors import ConfigError
from prefzoo.train.engines.base import Engine, EngineSettings

__all__ = ["FsdpEngine", "mesh_shape"]


def mesh_shape(cfg: EngineSettings, num_processes: int) -> tuple[int, ...]:
    """The device mesh: ``(N,)`` for full / shard_grad_op, ``(N / shard, shard)`` (replicas, shard) for hybrid."""
    if cfg.fsdp_sharding != "hybrid":
        return (num_processes,)
    shard = cfg.fsdp_shard_size or local_world_size(num_processes)
    source = f"--fsdp-shard-size {shard}" if cfg.fsdp_shard_size else f"{shard} processes per node (LOCAL_WORLD_SIZE)"
    if num_processes % shard:
        raise ConfigError(
            f"--fsdp-sharding hybrid: shard groups of {source} do not divide the {num_processes} processes: "
            f"set --fsdp-shard-size to a divisor of {num_processes} (usually the processes per node)"
        )
    return (num_processes // shard, shard)


def _decoder_layers(module: nn.Module) -> list[nn.Module]:
    """The transformer blocks: modules whose class the model names in ``_no_split_modules`` (accelerate's rule)."""
    names: set[str] = set()
    for m in module.modules():
        names.update(no_split_modules(m))
    return [m for m in module.modules() if type(m).__name__ in names]


class FsdpEngine(Engine):
    """``--fsdp``: shards the policy (and a frozen reference) on a 1-D mesh over every process (2-D for hybrid);
    saves, loads and gathers the sharded policy."""

    label = "FSDP2"
    partitions_params = True
    fast_paths_measured = False
    unsupported: ClassVar[dict[str, str]] = {
        "merge_lora": "merging LoRA into sharded weights is not supported here; save the adapter and merge afterwards",
        "density_ratio": "the sharded reference is not wired for prompt embeddings yet; drop one of them",
        "online": "sampling needs the whole model; drop --fsdp",
    }

    def __init__(self, settings: EngineSettings) -> None:
        super().__init__(settings)
        self.accelerator: Any = None
        self.mesh: Any = None
        self.layout = ""

    @property
    def option(self) -> str:
        return "--fsdp"

    @property
    def checkpoint_format(self) -> str:
        """DCP on a shared output dir (resumes on any layout); each rank's own file on node-local disks."""
        return "per-rank" if self.node_local else "dcp"

    def marker(self, num_processes: int) -> dict[str, Any]:
        return {**super().marker(num_processes), "mesh": list(mesh_shape(self.cfg, num_processes))}

    def check(self, num_processes: int, no_gpu: bool) -> None:
        """``--fsdp`` where it cannot apply: one line saying what to run instead (never a silent DDP or a traceback)."""
        cfg = self.cfg
        if cfg.fsdp_shard_size is not None and cfg.fsdp_sharding != "hybrid":
            raise ConfigError(
                f"--fsdp-shard-size {cfg.fsdp_shard_size} with --fsdp-sharding {cfg.fsdp_sharding}: it sizes the shard "
                "groups of --fsdp-sharding hybrid; add that, or drop --fsdp-shard-size"
            )
        if cfg.deepspeed:
            raise ConfigError(f"--fsdp together with --deepspeed {cfg.deepspeed}: choose one sharding engine")
        super().check(num_processes, no_gpu)
        if num_processes < 2:
            raise ConfigError(
                "--fsdp with one process has nothing to shard across: launch >= 2 processes (torchrun "
                "--nproc_per_node N or accelerate launch --multi_gpu --num_processes N), or drop --fsdp to train "
                "unsharded"
            )
        if cfg.fsdp_cpu_offload and no_gpu:
            raise ConfigError(
                "--fsdp-cpu-offload without a GPU: the model already lives in CPU memory (torch's CPU offload needs "
                "an accelerator device); drop --fsdp-cpu-offload"
            )
        mesh_shape(cfg, num_processes)  # hybrid: the shard groups divide the processes

    def shard(self, accelerator: Any, policy: Any, reference: Any) -> str | None:
        """Shard the policy and a frozen reference copy (gathered layer by layer under no_grad)."""
        from prefzoo.scoring import FrozenReference

        self._build_mesh(accelerator)
        layers = self._shard(policy)
        if isinstance(reference, FrozenReference):
            self._shard(reference.module)
        cfg = self.cfg
        return (
            f"FSDP2 ({cfg.fsdp_sharding} sharding{', CPU offload' if cfg.fsdp_cpu_offload else ''}): "
            f"{layers} decoder layers and the root sharded over {self.layout}"
        )

    def _build_mesh(self, accelerator: Any) -> None:
        from torch.distributed.device_mesh import init_device_mesh

        cfg = self.cfg
        self.accelerator = accelerator
        shape = mesh_shape(cfg, accelerator.num_processes)
        names = ("replicate", "shard") if len(shape) == 2 else ("shard",)
        self.mesh = init_device_mesh(accelerator.device.type, shape, mesh_dim_names=names)
        n = accelerator.num_processes  # what the start-up line says the mesh is
        self.layout = (
            f"{n} processes" if len(shape) == 1 else f"{shape[1]} ranks, replicated {shape[0]}× ({n} processes)"
        )
        self.kwargs: dict[str, Any] = {"reshard_after_forward": cfg.fsdp_sharding != "shard_grad_op"}
        if cfg.fsdp_cpu_offload:
            from torch.distributed.fsdp import CPUOffloadPolicy

            self.kwargs["offload_policy"] = CPUOffloadPolicy()

    def prepare(self, accelerator: Any, policy: Any, optimizer: Any, train_dl: Any, schedule: Any) -> tuple[Any, ...]:
        """accelerate wraps all but the sharded policy (no DDP around it); the optimizer keeps accelerate's step
        gating under accumulation without accelerate's rank-0-only optimizer save."""
        from accelerate.optimizer import AcceleratedOptimizer

        optimizer = AcceleratedOptimizer(optimizer, device_placement=False, scaler=accelerator.scaler)
        _, _, train_dl, schedule = super().prepare(accelerator, None, None, train_dl, schedule)
        return policy, optimizer, train_dl, schedule

    def _shard(self, module: nn.Module) -> int:
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

    # -- checkpoints ------------------------------------------------------------------------------------------------
    @staticmethod
    def _file(folder: Path, rank: int) -> Path:
        return Path(folder) / "fsdp" / f"rank-{rank:05d}.pt"

    def save_shards(self, policy: nn.Module, optimizer: Any, folder: Path) -> None:
        """The sharded model and optimizer: DCP on a shared output dir (:mod:`prefzoo.train.engines.dcp`, resumes on
        any layout); on node-local disks each rank's own file (the same processes and mesh only)."""
        if self.checkpoint_format == "dcp":
            from prefzoo.train.engines.dcp import save_dcp

            save_dcp(policy, _inner(optimizer), folder)
        else:
            self._save_rank_file(policy, optimizer, folder)

    def load_state(self, accelerator: Any, policy: Any, optimizer: Any, folder: Path) -> None:
        """accelerate's state (it holds neither model nor optimizer here), then the model and optimizer from
        whichever form the checkpoint holds: DCP, this rank's file, or the default engine's whole-tensor files."""
        from prefzoo.train.engines.dcp import has_dcp, load_accelerate_files, load_dcp

        accelerator.load_state(str(folder))
        if has_dcp(folder):
            load_dcp(policy, _inner(optimizer), folder)
        elif self._file(folder, accelerator.process_index).is_file():
            self._load_rank_file(policy, optimizer, folder)
        else:  # written by the default engine (DDP or one process): whole tensors, named here
            names = [n for n, p in policy.named_parameters() if p.requires_grad]
            load_accelerate_files(policy, _inner(optimizer), folder, names)

    def _save_rank_file(self, policy: nn.Module, optimizer: Any, folder: Path) -> None:
        """This rank's model and optimizer shards into ``folder/fsdp/rank-R.pt`` (every rank writes its own)."""
        from torch.distributed.checkpoint.state_dict import get_state_dict

        model_sd, optim_sd = get_state_dict(policy, _inner(optimizer))
        path = self._file(folder, self.accelerator.process_index)
        path.parent.mkdir(parents=True, exist_ok=True)
        mesh = list(self.mesh.shape)  # the layout of the shards: resuming on another one would misplace them
        torch.save({"model": _local(model_sd), "optim": _local(optim_sd), "mesh": mesh}, path)

    def _load_rank_file(self, policy: nn.Module, optimizer: Any, folder: Path) -> None:
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

    def full_state_dict(self, accelerator: Any, policy: nn.Module) -> dict[str, Any]:
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
