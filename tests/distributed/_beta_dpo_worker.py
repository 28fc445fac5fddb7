"""Worker side of tests/distributed/test_beta_dpo_gather.py: β-DPO on rank shards with the production gather."""

from __future__ import annotations

import os

import torch

from tests.distributed._spawn import save_on_main, shard_accelerator

F64 = torch.float64
N = 9  # split as 1 + 8 (2 ranks)
STEPS = 3  # training steps, then one evaluation step
MODIFIER = "beta-dpo:alpha=0.4,filter_fraction=0.5,seed=5"


def margins(step: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(100 + step)
    return 2 * torch.randn(N, generator=g, dtype=F64) + 0.5 * step


def shard_results(sl: slice, gather) -> dict[str, torch.Tensor]:
    """This shard's per-pair losses and gradients at every step, and the loss state afterwards."""
    import prefzoo

    loss = prefzoo.get_loss("dpo", beta=0.5, modifiers=[MODIFIER])
    out: dict[str, torch.Tensor] = {}
    for step in range(STEPS + 1):
        d = margins(step)[sl].clone().requires_grad_()
        z = torch.zeros_like(d)
        b = prefzoo.PreferenceBatch(policy_chosen_logps=d, policy_rejected_logps=z - 1.0, ref_chosen_logps=z,
                                    ref_rejected_logps=z - 1.0)  # fmt: skip
        o = loss(b, gather=gather, update_state=step < STEPS)
        (grad,) = torch.autograd.grad(o.losses.sum(), d)
        out[f"losses-{step}"], out[f"grad-{step}"] = o.losses.detach(), grad
    out.update({f"state-{k}": v.reshape(1) for k, v in loss.state_dict().items()})
    return out


def single_process() -> dict[str, torch.Tensor]:
    return shard_results(slice(0, N), lambda t: t)


def worker(rank: int, world: int, port: int, out_dir: str) -> None:
    """_spawn.spawn target: this rank's shard of the uneven split, the production gather."""
    acc, hook, sl, sizes = shard_accelerator(rank, world, port, N)
    gathered = {k: hook(v) for k, v in shard_results(sl, hook).items()}  # per-pair results in rank order; every state
    save_on_main(acc, os.path.join(out_dir, f"beta_dpo_{world}.pt"),
                 {"type": str(acc.distributed_type), "sizes": sizes, "res": gathered})  # fmt: skip
