"""The trainer's evaluation: :func:`prefzoo.scoring.score_batches` reduced over processes (reward accuracy, ties,
loss), as ``prefzoo eval``'s :func:`prefzoo.eval.reward.reward_accuracy` reduces it on one process."""

from __future__ import annotations

import math
from typing import Any

import torch

from prefzoo.data.progress import Progress, length
from prefzoo.scoring import correct_rows, score_batches

__all__ = ["evaluate", "tie_note"]


def evaluate(
    loss: Any, policy: Any, reference: Any, dataloader: Any, accelerator: Any, gather: Any, density_ratio: Any = None,
    progress: bool = True,
) -> dict[str, float]:
    """Reward accuracy mean(chosen_rewards > rejected_rewards) with the loss's own scores, the share of pairs whose
    scores tie (``eval/ties``: a tie counts as wrong, so a policy equal to its reference has accuracy 0 under a
    reference-based loss), and the mean loss, over every process's share of ``dataloader``.  A pair with a
    non-finite log-prob, loss or reward is counted in ``eval/skipped_pairs`` and left out of the means."""
    correct, ties, losses = [], [], []
    with Progress(length(dataloader), "evaluating", unit="batches", enabled=progress) as bar:  # shown if over 2 s
        for pb, out, ok in score_batches(loss, policy, reference, dataloader, accelerator.autocast, gather,
                                         density_ratio):  # fmt: skip
            nan = torch.full_like(out.losses, math.nan, dtype=torch.float32)
            correct.append(accelerator.gather_for_metrics(torch.where(ok, correct_rows(pb, out), nan)))
            tied = (out.chosen_rewards.detach() == out.rejected_rewards.detach()).float()  # (B,)
            ties.append(accelerator.gather_for_metrics(torch.where(ok, tied, nan)))
            losses.append(accelerator.gather_for_metrics(torch.where(ok, out.losses.detach().float(), nan)))
            bar.update(1)
    acc, tie, mean_loss = torch.cat(correct), torch.cat(ties), torch.cat(losses)
    kept = torch.isfinite(acc)
    skipped = int((~kept).sum())
    if skipped:
        accelerator.print(
            f"prefzoo train: evaluation skipped {skipped} of {acc.numel()} pairs with non-finite log-probs, loss or "
            "rewards (left out of eval reward accuracy and loss; counted in eval/skipped_pairs)"
        )
    return {
        "eval/reward_accuracy": float(acc[kept].mean()) if kept.any() else math.nan,
        "eval/ties": float(tie[kept].mean()) if kept.any() else math.nan,
        "eval/loss": float(mean_loss[kept].mean()) if kept.any() else math.nan,
        "eval/pairs": float(kept.sum()),
        "eval/skipped_pairs": float(skipped),
    }


def tie_note(ev: dict[str, float]) -> str:
    """What follows an evaluation's reward accuracy where some pairs tie: ``" (100% of pairs tie; a tie counts as
    wrong)"``; else ``""``.  Before training the policy is its reference, so a reference-based loss scores every pair
    0 against 0: accuracy 0.000, not a broken run."""
    t = ev.get("eval/ties", 0.0)
    return f" ({t:.0%} of pairs tie; a tie counts as wrong)" if t > 0 else ""

