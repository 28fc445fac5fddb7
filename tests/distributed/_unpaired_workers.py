"""Worker side of tests/distributed/test_unpaired_gather.py: the unpaired losses on rank shards, production gather.

Each spawned rank builds an ``Accelerator(cpu=True)`` (MULTI_CPU on gloo, from the RANK/WORLD_SIZE environment
that ``accelerate launch`` would set: tests/distributed/_spawn.py) and uses prefzoo.train.engines.accelerator.make_gather,
the hook the trainer passes.
"""

from __future__ import annotations

import os

import torch

from tests.distributed._spawn import save_on_main, shard_accelerator

F64 = torch.float64
N = 11  # split as 1 + 10 (2 ranks), 1 + 4 + 3 + 3 (4 ranks)
BCO_STEPS = 3  # training steps, then one evaluation step


def inputs(seed: int, n: int = N) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(1, 30, (n,), generator=g)
    ref = -(0.05 + torch.rand(n, generator=g, dtype=F64)) * lengths - 2.0 * seed
    kl_ref = -(0.05 + torch.rand(n, generator=g, dtype=F64)) * lengths
    labels = torch.rand(n, generator=g) < 0.5
    labels[:2] = torch.tensor([False, True])
    return {"policy": ref + 3 * torch.randn(n, generator=g, dtype=F64), "ref": ref, "labels": labels,
            "kl_policy": kl_ref + 2 * torch.randn(n, generator=g, dtype=F64) + 1.5, "kl_ref": kl_ref}


def shard_results(sl: slice, gather) -> dict[str, dict[str, torch.Tensor]]:
    """This shard's per-example losses and gradients for kto, apo-zero-unpaired and several bco steps."""
    import prefzoo

    out: dict[str, dict[str, torch.Tensor]] = {}
    bco = prefzoo.get_loss("bco", beta=0.5)
    for name, seed in (("kto", 0), ("apo-zero-unpaired", 0), *((f"bco-{s}", 1 + s) for s in range(BCO_STEPS + 1))):
        x = {k: v[sl] for k, v in inputs(seed).items()}
        policy = x["policy"].clone().requires_grad_()
        b = prefzoo.UnpairedBatch(policy_logps=policy, ref_logps=x["ref"], labels=x["labels"],
                                  kl_policy_logps=x["kl_policy"], kl_ref_logps=x["kl_ref"])
        training = not name.startswith("bco-") or int(name[4:]) < BCO_STEPS
        loss = bco if name.startswith("bco-") else prefzoo.get_loss(name, beta=0.5)
        o = loss(b, gather=gather, update_state=training)
        (grad,) = torch.autograd.grad(o.losses.sum(), policy)
        point = o.metrics.get("kto/z0", o.metrics.get("bco/delta", torch.zeros((), dtype=F64)))
        out[name] = {"losses": o.losses.detach(), "grad": grad, "point": point.reshape(1).double()}
    out["bco-state"] = {k: v.reshape(1) for k, v in bco.state_dict().items()}
    return out


def single_process() -> dict[str, dict[str, torch.Tensor]]:
    return shard_results(slice(0, N), lambda t: t)


def worker(rank: int, world: int, port: int, out_dir: str) -> None:
    """_spawn.spawn target: this rank's shard of the uneven split, the production gather."""
    acc, hook, sl, sizes = shard_accelerator(rank, world, port, N)
    res = shard_results(sl, hook)
    # per-example results in rank order; the points (z₀, δ) and BCO's state of EVERY rank, to see that they agree
    gathered = {name: {k: hook(v) for k, v in d.items()} for name, d in res.items()}
    save_on_main(acc, os.path.join(out_dir, f"unpaired_{world}.pt"),
                 {"world": world, "type": str(acc.distributed_type), "sizes": sizes, "res": gathered})  # fmt: skip
