"""Batch assembly: a collated batch's policy (and reference) log-probs as the PreferenceBatch fields a loss needs.

The trainer's step, its evaluation and ``prefzoo.eval.reward`` all build their batches here.
"""

from __future__ import annotations

from typing import Any

from prefzoo.spec import Loss
from prefzoo.types import Need, PreferenceBatch

__all__ = ["batch_fields", "preference_batch"]


def preference_batch(loss: Loss, policy: Any, reference: Any, batch: dict[str, Any], autocast: Any) -> PreferenceBatch:
    """Policy (and reference) log-probs for a collated batch, as the PreferenceBatch the loss declared it needs."""
    fields = batch_fields(loss, policy, reference, batch, autocast)
    fields.pop("aux_loss", None)  # the router loss is a training term, not a batch field
    return PreferenceBatch(**fields)


def batch_fields(loss: Loss, policy: Any, reference: Any, batch: dict[str, Any], autocast: Any) -> dict[str, Any]:
    """The PreferenceBatch fields of a collated batch (not yet validated: the step checks finiteness first).

    ``reference(batch) -> (ref_chosen_logps (B,), ref_rejected_logps (B,))`` or None for reference-free losses.
    """
    want_tokens, want_ent = Need.TOKEN_LOGPS in loss.needs, Need.TOKEN_ENTROPIES in loss.needs
    out = policy(
        batch["input_ids"],
        batch["attention_mask"],
        batch["completion_mask"],
        token_logps=want_tokens,
        token_entropies=want_ent,
    )
    w, l = out.split()
    fields: dict[str, Any] = {
        "policy_chosen_logps": w["logps"],  # (B,)
        "policy_rejected_logps": l["logps"],  # (B,)
        "chosen_lengths": w["lengths"],  # (B,)
        "rejected_lengths": l["lengths"],  # (B,)
        "example_ids": tuple(batch["ids"]),
    }
    if out.get("aux_loss") is not None:
        fields["aux_loss"] = out["aux_loss"]  # () MoE router term; popped by the step before PreferenceBatch
    if want_tokens or want_ent:
        fields.update(chosen_mask=w["token_mask"], rejected_mask=l["token_mask"])  # (B, T_c) bool
    if want_tokens:
        fields.update(policy_chosen_token_logps=w["token_logps"], policy_rejected_token_logps=l["token_logps"])
    if want_ent:
        fields.update(chosen_token_entropies=w["token_entropies"], rejected_token_entropies=l["token_entropies"])
    if reference is not None:
        with autocast():
            ref_w, ref_l = reference(batch)  # (B,), (B,) constants
        fields.update(ref_chosen_logps=ref_w.float(), ref_rejected_logps=ref_l.float())
    return fields
