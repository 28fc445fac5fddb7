"""Run a loss on a batch split across simulated ranks, and a real gloo all-gather for uneven shards.

``run_sharded`` runs one thread per simulated rank; their ``gather`` hooks
meet at a barrier, so the loss code sees exactly what it would see under
torch.distributed: the concatenation over ranks, in rank order, of every
tensor it gathers.  ``gloo_gather`` is the hook to pass on a real process
group whose ranks may hold different batch sizes.
"""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

import torch
from torch import Tensor

from prefzoo.types import AnyBatch, shape_of

B = TypeVar("B", bound=AnyBatch)

__all__ = ["gloo_gather", "run_sharded", "shard_batch", "split_sizes"]


def split_sizes(b: int, shards: int) -> list[int]:
    """Uneven split of b examples into at most ``shards`` non-empty parts: the first rank holds one example."""
    shards = max(1, min(shards, b))
    if shards == 1:
        return [b]
    rest = b - 1
    k = shards - 1
    return [1] + [rest // k + (1 if i < rest % k else 0) for i in range(k)]


def shard_batch(batch: B, sizes: Sequence[int]) -> list[B]:
    """Split every per-example field along dim 0 into consecutive shards of ``sizes`` (pairs, groups or completions)."""
    assert sum(sizes) == batch.batch_size, (sizes, batch.batch_size)
    out = []
    start = 0
    for n in sizes:
        out.append(_rows(batch, slice(start, start + n)))
        start += n
    return out


def _rows(batch: B, rows: slice) -> B:
    """The examples ``rows`` of a batch: every tensor and the example ids sliced along dim 0."""
    return type(batch)(**map_fields(batch, lambda t: t[rows], lambda ids: tuple(ids[rows])))


def map_fields(batch: Any, tensors: Callable[[Tensor], Tensor],
               ids: Callable[[tuple[str, ...]], tuple[str, ...]]) -> dict[str, Any]:
    """Every field of a batch of any shape: tensors through ``tensors``, example ids through ``ids``, the rest as is."""
    ch: dict[str, Any] = {}
    for f in dataclasses.fields(batch):
        t = getattr(batch, f.name)
        if isinstance(t, Tensor):
            ch[f.name] = tensors(t)
        elif f.name == "example_ids" and t is not None:
            ch[f.name] = ids(t)
        else:
            ch[f.name] = t
    return ch


class _Exchange:
    """An in-process all-gather among ``n`` threads (one call per thread per round)."""

    def __init__(self, n: int) -> None:
        self.n = n  # the world size (the tests' ThreadAccelerator reads it as num_processes)
        self.slots: list[Tensor | None] = [None] * n
        self.barrier = threading.Barrier(n, timeout=30)
        self.result: Tensor | None = None

    def gather(self, rank: int, t: Tensor) -> Tensor:
        self.slots[rank] = t.detach().clone()
        self.barrier.wait()
        if rank == 0:
            self.result = torch.cat([s for s in self.slots if s is not None], dim=0)
        self.barrier.wait()
        out = self.result
        assert out is not None
        self.barrier.wait()  # nobody starts the next round before everyone has read this one
        return out.clone()


def run_sharded(
    loss: Callable[..., Any], batch: AnyBatch | Sequence[AnyBatch], sizes: Sequence[int] | None = None
) -> list[Any]:
    """Call ``loss(shard, gather=hook)`` on each shard in its own thread, the hooks forming one all-gather group.

    ``batch`` (any batch shape) is split by ``sizes``, or is already a list of shards.  Returns the results in rank
    order.
    """
    if shape_of(batch) is not None:
        one: Any = batch
        shards = shard_batch(one, sizes or [one.batch_size])
    else:
        shards = list(batch)  # type: ignore[arg-type]
    return run_threads(lambda rank, ex: loss(shards[rank], gather=lambda t: ex.gather(rank, t)), len(shards))


def run_threads(fn: Callable[[int, _Exchange], Any], world: int) -> list[Any]:
    """``fn(rank, exchange)`` on ``world`` threads sharing one :class:`_Exchange`; results in rank order.

    An exception in any thread aborts the others' barrier and is re-raised here (the first real one, not the
    ``BrokenBarrierError`` it caused elsewhere).
    """
    ex = _Exchange(world)
    outs: list[Any] = [None] * world
    errors: list[BaseException] = []

    def work(rank: int) -> None:
        try:
            outs[rank] = fn(rank, ex)
        except BaseException as e:  # re-raised in the caller
            errors.append(e)
            ex.barrier.abort()

    threads = [threading.Thread(target=work, args=(r,)) for r in range(world)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    real = [e for e in errors if not isinstance(e, threading.BrokenBarrierError)]
    if real or errors:
        raise (real or errors)[0]
    return outs


def gloo_gather(t: Tensor) -> Tensor:
    """All-gather a detached tensor of possibly different length per rank (gloo refuses unequal sizes).

    Gathers the sizes, pads to the largest, gathers, trims, concatenates in rank order.
    """
    import torch.distributed as dist

    if not dist.is_available() or not dist.is_initialized():
        return t
    world = dist.get_world_size()
    t = t.detach().contiguous()
    n = torch.tensor([t.shape[0]], dtype=torch.long)
    sizes = [torch.zeros_like(n) for _ in range(world)]
    dist.all_gather(sizes, n)
    m = int(max(int(s) for s in sizes))
    padded = torch.zeros((m, *t.shape[1:]), dtype=t.dtype)
    padded[: t.shape[0]] = t
    parts = [torch.zeros_like(padded) for _ in range(world)]
    dist.all_gather(parts, padded)
    return torch.cat([p[: int(s)] for p, s in zip(parts, sizes, strict=True)], dim=0)
