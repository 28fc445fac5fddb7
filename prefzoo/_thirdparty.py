"""Every use prefzoo makes of another library's private names, or of a switch the library offers no API for.

Each is one small function saying what it relies on, why no public API does it, and the versions it was checked
against; tests/test_thirdparty.py asserts each still holds, so an upgrade that changes one fails there and not
inside a run.  Nothing else in ``prefzoo/`` names another library's private attributes (tests/test_private_names.py
reads every module with ``ast``).  Versions checked: accelerate 1.16, transformers 5.25, datasets 5.2, torch 2.13,
deepspeed 0.19.
"""

from __future__ import annotations

import contextlib
import importlib
import os
import socket
from collections.abc import Iterator
from typing import Any

from prefzoo._attrs import temporarily

__all__ = [
    "attn_implementation",
    "dataset_fingerprint",
    "dcp_set_element",
    "default_store",
    "loading_state_without_models",
    "no_split_modules",
    "one_process_group_env",
    "prepared_models",
    "reset_accelerate_state",
    "saved_tensor_hooks_active",
    "skip_deepspeed_shm_build",
    "supports_sdpa",
    "using_attn_implementation",
]


# -- accelerate ---------------------------------------------------------------------------------------------------


def reset_accelerate_state() -> None:
    """Forget accelerate's process-wide singletons (``AcceleratorState``, ``GradientState``) so that the next
    ``Accelerator(...)`` takes its own precision and accumulation: a second run in one interpreter (a notebook, the
    tests) would otherwise inherit the first run's.  accelerate has no public reset; its own tests call these
    ``_reset_state`` static methods (accelerate 1.16)."""
    from accelerate.state import AcceleratorState, GradientState

    AcceleratorState._reset_state()
    GradientState._reset_state()


def prepared_models(accelerator: Any) -> list[Any]:
    """The models ``accelerator.prepare`` wrapped, in order (``Accelerator._models``; no public accessor in
    accelerate 1.16: its save/load hooks receive this list, but only while a checkpoint is written or read)."""
    return list(accelerator._models)


@contextlib.contextmanager
def loading_state_without_models(accelerator: Any) -> Iterator[None]:
    """While held, ``accelerator.load_state`` reads neither models nor optimizers (a sharded DCP folder holds them):
    only the schedule, the data loaders' positions, the random states and registered objects.

    accelerate's public ``register_load_state_pre_hook`` can drop models but not optimizers, whose missing
    ``optimizer.bin`` then fails the load; so ``Accelerator._models`` and ``_optimizers`` are emptied for the call
    and put back after it, on an exception too (accelerate 1.16 reads both lists only at the start of ``load_state``).
    """
    models, optimizers = accelerator._models, accelerator._optimizers
    accelerator._models, accelerator._optimizers = [], []
    try:
        yield
    finally:
        accelerator._models, accelerator._optimizers = models, optimizers


# -- DeepSpeed ----------------------------------------------------------------------------------------------------


def skip_deepspeed_shm_build() -> None:
    """DeepSpeed on CPU JIT-compiles a shared-memory collective op (``deepspeed.comm.torch.build_shm_op``, about
    40 s) the first time it starts a process group; gloo gives identical results without it.  DeepSpeed has no option
    to skip the build, so the builder is replaced by a no-op (deepspeed 0.19); a DeepSpeed without it skips nothing."""
    try:
        comm: Any = importlib.import_module("deepspeed.comm.torch")
    except Exception:  # deepspeed missing or failing to import: nothing to skip
        return
    if hasattr(comm, "build_shm_op"):
        comm.build_shm_op = lambda: None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def one_process_group_env() -> None:
    """A process no launcher started (plain ``python``/``prefzoo``) gets the environment of a one-process group:
    ``RANK``, ``LOCAL_RANK``, ``WORLD_SIZE``, ``LOCAL_WORLD_SIZE`` and ``MASTER_ADDR``/``MASTER_PORT`` (a free port).

    accelerate's DeepSpeed path calls ``deepspeed.init_distributed`` with no rank or world size, and DeepSpeed then
    reads these variables (or asks MPI); neither library takes them as arguments there (accelerate 1.16, deepspeed
    0.19).  Nothing is changed where ``RANK`` is set (a launcher's process)."""
    if "RANK" in os.environ:
        return
    os.environ.update(
        RANK="0",
        LOCAL_RANK="0",
        WORLD_SIZE="1",
        LOCAL_WORLD_SIZE="1",
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(_free_port()),
    )


# -- torch --------------------------------------------------------------------------------------------------------


def dcp_set_element(root: Any, path: Any, value: Any) -> None:
    """Put ``value`` at ``path`` (a DCP object path) inside the nested ``root`` state dict: what DCP's
    ``DefaultLoadPlanner.load_bytes`` does for a flattened state dict, through
    ``torch.distributed.checkpoint._traverse.set_element`` (no public equivalent in torch 2.13)."""
    from torch.distributed.checkpoint._traverse import set_element

    set_element(root, path, value)


def saved_tensor_hooks_active() -> bool:
    """Whether saved-tensor hooks (``torch.autograd.graph.saved_tensors_hooks``: activation checkpointing,
    offloading) are active on this thread.  torch 2.13 has no public query; ``torch._C._autograd.
    _top_saved_tensors_default_hooks(False)`` returns the innermost pair or None.  A torch without it counts as
    active (the caller then installs no hooks of its own)."""
    import torch

    try:
        return torch._C._autograd._top_saved_tensors_default_hooks(False) is not None
    except AttributeError:
        return True


def default_store() -> Any:
    """The default process group's key-value store (the launcher's rendezvous store): torch 2.13 offers it only as
    ``torch.distributed.distributed_c10d._get_default_store()``; the process group must be initialised."""
    from torch.distributed import distributed_c10d

    return distributed_c10d._get_default_store()


# -- transformers -------------------------------------------------------------------------------------------------


def attn_implementation(config: Any, default: str | None = None) -> str | None:
    """The attention implementation a transformers config dispatches to (``config._attn_implementation``: 'sdpa',
    'eager', 'flash_attention_2', a registered name, ...; ``default`` when it has none).  transformers 5.25 sets it
    through ``model.set_attn_implementation`` but offers no public getter; the layers read this private property."""
    return getattr(config, "_attn_implementation", default)


@contextlib.contextmanager
def using_attn_implementation(config: Any, name: str) -> Iterator[None]:
    """While held, ``config``'s layers dispatch to the attention registered as ``name`` (``AttentionInterface``).

    ``model.set_attn_implementation`` is public but checks ``name`` against the model's supported kernels and
    changes the model for good; the layers only look up ``config._attn_implementation`` at each call, so this sets
    the property (and its sub-configs, through transformers 5.25's setter) for the block and puts it back."""
    with temporarily(config, "_attn_implementation", name):
        yield


def no_split_modules(module: Any) -> list[str]:
    """The block classes a transformers model names as never to be split across devices (``_no_split_modules``, a
    class attribute of every ``PreTrainedModel``; accelerate and transformers read it the same way)."""
    return list(getattr(module, "_no_split_modules", None) or [])


def supports_sdpa(model: Any) -> bool:
    """Whether a transformers model class declares torch SDPA attention (``_supports_sdpa``, transformers 5.25)."""
    return bool(getattr(model, "_supports_sdpa", False))


# -- datasets -----------------------------------------------------------------------------------------------------


def dataset_fingerprint(ds: Any) -> str | None:
    """A ``datasets.Dataset``'s fingerprint: the hash of its source and every transform applied to it, which names
    its cache files (``Dataset._fingerprint``; datasets 5.2 has no public accessor).  None for another object."""
    return getattr(ds, "_fingerprint", None)
