"""Worker side of the distributed tests: each rank computes its shard's losses with a real all-gather.

The batch is a deterministic function of a shared parameter θ (3 numbers), so
gradients with respect to θ can be compared across ranks and with one process.
Used by torch.multiprocessing.spawn (gloo) and as a script under `accelerate launch`.
"""

from __future__ import annotations

import os
import sys

os.environ.setdefault("OMP_NUM_THREADS", "1")

import torch

F64 = torch.float64
B_UNEVEN = 11  # split as 1 + 5 + 5 (3 ranks), 1 + 10 (2 ranks), 1 + 4 + 3 + 3 (4 ranks)


def coupled_losses() -> list[str]:
    import prefzoo

    # unpaired losses take an UnpairedBatch: tests/distributed/test_unpaired_gather.py; coupling with default params
    specs = [prefzoo.loss_spec(n) for n in prefzoo.list_losses()]
    return [s.name for s in specs if s.accepts(prefzoo.Shape.PAIR) and s.is_batch_coupled(s.params())]


def make_batch(theta: torch.Tensor, b: int, seed: int = 0):
    """A PreferenceBatch whose policy log-probs depend on θ; references, lengths and token fields are constants."""
    import prefzoo

    g = torch.Generator().manual_seed(seed)
    aw, al = torch.randn(b, 3, generator=g, dtype=F64), torch.randn(b, 3, generator=g, dtype=F64)
    scale = torch.randint(1, 50, (b,), generator=g).to(F64)
    pw = -torch.nn.functional.softplus(aw @ theta) * scale  # (B,)
    pl = -torch.nn.functional.softplus(al @ theta) * scale
    rw = -torch.rand(b, generator=g, dtype=F64) * 60
    rl = -torch.rand(b, generator=g, dtype=F64) * 60
    rl[3 % b] = rw[3 % b] - 1.0  # a tie in the reference margins' neighbourhood
    lw, ll = torch.randint(1, 40, (b,), generator=g), torch.randint(1, 40, (b,), generator=g)
    t = 5
    mask = torch.arange(t)[None, :] < torch.randint(1, t + 1, (b,), generator=g)[:, None]
    tok = -torch.rand(b, t, generator=g, dtype=F64) * mask * (1 + theta[0] ** 2)
    ent = torch.rand(b, t, generator=g, dtype=F64) * mask * (1 + theta[1] ** 2)
    return prefzoo.PreferenceBatch(pw, pl, rw, rl, lw, ll, tok, tok.flip(0) * 1.0, ent, ent.flip(0) * 1.0, mask,
                                   mask.flip(0))


def make_group_batch(theta: torch.Tensor, b: int, seed: int = 0, k: int = 4):
    """A GroupBatch of b groups of K = 4 slots (some padded, scores with ties) whose log-probs depend on θ."""
    import prefzoo

    g = torch.Generator().manual_seed(seed + 1)
    a = torch.randn(b, k, 3, generator=g, dtype=F64)
    scale = torch.randint(1, 50, (b, k), generator=g).to(F64)
    pol = -torch.nn.functional.softplus(a @ theta) * scale  # (B, K)
    ref = -torch.rand(b, k, generator=g, dtype=F64) * 60
    scores = torch.randint(0, 3, (b, k), generator=g).to(F64)  # grades 0..2: ties on purpose
    mask = torch.ones(b, k, dtype=torch.bool)
    mask[1::3, 3] = False  # every third group holds three completions
    mask[2::5, 2:] = False  # and every fifth two
    lengths = torch.randint(1, 40, (b, k), generator=g).masked_fill(~mask, 0)
    return prefzoo.GroupBatch(policy_logps=pol.masked_fill(~mask, 0.0), ref_logps=ref.masked_fill(~mask, 0.0),
                              scores=scores.masked_fill(~mask, 0.0), mask=mask, lengths=lengths)


def batch_for(name: str, theta: torch.Tensor, b: int):
    """The batch a coupled loss is checked on: K = 4 groups for a list loss, pairs otherwise (None: neither)."""
    import prefzoo

    spec = prefzoo.loss_spec(name)
    if prefzoo.Shape.LIST in spec.shapes:
        return make_group_batch(theta, b)
    return make_batch(theta, b) if spec.accepts(prefzoo.Shape.PAIR) else None


def theta0() -> torch.Tensor:
    return torch.tensor([0.3, -0.7, 1.1], dtype=F64)


def rank_results(rank: int, world: int, gather, b: int, sizes: list[int]) -> dict[str, dict[str, torch.Tensor]]:
    """Per loss: this rank's per-example losses and ∇θ Σ_shard L and ∇θ mean_shard L."""
    import prefzoo
    from prefzoo.testing import shard_batch

    out: dict[str, dict[str, torch.Tensor]] = {}
    for name in coupled_losses():
        theta = theta0().requires_grad_()
        batch = batch_for(name, theta, b)
        if batch is None:  # a shape these workers do not build yet
            continue
        shard = shard_batch(batch, sizes)[rank]
        losses = prefzoo.get_loss(name)(shard, gather=gather).losses  # (B_rank,)
        (g_sum,) = torch.autograd.grad(losses.sum(), theta, retain_graph=True)
        (g_mean,) = torch.autograd.grad(losses.mean(), theta)
        out[name] = {"losses": losses.detach(), "grad_sum": g_sum, "grad_mean": g_mean}
    return out


def single_process(b: int) -> dict[str, dict[str, torch.Tensor]]:
    return rank_results(0, 1, lambda t: t, b, [b])


def gloo_worker(rank: int, world: int, port: int, out_dir: str) -> None:
    """_spawn.spawn target: uneven shards and equal shards, gloo all-gather, all-reduce of gradients."""
    import torch.distributed as dist

    from prefzoo.testing import gloo_gather, split_sizes
    from tests.distributed._spawn import init_gloo

    init_gloo(rank, world, port)
    try:
        result = {}
        for kind, b, sizes in (("uneven", B_UNEVEN, split_sizes(B_UNEVEN, world)),
                               ("equal", 3 * world, [3] * world)):
            res = rank_results(rank, world, gloo_gather, b, sizes)
            for v in res.values():
                dist.all_reduce(v["grad_sum"])  # Σ over ranks of ∇Σ_shard = ∇Σ_all
                dist.all_reduce(v["grad_mean"])
                v["grad_mean"] /= world  # rank-averaged gradient of each shard's mean loss
                v["losses"] = gloo_gather(v["losses"])  # per-example losses in rank order
            result[kind] = {"sizes": sizes, "b": b, "res": res}
        if rank == 0:
            torch.save(result, os.path.join(out_dir, f"gloo_{world}.pt"))
    finally:
        dist.destroy_process_group()


def accelerate_main(out_dir: str) -> None:
    """Under `accelerate launch` (several CPU processes): the production gather,
    prefzoo.train.engines.accelerator.make_gather,
    as the hook; uneven shards (the first rank holding one pair) and equal shards (for the mean-loss gradient)."""
    from accelerate import Accelerator
    from accelerate.utils import gather

    from prefzoo.testing import split_sizes
    from prefzoo.train.engines.accelerator import make_gather

    torch.set_num_threads(1)
    acc = Accelerator(cpu=True)
    world, rank = acc.num_processes, acc.process_index
    hook = make_gather(acc)
    result = {}
    for kind, b, sizes in (("uneven", B_UNEVEN, split_sizes(B_UNEVEN, world)), ("equal", 3 * world, [3] * world)):
        res = rank_results(rank, world, hook, b, sizes)
        for v in res.values():
            v["losses"] = hook(v["losses"])  # per-example losses in rank order (uneven lengths)
            v["grad_sum"] = gather(v["grad_sum"][None]).sum(0)  # Σ over ranks of ∇Σ_shard = ∇Σ_all
            v["grad_mean"] = gather(v["grad_mean"][None]).mean(0)  # rank-averaged gradient of each shard's mean
        result[kind] = {"sizes": sizes, "b": b, "res": res}
    if acc.is_main_process:
        torch.save({"world": world, "distributed_type": str(acc.distributed_type), **result},
                   os.path.join(out_dir, f"accelerate_{world}.pt"))
    acc.wait_for_everyone()
    sys.stdout.flush()
    os._exit(0)


if __name__ == "__main__":
    accelerate_main(sys.argv[1])
