"""Spawned ranks for the distributed tests: the set-up every worker shares, in one place.

``spawn(target, world, *args)`` starts ``world`` processes with ``torch.multiprocessing.spawn`` (one OpenMP thread:
a forked or spawned torch with default threads deadlocked or crawled here, docs in PLATFORM.md), each calling
``target(rank, world, port, *args)`` with the same free loopback port; a rank whose target returns ends with
``os._exit(0)`` after flushing its output, skipping the interpreter's teardown, where gloo's and DDP's threads can
abort a finished rank (SIGABRT, "terminate called without an active exception": CI saw it once in the β-DPO test;
the same mechanism as the CLI's ``end_launched_worker``).  A target that raises still reaches torch's error report.
Inside a rank:

- :func:`shard_accelerator`: the environment ``accelerate launch`` would set, an ``Accelerator(cpu=True)``
  (MULTI_CPU on gloo), the production gather (:func:`prefzoo.train.engines.accelerator.make_gather`) and this rank's slice
  of an uneven split (the first rank holding one example);
- :func:`init_gloo`: a plain gloo process group, for the tests of :func:`prefzoo.testing.gloo_gather`;
- :func:`save_on_main`: the main rank writes the gathered results, every rank waits.
"""

from __future__ import annotations

import os

os.environ.setdefault("OMP_NUM_THREADS", "1")

import sys
from collections.abc import Callable
from typing import Any

import torch

from tests.support import free_port

__all__ = ["free_port", "init_gloo", "save_on_main", "shard_accelerator", "spawn"]


def spawn(target: Callable[..., None], world: int, *args: Any) -> None:
    """``target(rank, world, port, *args)`` in ``world`` spawned processes with one thread each; raises if one fails."""
    before = os.environ.get("OMP_NUM_THREADS")
    os.environ["OMP_NUM_THREADS"] = "1"  # read by each child's torch at import, before any worker code runs
    try:
        torch.multiprocessing.spawn(_ended, args=(target, world, free_port(), *args), nprocs=world, join=True)
    finally:
        if before is None:
            del os.environ["OMP_NUM_THREADS"]
        else:
            os.environ["OMP_NUM_THREADS"] = before


def _ended(rank: int, target: Callable[..., None], *args: Any) -> None:
    """Run ``target(rank, *args)``; when it returns, flush and end the process without the interpreter's teardown."""
    target(rank, *args)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def _rank_env(rank: int, world: int, port: int) -> None:
    os.environ.update(RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(world), LOCAL_WORLD_SIZE=str(world),
                      MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))  # fmt: skip
    torch.set_num_threads(1)


def shard_accelerator(rank: int, world: int, port: int, n: int) -> tuple[Any, Any, slice, list[int]]:
    """(Accelerator, the production gather, this rank's slice of ``n`` examples, every rank's shard size)."""
    _rank_env(rank, world, port)
    from accelerate import Accelerator

    from prefzoo.testing import split_sizes
    from prefzoo.train.engines.accelerator import make_gather

    acc = Accelerator(cpu=True)
    sizes = split_sizes(n, world)
    start = sum(sizes[:rank])
    return acc, make_gather(acc), slice(start, start + sizes[rank]), sizes


def init_gloo(rank: int, world: int, port: int) -> None:
    """A plain gloo process group over loopback (destroy it with ``torch.distributed.destroy_process_group``)."""
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)


def save_on_main(acc: Any, path: str, obj: Any) -> None:
    """The main rank saves ``obj`` (already gathered) to ``path``; every rank waits for it."""
    if acc.is_main_process:
        torch.save(obj, path)
    acc.wait_for_everyone()
