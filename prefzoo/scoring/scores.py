"""Scoring held-out data with a loss: one loop for the trainer's evaluation, ``prefzoo eval`` and the integrations.

:func:`score_batches` runs the policy (and reference) under no_grad in eval mode over batches of any shape and
yields each batch's loss output with a mask of its finite rows; :func:`correct_rows` says which examples the loss's
rewards rank right.  The trainer's evaluation reduces them over processes,
``prefzoo eval`` (reward accuracy) on one process.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any

import torch
from torch import Tensor

from prefzoo.scoring.fields import batch_fields, batch_type, float_fields
from prefzoo.types import LossOutput, UnpairedBatch

__all__ = ["correct_rows", "score_batches"]


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


def correct_rows(batch: Any, out: LossOutput) -> Tensor:
    """(B,) float 1/0 per example: chosen_rewards > rejected_rewards (pairs; lists: the best over the worst), and
    for unpaired data whether that comparison agrees with the label (LossOutput's convention)."""
    right = out.chosen_rewards.detach() > out.rejected_rewards.detach()
    if isinstance(batch, UnpairedBatch):
        right = right == batch.labels
    return right.float()


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
