"""The gather a batch-coupled loss reads the whole batch through: every process's rows in rank order."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor

__all__ = ["make_gather"]


def make_gather(accelerator: Any) -> Callable[[Tensor], Tensor]:
    """``gather(t)``: concatenation of ``t`` (dim 0, any per-rank length) over processes in rank order.

    gloo refuses uneven all_gathers, so sizes are gathered first, every rank pads to the largest, and the padding is
    trimmed afterwards.  Not differentiable (losses only gather detached tensors).
    """
    if accelerator.num_processes == 1:
        return lambda t: t

    def gather(t: Tensor) -> Tensor:
        t = t.detach().contiguous()
        sizes = accelerator.gather(torch.tensor([t.shape[0]], device=t.device)).tolist()  # (P,)
        padded = accelerator.pad_across_processes(t, dim=0)  # (max_size, ...)
        allt = accelerator.gather(padded)  # (P·max_size, ...)
        m = max(sizes)
        return torch.cat([allt[r * m : r * m + n] for r, n in enumerate(sizes)], dim=0)

    return gather
