"""The unfused computation the fused module is checked against: full logits → log-softmax → gather → the batch.

Written from the documented layouts (prefzoo/nn/layout.py's docstring), not from prefzoo.nn's code: every position's
logits (R, T, V) in float64, the model's transform, a log-softmax, the target's log-prob, and the batch the loss
takes, built field by field.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from prefzoo.types import GroupBatch, Need, PreferenceBatch, UnpairedBatch

IGNORE = -100


def token_scores(
    w: Tensor, x: Tensor, target: Tensor, bias: Tensor | None = None, scale: float = 1.0, softcap: float | None = None
) -> dict[str, Tensor]:
    """(R, T) per-position log-probs, entropies and log Σ p² (0 where target is ignored), and the (R, T) mask."""
    logits = x.double() @ w.double().t()  # (R, T, V) every position, prompt and padding too
    if bias is not None:
        logits = logits + bias.double()
    logits = logits * scale
    if softcap is not None:
        logits = softcap * torch.tanh(logits / softcap)
    logp = torch.log_softmax(logits, dim=-1)  # (R, T, V)
    mask = target != IGNORE
    lp = logp.gather(-1, target.clamp(min=0).unsqueeze(-1)).squeeze(-1) * mask  # (R, T)
    ent = -(logp.exp() * logp).sum(-1) * mask  # (R, T)
    sq = torch.logsumexp(2 * logp, -1).detach() * mask  # (R, T)
    return {"lp": lp, "ent": ent, "sq": sq, "mask": mask}


def compress(t: Tensor, mask: Tensor) -> Tensor:
    """(R, T) → (R, T_c): each row's masked entries first, zero/False padded (the trainer's token grid)."""
    width = max(int(mask.sum(1).max()), 1)
    rows = []
    for r in range(t.shape[0]):
        v = t[r][mask[r]]
        rows.append(torch.cat((v, v.new_zeros(width - v.shape[0]))))
    return torch.stack(rows)


def row_fields(s: dict[str, Tensor], ref: dict[str, Tensor] | None) -> dict[str, Any]:
    """Per-row fields (R, ...) in UnpairedBatch's names, float32 as the trainer hands them to a loss."""
    mask = s["mask"]
    f: dict[str, Any] = {
        "policy_logps": s["lp"].sum(1).float(),
        "lengths": mask.sum(1),
        "policy_token_logps": compress(s["lp"], mask).float(),
        "token_entropies": compress(s["ent"], mask).float(),
        "token_log_sq_probs": compress(s["sq"], mask).float(),
        "token_mask": compress(mask, mask),
    }
    if ref is not None:
        f["ref_logps"] = ref["lp"].sum(1).float().detach()
        f["ref_token_logps"] = compress(ref["lp"], mask).float().detach()
    return f


_TOKEN_FIELDS = {
    "policy_token_logps": Need.TOKEN_LOGPS,
    "token_entropies": Need.TOKEN_ENTROPIES,
    "token_log_sq_probs": Need.TOKEN_SQUARED_PROBS,
    "ref_token_logps": Need.REF_TOKEN_LOGPS,
}


def needed(f: dict[str, Any], needs: frozenset[Need]) -> dict[str, Any]:
    """Only the fields the loss declares it needs, as the trainer computes them (masks with any token field)."""
    out = {k: v for k, v in f.items() if _TOKEN_FIELDS.get(k, Need.LENGTHS) in needs or k not in _TOKEN_FIELDS}
    if not needs & set(_TOKEN_FIELDS.values()):
        out.pop("token_mask")
    if Need.REFERENCE not in needs:
        out.pop("ref_logps", None)
    return out


def pair_batch(f: dict[str, Any], scores: Tensor | None = None) -> PreferenceBatch:
    """Rows 0..B-1 chosen, B..2B-1 rejected."""
    b = f["policy_logps"].shape[0] // 2
    g = dict(f, scores=scores)

    def w(k: str) -> Tensor | None:
        return None if g.get(k) is None else g[k][:b]

    def l(k: str) -> Tensor | None:  # noqa: E743
        return None if g.get(k) is None else g[k][b:]

    return PreferenceBatch(
        policy_chosen_logps=w("policy_logps"), policy_rejected_logps=l("policy_logps"),
        ref_chosen_logps=w("ref_logps"), ref_rejected_logps=l("ref_logps"),
        chosen_lengths=w("lengths"), rejected_lengths=l("lengths"),
        policy_chosen_token_logps=w("policy_token_logps"), policy_rejected_token_logps=l("policy_token_logps"),
        chosen_token_entropies=w("token_entropies"), rejected_token_entropies=l("token_entropies"),
        chosen_mask=w("token_mask"), rejected_mask=l("token_mask"),
        ref_chosen_token_logps=w("ref_token_logps"), ref_rejected_token_logps=l("ref_token_logps"),
        chosen_token_log_sq_probs=w("token_log_sq_probs"), rejected_token_log_sq_probs=l("token_log_sq_probs"),
        chosen_scores=w("scores"), rejected_scores=l("scores"),
    )  # fmt: skip


def group_batch(f: dict[str, Any], k: int, scores: Tensor | None = None) -> GroupBatch:
    """Row k·G + g is completion k of group g."""
    g = f["policy_logps"].shape[0] // k

    def grid(t: Tensor | None) -> Tensor | None:
        if t is None:
            return None
        return torch.stack([torch.stack([t[j * g + i] for j in range(k)]) for i in range(g)])

    lengths = grid(f["lengths"])
    assert lengths is not None
    return GroupBatch(
        policy_logps=grid(f["policy_logps"]), ref_logps=grid(f.get("ref_logps")), lengths=lengths,
        scores=grid(scores), mask=lengths > 0, policy_token_logps=grid(f.get("policy_token_logps")),
        token_entropies=grid(f.get("token_entropies")), token_mask=grid(f.get("token_mask")),
    )  # fmt: skip


def unpaired_batch(f: dict[str, Any], labels: Tensor, kl: tuple[Tensor, Tensor] | None = None) -> UnpairedBatch:
    return UnpairedBatch(
        policy_logps=f["policy_logps"], labels=labels, ref_logps=f.get("ref_logps"), lengths=f["lengths"],
        kl_policy_logps=None if kl is None else kl[0], kl_ref_logps=None if kl is None else kl[1],
        policy_token_logps=f.get("policy_token_logps"), token_entropies=f.get("token_entropies"),
        token_mask=f.get("token_mask"),
    )  # fmt: skip
