"""The optimizer (torch AdamW or bitsandbytes AdamW8bit) and the learning-rate schedule of a run."""

from __future__ import annotations

import math
from typing import Any

from torch import nn

from prefzoo.errors import install_hint
from prefzoo.model import LoadOptionError
from prefzoo.train.config.sections import OptimizationSection

__all__ = ["build_optimizer", "build_schedule"]


def build_optimizer(params: list[nn.Parameter], cfg: OptimizationSection) -> Any:
    """torch AdamW or bitsandbytes AdamW8bit (which also steps on CPU), as ``cfg.optim`` names, with ``cfg.lr``,
    ``cfg.adam_betas`` and ``cfg.weight_decay``."""
    lr, weight_decay = cfg.lr, cfg.weight_decay
    betas = (float(cfg.adam_betas[0]), float(cfg.adam_betas[1]))
    if cfg.optim == "adamw8bit":
        try:
            import bitsandbytes as bnb
        except ImportError:
            raise LoadOptionError(f"--optim adamw8bit needs bitsandbytes: {install_hint('qlora')}") from None
        return bnb.optim.AdamW8bit(params, lr=lr, betas=betas, weight_decay=weight_decay)
    import torch

    return torch.optim.AdamW(params, lr=lr, betas=betas, weight_decay=weight_decay)


def build_schedule(
    optimizer: Any, total_steps: int, warmup_ratio: float, name: str = "cosine", warmup_steps: int = 0
) -> Any:
    """transformers' schedule ``name`` (cosine: the paper's) after a linear warm-up over ``warmup_steps`` steps, or
    ``ceil(warmup_ratio × total_steps)`` when ``warmup_steps`` is 0 (TRL's rule).  Built by
    :mod:`prefzoo.train.setup.schedules` (the same LambdaLR without importing peft)."""
    from prefzoo.train.setup.schedules import get_schedule

    warmup = warmup_steps or math.ceil(warmup_ratio * total_steps)
    return get_schedule(name, optimizer, num_warmup_steps=warmup, num_training_steps=total_steps)
