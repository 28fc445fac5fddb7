"""Training metrics: per-step accumulation, cross-process reduction, JSON lines and trackers."""

from __future__ import annotations

import json
import os
from collections import defaultdict
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from prefzoo._safefs import open_nofollow
from prefzoo.scoring import correct_rows
from prefzoo.types import GroupBatch, LossOutput, PreferenceBatch

__all__ = ["JsonlWriter", "MetricsAccumulator", "last_logged", "last_step", "step_metrics"]


def _scalar(t: Any) -> float:
    if isinstance(t, Tensor):
        return float(t.detach().float().mean())
    return float(t)


def best_first(batch: GroupBatch, rewards: Tensor) -> Tensor:
    """(G,) 1/0: the completion with the highest reward is one of the group's best (by the ranking; ties count)."""
    valid, r = batch.valid, batch.ranking_scores  # (G, K), (G, K)
    top = torch.where(valid, rewards.detach().float(), -torch.inf).argmax(dim=1, keepdim=True)  # (G, 1)
    best = torch.where(valid, r, -torch.inf).amax(dim=1, keepdim=True)  # (G, 1)
    return (r.gather(1, top) == best).float().squeeze(1)


def step_metrics(
    batch: Any, out: LossOutput, loss_value: Tensor, stats: dict[str, Any] | None = None
) -> dict[str, float]:
    """The standard metrics of one micro-batch, plus the loss's own (named ``loss/<key>``).

    Pairs: rewards and log-probs of chosen and rejected.  Lists: the same for the best and the worst completion of
    each group, plus ``rewards/ranking_accuracy`` (the highest reward is on a best completion) and ``logps/mean``.
    Unpaired: ``rewards/accuracies`` is whether the comparison agrees with the label; ``logps/desirable`` and
    ``logps/undesirable`` (0 when the micro-batch has none) and ``data/desirable`` (their share).
    ``stats`` (from ``batch_fields``, pairs) adds TRL's ``logits/chosen``/``logits/rejected``: the mean logit over
    the vocabulary and every completion token of the micro-batch.
    """
    cw, cl = out.chosen_rewards.detach().float(), out.rejected_rewards.detach().float()  # (B,), (B,)
    m = {
        "loss": float(loss_value.detach()),
        "rewards/chosen": float(cw.mean()),
        "rewards/rejected": float(cl.mean()),
        "rewards/accuracies": float(correct_rows(batch, out).mean()),
        "rewards/margins": float((cw - cl).mean()),
    }
    if isinstance(batch, PreferenceBatch):
        m["logps/chosen"] = float(batch.policy_chosen_logps.detach().float().mean())
        m["logps/rejected"] = float(batch.policy_rejected_logps.detach().float().mean())
        for side, lengths in (("chosen", batch.chosen_lengths), ("rejected", batch.rejected_lengths)):
            total = (stats or {}).get(f"logits_sum_{side}")  # (B,) Σ over completion tokens of the vocabulary mean
            if total is not None and lengths is not None:
                m[f"logits/{side}"] = float(total.sum() / lengths.sum().clamp(min=1))
    elif isinstance(batch, GroupBatch):
        lp, valid = batch.policy_logps.detach().float(), batch.valid  # (G, K)
        m["logps/mean"] = float(lp[valid].mean())
        if out.rewards is not None:
            m["rewards/ranking_accuracy"] = float(best_first(batch, out.rewards).mean())
    else:
        lp, lab = batch.policy_logps.detach().float(), batch.labels  # (N,), (N,)
        m["logps/desirable"] = float(lp[lab].mean()) if bool(lab.any()) else 0.0
        m["logps/undesirable"] = float(lp[~lab].mean()) if bool((~lab).any()) else 0.0
        m["data/desirable"] = float(lab.float().mean())
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
    """Appends one JSON object per line to ``path`` (main process only), opened per line without following a
    symbolic link (:func:`prefzoo._safefs.open_nofollow`)."""

    def __init__(self, path: str | Path, enabled: bool) -> None:
        self.path = Path(path)
        self.enabled = enabled
        if enabled:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            for stale in self.path.parent.glob(f".{self.path.name}.tmp*"):  # a rewrite killed before its rename
                stale.unlink(missing_ok=True)

    def write(self, record: dict[str, Any]) -> None:
        if self.enabled:
            with open_nofollow(self.path, "a") as f:
                f.write(json.dumps(record, default=float) + "\n")

    def drop_after(self, step: int) -> int:
        """A run resuming at ``step``: rewrite the file (atomically) without the records of later steps, which a run
        killed after its last checkpoint had logged and this one logs again (a step never appears twice), and without
        a line torn by the kill.  At step 0 (nothing saved: the run starts over) every record with a step goes.
        Returns how many lines were dropped (main process; 0 elsewhere)."""
        if not self.enabled or not self.path.is_file():
            return 0
        lines = self.path.read_text().splitlines()
        kept = [line for line in lines if _kept(line, step)]
        if len(kept) == len(lines):
            return 0
        tmp = self.path.with_name(f".{self.path.name}.tmp{os.getpid()}")
        tmp.unlink(missing_ok=True)  # a temp file left by a killed process of the same pid
        with open_nofollow(tmp, "x") as f:
            f.write("".join(line + "\n" for line in kept))
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, self.path)  # a reader sees the old file or the whole new one
        return len(lines) - len(kept)


def _record(line: str) -> Any:
    """One metrics.jsonl line read back; None for a line torn by a kill mid-write."""
    try:
        return json.loads(line)
    except ValueError:
        return None


def _kept(line: str, step: int) -> bool:
    record = _record(line)  # a torn line is dropped
    if not isinstance(record, dict) or not isinstance(record.get("step"), int | float):
        return isinstance(record, dict)
    return record["step"] <= step if step > 0 else False


def last_logged(path: str | Path, step: int) -> dict[str, float]:
    """The last training-metrics record of ``path`` (a metrics.jsonl) at or before ``step``, or {}: what a resume that
    trains nothing reports, and a finished run's numbers."""
    try:
        lines = Path(path).read_text().splitlines()
    except OSError:
        return {}
    for line in reversed(lines):
        record = _record(line)
        if isinstance(record, dict) and "loss" in record and "lr" in record and record.get("step", step + 1) <= step:
            return record
    return {}


def last_step(path: str | Path) -> int:
    """The highest ``step`` of any record of ``path`` (a metrics.jsonl), 0 if none (a run stopped before its first
    step logged only its evaluation at the start, at step 0) or if the file cannot be read."""
    try:
        lines = Path(path).read_text().splitlines()
    except OSError:
        return 0
    steps = [r.get("step") for r in map(_record, lines) if isinstance(r, dict)]
    return int(max((s for s in steps if isinstance(s, int | float)), default=0))
