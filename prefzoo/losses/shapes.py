"""Moving between batch shapes: lists reduced to pairs (``--pairs-from-lists``), pairs as K = 2 lists.

Pure tensor functions (indexing and stacking), so gradients flow back to the
original batch: a pairwise loss trains on lists through :func:`pairs_from_lists`,
and a list loss trains on pairs through :func:`prefzoo.types.group_from_pairs`
(``Loss`` does that on its own for a loss that declares only ``Shape.LIST``).
"""

from __future__ import annotations

from typing import Literal, get_args

import torch
from torch import Tensor

from prefzoo.spec import LossParamError
from prefzoo.types import GroupBatch, GroupBatchError, PreferenceBatch, group_from_pairs

__all__ = ["REDUCTIONS", "Reduction", "best_worst_columns", "group_from_pairs", "pair_indices", "pairs_from_lists"]

Reduction = Literal["best-worst", "all-pairs", "best-vs-rest"]
REDUCTIONS: tuple[str, ...] = get_args(Reduction)


def best_worst_columns(batch: GroupBatch) -> tuple[Tensor, Tensor]:
    """(G,) column of each group's best and of its worst real completion (the first such column among ties)."""
    r, valid = batch.ranking_scores, batch.valid  # (G, K)
    return torch.where(valid, r, -torch.inf).argmax(dim=1), torch.where(valid, r, torch.inf).argmin(dim=1)


def pair_indices(batch: GroupBatch, how: Reduction) -> tuple[Tensor, Tensor, Tensor]:
    """(group, winner column, loser column) of every pair the reduction ``how`` takes, each (P,), group-major.

    Only strict preferences become pairs: two completions with equal scores are
    never paired, and a group whose completions all tie gives no pair.

    - ``best-worst``: the best against the worst completion of each group (first column among ties): ≤ G pairs.
    - ``all-pairs``: every (i, j) with score_i > score_j: up to K(K − 1)/2 pairs per group.
    - ``best-vs-rest``: the best against every completion scored strictly lower: up to K − 1 pairs per group.
    """
    if how not in REDUCTIONS:
        raise LossParamError(f"pairs from lists: unknown reduction {how!r}; use one of {', '.join(REDUCTIONS)}")
    r, valid = batch.ranking_scores, batch.valid  # (G, K) higher is better; (G, K) real slots
    if how == "all-pairs":
        better = (r[:, :, None] > r[:, None, :]) & valid[:, :, None] & valid[:, None, :]  # (G, K, K) i beats j
        g, i, j = torch.nonzero(better, as_tuple=True)
        return g, i, j
    best, worst = best_worst_columns(batch)  # (G,)
    r_best = r.gather(1, best[:, None])  # (G, 1)
    if how == "best-worst":
        g = torch.nonzero(r_best[:, 0] > r.gather(1, worst[:, None])[:, 0]).flatten()
        return g, best[g], worst[g]
    g, j = torch.nonzero((r < r_best) & valid, as_tuple=True)  # best-vs-rest
    return g, best[g], j


def pairs_from_lists(batch: GroupBatch, how: Reduction = "best-worst") -> tuple[PreferenceBatch, Tensor]:
    """The PreferenceBatch of the pairs ``how`` takes from each group, and each pair's group index (P,).

    A pairwise loss on the result trains on lists; its per-pair losses can be
    averaged per group with the returned index.  A batch in which every group
    ties gives no pair: a GroupBatchError.
    """
    g, i, j = pair_indices(batch, how)
    if g.numel() == 0:
        raise GroupBatchError(
            f"pairs from lists ({how}): no group in this batch of {batch.batch_size} has two completions with "
            "different scores, so there is no pair to train on; drop fully tied groups"
        )

    def at(t: Tensor | None, cols: Tensor) -> Tensor | None:
        return None if t is None else t[g, cols]

    ids = batch.example_ids
    return PreferenceBatch(
        policy_chosen_logps=batch.policy_logps[g, i],
        policy_rejected_logps=batch.policy_logps[g, j],
        ref_chosen_logps=at(batch.ref_logps, i),
        ref_rejected_logps=at(batch.ref_logps, j),
        chosen_lengths=at(batch.lengths, i),
        rejected_lengths=at(batch.lengths, j),
        policy_chosen_token_logps=at(batch.policy_token_logps, i),
        policy_rejected_token_logps=at(batch.policy_token_logps, j),
        chosen_token_entropies=at(batch.token_entropies, i),
        rejected_token_entropies=at(batch.token_entropies, j),
        chosen_mask=at(batch.token_mask, i),
        rejected_mask=at(batch.token_mask, j),
        example_ids=None if ids is None else tuple(
            f"{ids[a]}[{b}>{c}]" for a, b, c in zip(g.tolist(), i.tolist(), j.tolist(), strict=True)),
    ), g
