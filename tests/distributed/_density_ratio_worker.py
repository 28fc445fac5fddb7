"""Worker side of tests/distributed/test_density_ratio_fit.py: the trainer's density-ratio fit on gloo ranks.

Each spawned rank builds an ``Accelerator(cpu=True)`` (MULTI_CPU on gloo) and runs
:func:`prefzoo.train.setup.density_ratio.fit_density_ratio` with the production gather on a small tokenized unpaired
dataset: each rank embeds its share of the seeded prompt sample (with a fixed token embedding: no model to load, so
the test stays fast; the trainer's default embedding is tested in tests/train/setup/test_density_ratio.py).
"""

from __future__ import annotations

import os

os.environ.setdefault("OMP_NUM_THREADS", "1")

import torch

N_DESIRABLE, N_UNDESIRABLE, SAMPLE = 7, 9, 5  # a sample smaller than the data: ranks must draw the same one


def dataset():
    import datasets

    g = torch.Generator().manual_seed(0)
    rows = []
    for i in range(N_DESIRABLE + N_UNDESIRABLE):
        good = i < N_DESIRABLE
        length = int(torch.randint(2, 9, (1,), generator=g))
        ids = torch.randint(3, 20 if good else 30, (length,), generator=g) + (0 if good else 10)  # shifted vocab
        rows.append({"id": str(i), "prompt_ids": ids.tolist(), "completion_ids": [5, 1], "label": good})
    return datasets.Dataset.from_list(rows)


class OneProcess:
    """What fit_density_ratio reads of an Accelerator, for one process without one."""

    process_index, num_processes, device = 0, 1, torch.device("cpu")

    def print(self, *args) -> None:
        pass


def embed(input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
    """A fixed random token embedding, mean-pooled over the mask: a prompt embedding without loading a model."""
    table = torch.randn(64, 6, generator=torch.Generator().manual_seed(1))  # (V, D)
    m = attention_mask.unsqueeze(-1).float()  # (N, T, 1)
    return (table[input_ids] * m).sum(1) / m.sum(1).clamp(min=1e-9)  # (N, D)


def fit(accelerator, gather) -> torch.Tensor:
    """(D + 1,) the fitted (w, b) on this process."""
    from prefzoo.train.config import TrainConfig
    from prefzoo.train.setup.density_ratio import fit_density_ratio

    cfg = TrainConfig(density_ratio=True, density_ratio_prompts=SAMPLE, per_device_batch_size=2, seed=3)
    w = fit_density_ratio(cfg.loss_section, cfg.optimization, None, dataset(), 0, accelerator, gather, embed=embed)
    return torch.cat((w.classifier.weight, w.classifier.bias.reshape(1)))


def worker(rank: int, world: int, port: int, out_dir: str) -> None:
    """``tests.distributed._spawn.spawn`` target: this rank's fit; the main rank saves every rank's (w, b)."""
    from tests.distributed._spawn import save_on_main, shard_accelerator

    acc, hook, _, _ = shard_accelerator(rank, world, port, N_DESIRABLE + N_UNDESIRABLE)
    every = hook(fit(acc, hook).unsqueeze(0))  # (P, D + 1)
    save_on_main(acc, os.path.join(out_dir, f"fit_{world}.pt"), {"type": str(acc.distributed_type), "theta": every})
