"""Length-grouped sampling: batches of pairs of similar length, so the collator pads less, in a seeded random order.

Each epoch the pairs are shuffled (seed + epoch), cut into mega-batches of ``batch_size × group`` pairs, each
mega-batch is sorted by length (longest first), and the resulting batches are shuffled again.  Every pair is seen
once per epoch, the order is a pure function of (seed, epoch), so resuming mid-epoch with skipped batches works.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

import torch

__all__ = ["LengthGroupedSampler", "pair_lengths"]


def pair_lengths(tokenized: Any) -> list[int]:
    """|x| + |y_w| + |y_l| of every pair of a tokenized dataset (columns prompt_ids, chosen_ids, rejected_ids)."""
    cols = ["prompt_ids", "chosen_ids", "rejected_ids"]
    lengths = tokenized.select_columns(cols).map(
        lambda b: {"n": [len(x) + len(w) + len(l_) for x, w, l_ in zip(*(b[c] for c in cols), strict=True)]},
        batched=True,
        remove_columns=cols,
        desc="pair lengths",
    )
    return [int(n) for n in lengths["n"]]


class LengthGroupedSampler(torch.utils.data.Sampler[int]):
    """Indices for ``DataLoader(batch_size=batch_size, sampler=...)``; ``lengths[i]`` is pair i's padded-row cost."""

    def __init__(self, lengths: Sequence[int], batch_size: int, seed: int = 0, group: int = 16) -> None:
        if batch_size < 1 or group < 1:
            raise ValueError(f"batch_size={batch_size} and group={group} must be >= 1")
        self.lengths = [int(n) for n in lengths]
        self.batch_size, self.seed, self.group = batch_size, seed, group
        self.epoch = 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __len__(self) -> int:
        return len(self.lengths)

    def __iter__(self) -> Iterator[int]:
        g = torch.Generator().manual_seed(self.seed + self.epoch)
        order = torch.randperm(len(self.lengths), generator=g).tolist()
        mega = self.batch_size * self.group
        batches: list[list[int]] = []
        for s in range(0, len(order), mega):
            chunk = sorted(order[s : s + mega], key=lambda i: -self.lengths[i])
            batches += [chunk[k : k + self.batch_size] for k in range(0, len(chunk), self.batch_size)]
        # the short last batch stays last (DataLoader semantics); the full ones are shuffled among themselves
        full = [b for b in batches if len(b) == self.batch_size]
        rest = [b for b in batches if len(b) != self.batch_size]
        perm = torch.randperm(len(full), generator=g).tolist()
        for b in [full[k] for k in perm] + rest:
            yield from b
