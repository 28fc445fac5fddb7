"""Scoring held-out preference data with a loss: one loop for the trainer's evaluation and ``prefzoo eval``.

:func:`score_batches` runs the policy (and reference) under no_grad in eval mode over batches of any shape and
yields each batch's loss output with a mask of its finite rows; :func:`evaluate` is the trainer's reduction of it
over processes (reward accuracy and loss), and :func:`prefzoo.eval.reward.reward_accuracy` its reduction on one
process (accuracy, ties, margins).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Iterator
from typing import Any

import torch

from prefzoo.data.progress import Progress, length
from prefzoo.train.batch import batch_fields, batch_type, float_fields
from prefzoo.train.metrics import correct_rows

__all__ = ["evaluate", "score_batches", "tie_note"]


@torch.no_grad()
def score_batches(
    loss: Any, policy: Any, reference: Any, batches: Iterable[dict[str, Any]], autocast: Any, gather: Any = None,
    density_ratio: Any = None,
) -> Iterator[tuple[Any, Any, torch.Tensor]]:
    """(batch, loss output, ok) for each collated batch: ``ok`` (B,) is True where the example's log-probs, loss and
    rewards are finite.  Rows that are not had their inputs replaced by zeros before the loss, so every process calls
    the loss (and its gathers) with the same batch and a NaN in one process's shard cannot desynchronise the others.
    The policy is in eval mode while scoring (its mode restored afterwards)."""
    was_training = policy.training
    policy.eval()
    try:
        for batch in batches:
            cls = batch_type(batch)
            fields = batch_fields(loss, policy, reference, batch, autocast, density_ratio=density_ratio)
            fields.pop("aux_loss", None)  # the router loss is a training term
            names = float_fields(cls)
            ok = _finite_rows(fields, names)  # (B,) bool
            pb = cls(**{k: _zero_rows(v, ok) if k in names else v for k, v in fields.items()})
            out = loss(pb, gather=gather) if gather is not None else loss(pb)
            ok &= torch.isfinite(out.losses) & torch.isfinite(out.chosen_rewards) & torch.isfinite(out.rejected_rewards)
            yield pb, out, ok
    finally:
        policy.train(was_training)


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


def _finite_rows(fields: dict[str, Any], names: tuple[str, ...]) -> Any:
    """(B,) True where every float field of the example (pair, group or completion) is finite."""
    first = next(fields[k] for k in names if fields.get(k) is not None)
    ok = torch.ones(first.shape[0], dtype=torch.bool, device=first.device)
    for k in names:
        t = fields.get(k)
        if t is not None:
            ok &= torch.isfinite(t.detach()).reshape(t.shape[0], -1).all(dim=1)
    return ok


def _zero_rows(t: Any, ok: Any) -> Any:
    """``t`` ((B,) or (B, T)) with the rows where ``ok`` is False set to 0."""
    if t is None:
        return None
    return torch.where(ok.reshape(-1, *([1] * (t.dim() - 1))), t, torch.zeros_like(t))
