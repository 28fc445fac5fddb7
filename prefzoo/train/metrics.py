"""Training metrics: per-step accumulation, cross-process reduction, JSON lines and trackers."""

from __future__ import annotations

import json
from collections import defaultdict
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from prefzoo.types import LossOutput, PreferenceBatch

__all__ = ["JsonlWriter", "MetricsAccumulator", "step_metrics"]


def _scalar(t: Any) -> float:
    if isinstance(t, Tensor):
        return float(t.detach().float().mean())
    return float(t)


def step_metrics(batch: PreferenceBatch, out: LossOutput, loss_value: Tensor) -> dict[str, float]:
    """The standard metrics of one micro-batch, plus the loss's own (named ``loss/<key>``)."""
    cw, cl = out.chosen_rewards.detach().float(), out.rejected_rewards.detach().float()  # (B,), (B,)
    m = {
        "loss": float(loss_value.detach()),
        "rewards/chosen": float(cw.mean()),
        "rewards/rejected": float(cl.mean()),
        "rewards/accuracies": float((cw > cl).float().mean()),
        "rewards/margins": float((cw - cl).mean()),
        "logps/chosen": float(batch.policy_chosen_logps.detach().float().mean()),
        "logps/rejected": float(batch.policy_rejected_logps.detach().float().mean()),
    }
    for k, v in out.metrics.items():
        m[f"loss/{k}"] = _scalar(v)
    return m


class MetricsAccumulator:
    """Averages micro-batch metrics over an optimizer step, then over processes (``accelerator.reduce``)."""

    def __init__(self) -> None:
        self.sums: dict[str, float] = defaultdict(float)
        self.count = 0
        self.tokens = 0

    def add(self, metrics: dict[str, float], tokens: int) -> None:
        for k, v in metrics.items():
            self.sums[k] += v
        self.count += 1
        self.tokens += tokens

    def reduce(self, accelerator: Any) -> tuple[dict[str, float], int]:
        """(metrics averaged over micro-batches and processes, tokens summed over processes); then reset."""
        keys = sorted(self.sums)
        local = torch.tensor(
            [self.sums[k] / max(self.count, 1) for k in keys] + [float(self.tokens)],
            dtype=torch.float64 if accelerator.device.type == "cpu" else torch.float32,
            device=accelerator.device,
        )  # (K+1,)
        total = accelerator.reduce(local, reduction="sum") if accelerator.num_processes > 1 else local
        p = accelerator.num_processes
        out = {k: float(total[i]) / p for i, k in enumerate(keys)}
        tokens = int(total[-1])
        self.sums.clear()
        self.count = 0
        self.tokens = 0
        return out, tokens


class JsonlWriter:
    """Appends one JSON object per line to ``path`` (main process only)."""

    def __init__(self, path: str | Path, enabled: bool) -> None:
        self.path = Path(path)
        self.enabled = enabled
        if enabled:
            self.path.parent.mkdir(parents=True, exist_ok=True)

    def write(self, record: dict[str, Any]) -> None:
        if self.enabled:
            with self.path.open("a") as f:
                f.write(json.dumps(record, default=float) + "\n")
