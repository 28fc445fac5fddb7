"""A collated batch's policy (and reference) log-probs as the batch fields a loss needs.

The trainer's step, :func:`prefzoo.scoring.score_batches` (the trainer's evaluation, ``prefzoo eval``) and the
integrations' tests all build their batches here.  The collated batch
says its shape (:func:`batch_type`): pairs give :class:`PreferenceBatch` fields, lists (``group_mask``) the
:class:`GroupBatch` fields from one forward over all G·K completions, unpaired examples (``labels``) the
:class:`UnpairedBatch` fields, with KTO's mismatched KL rows scored without gradient when collated.
"""

from __future__ import annotations

from typing import Any

import torch

from prefzoo.spec import Loss
from prefzoo.types import FLOAT_FIELDS, GroupBatch, Need, PreferenceBatch, UnpairedBatch

__all__ = ["batch_fields", "batch_type", "float_fields", "preference_batch", "row_ids"]


def batch_type(batch: dict[str, Any]) -> type[Any]:
    """The batch class of a collated batch: GroupBatch (lists), UnpairedBatch or PreferenceBatch (pairs)."""
    if "group_mask" in batch:
        return GroupBatch
    if "labels" in batch:
        return UnpairedBatch
    return PreferenceBatch


def float_fields(cls: type[Any]) -> tuple[str, ...]:
    """The floating-point fields of a batch class (checked for finiteness before the loss)."""
    return FLOAT_FIELDS if cls is PreferenceBatch else tuple(cls.FLOAT_FIELDS)


def preference_batch(loss: Loss, policy: Any, reference: Any, batch: dict[str, Any], autocast: Any) -> Any:
    """Policy (and reference) log-probs for a collated batch, as the batch (of its shape) the loss declared it needs."""
    fields = batch_fields(loss, policy, reference, batch, autocast)
    fields.pop("aux_loss", None)  # the router loss is a training term, not a batch field
    return batch_type(batch)(**fields)


def batch_fields(
    loss: Loss,
    policy: Any,
    reference: Any,
    batch: dict[str, Any],
    autocast: Any,
    stats: dict[str, Any] | None = None,
    density_ratio: Any = None,
) -> dict[str, Any]:
    """The PreferenceBatch fields of a collated batch (not yet validated: the step checks finiteness first).

    ``reference(batch) -> (ref_chosen_logps (B,), ref_rejected_logps (B,))`` or None for reference-free losses.
    ``stats``, when given, receives ``logits_sum_chosen``/``logits_sum_rejected`` (B,) for the logits metrics.
    ``density_ratio(batch) -> (N,)``, when given (``--density-ratio``), the unpaired rows' density-ratio weights.
    """
    if "group_mask" in batch:
        return _group_fields(loss, policy, reference, batch, autocast)
    if "labels" in batch:
        rows = _unpaired_fields(loss, policy, reference, batch, autocast)
        if density_ratio is not None:
            rows["density_ratio_weights"] = density_ratio(batch)  # (N,) constants
        return rows
    fields = _pair_policy_fields(loss, policy, batch, stats)
    if Need.SCORES in loss.needs:
        if "chosen_scores" not in batch:
            raise KeyError("the loss needs the pairs' scores but the data has no score_chosen/score_rejected columns")
        fields.update(chosen_scores=batch["chosen_scores"].float(), rejected_scores=batch["rejected_scores"].float())
    if reference is not None:
        with autocast():
            ref_w, ref_l = reference(batch)  # (B,), (B,) constants
        fields.update(ref_chosen_logps=ref_w.float(), ref_rejected_logps=ref_l.float())
        if Need.REF_TOKEN_LOGPS in loss.needs:  # LD-DPO on a reference loss: (B, T_c) on the policy's token grid
            with autocast():
                tok_w, tok_l = reference.token_logps(batch)
            fields.update(ref_chosen_token_logps=tok_w.float(), ref_rejected_token_logps=tok_l.float())
    return fields


def _pair_policy_fields(
    loss: Loss, policy: Any, batch: dict[str, Any], stats: dict[str, Any] | None
) -> dict[str, Any]:
    """A pair batch's policy fields from one forward: sequence log-probs and lengths, and the token-level tensors
    (log-probs, entropies, log Σ_v π(v)², masks) only where the loss declares it needs them."""
    want_tokens, want_ent = Need.TOKEN_LOGPS in loss.needs, Need.TOKEN_ENTROPIES in loss.needs
    want_sq = Need.TOKEN_SQUARED_PROBS in loss.needs
    out = policy(
        batch["input_ids"],
        batch["attention_mask"],
        batch["completion_mask"],
        token_logps=want_tokens,
        token_entropies=want_ent,
        **({"token_sq_probs": True} if want_sq else {}),
        **({"logits_mean": True} if stats is not None else {}),
    )
    w, l = out.split()
    if stats is not None:
        stats.update(logits_sum_chosen=w["logits_sum"], logits_sum_rejected=l["logits_sum"])  # (B,), (B,)
    fields: dict[str, Any] = {
        "policy_chosen_logps": w["logps"],  # (B,)
        "policy_rejected_logps": l["logps"],  # (B,)
        "chosen_lengths": w["lengths"],  # (B,)
        "rejected_lengths": l["lengths"],  # (B,)
        "example_ids": tuple(batch["ids"]),
    }
    if out.get("aux_loss") is not None:
        fields["aux_loss"] = out["aux_loss"]  # () MoE router term; popped by the step before PreferenceBatch
    if want_tokens or want_ent or want_sq:
        fields.update(chosen_mask=w["token_mask"], rejected_mask=l["token_mask"])  # (B, T_c) bool
    if want_sq:  # WPO: log Σ_v π(v)² per token, constant
        fields.update(
            chosen_token_log_sq_probs=w["token_log_sq_probs"], rejected_token_log_sq_probs=l["token_log_sq_probs"]
        )
    if want_tokens:
        fields.update(policy_chosen_token_logps=w["token_logps"], policy_rejected_token_logps=l["token_logps"])
    if want_ent:
        fields.update(chosen_token_entropies=w["token_entropies"], rejected_token_entropies=l["token_entropies"])
    return fields


def _rows(loss: Any, policy: Any, batch: dict[str, Any], prefix: str = "") -> Any:
    """:func:`prefzoo.sequence_logps` of the collated rows ``{prefix}input_ids``... (one forward)."""
    return policy(
        batch[f"{prefix}input_ids"],
        batch[f"{prefix}attention_mask"],
        batch[f"{prefix}completion_mask"],
        token_logps=Need.TOKEN_LOGPS in loss.needs,
        token_entropies=Need.TOKEN_ENTROPIES in loss.needs,
    )


def row_ids(batch: dict[str, Any]) -> list[str]:
    """The key of every collated row: an unpaired example's id, or ``<id>#<k>`` for completion k of a list."""
    if "group_mask" in batch:
        g, k = torch.nonzero(batch["group_mask"], as_tuple=True)  # (N,) row-major = the collated row order
        return [f"{batch['ids'][i]}#{j}" for i, j in zip(g.tolist(), k.tolist(), strict=True)]
    return [str(i) for i in batch["ids"]]


def _ref_rows(reference: Any, batch: dict[str, Any], autocast: Any, prefix: str = "") -> Any:
    rows = {k: batch[f"{prefix}{k}"] for k in ("input_ids", "attention_mask", "completion_mask")}
    if not prefix:  # the keys a precomputed reference looks its rows up by (KL rows have none: never cached)
        rows["row_ids"] = row_ids(batch)
    with autocast():
        return reference.rows(rows).float()  # (N,) constants


def _group_fields(loss: Any, policy: Any, reference: Any, batch: dict[str, Any], autocast: Any) -> dict[str, Any]:
    """GroupBatch fields: the N = Σ_g K_g rows scored in one forward, placed in the (G, K) grid by ``group_mask``."""
    mask = batch["group_mask"]  # (G, K) bool
    g_idx, k_idx = torch.nonzero(mask, as_tuple=True)  # (N,) each, row-major = the collated row order
    out = _rows(loss, policy, batch)

    def grid(t: Any) -> Any:  # (N, ...) -> (G, K, ...), 0 on empty slots; differentiable in t
        return t.new_zeros(*mask.shape, *t.shape[1:]).index_put((g_idx, k_idx), t)

    fields: dict[str, Any] = {
        "policy_logps": grid(out["logps"]),  # (G, K)
        "lengths": grid(out["lengths"]),  # (G, K)
        "scores": batch.get("scores"),  # (G, K) or None: column order is the ranking
        "mask": mask,
        "example_ids": tuple(batch["ids"]),
    }
    if out.get("aux_loss") is not None:
        fields["aux_loss"] = out["aux_loss"]
    if out.get("token_mask") is not None:
        fields["token_mask"] = grid(out["token_mask"])  # (G, K, T_c)
    if out.get("token_logps") is not None:
        fields["policy_token_logps"] = grid(out["token_logps"])
    if out.get("token_entropies") is not None:
        fields["token_entropies"] = grid(out["token_entropies"])
    if reference is not None:
        fields["ref_logps"] = grid(_ref_rows(reference, batch, autocast))  # (G, K)
    return fields


def _unpaired_fields(loss: Any, policy: Any, reference: Any, batch: dict[str, Any], autocast: Any) -> dict[str, Any]:
    """UnpairedBatch fields; with KL rows collated, also log π_θ and log π_ref of the mismatched pairs (no grad)."""
    fields: dict[str, Any] = {"labels": batch["labels"], "example_ids": tuple(batch["ids"])}
    if "kl_input_ids" in batch:  # as TRL's KTOTrainer: the KL log-probs are constants, computed first without grad
        with torch.no_grad():
            fields["kl_policy_logps"] = _rows(loss, policy, batch, "kl_")["logps"].detach()  # (N,)
        if reference is not None:
            fields["kl_ref_logps"] = _ref_rows(reference, batch, autocast, "kl_")  # (N,)
    out = _rows(loss, policy, batch)
    fields.update(policy_logps=out["logps"], lengths=out["lengths"])  # (N,), (N,)
    if out.get("aux_loss") is not None:
        fields["aux_loss"] = out["aux_loss"]
    for src, dst in (("token_mask", "token_mask"), ("token_logps", "policy_token_logps"),
                     ("token_entropies", "token_entropies")):  # fmt: skip
        if out.get(src) is not None:
            fields[dst] = out[src]
    if reference is not None:
        fields["ref_logps"] = _ref_rows(reference, batch, autocast)  # (N,)
    return fields
