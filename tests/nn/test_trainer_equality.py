"""prefzoo.nn on a model's last hidden states equals the trainer's loss and gradients on the same collated batch.

The trainer's side is ``prefzoo.scoring.batch_fields`` (the step's own assembly: PolicyLogps, the reference, the
batch the loss declares) and ``loss(batch).losses.mean()``; the module's side runs the decoder, shifts the targets
(-100 off the completions) and calls ``FusedLinearPreferenceLoss`` with the LM head's weight.  Every parameter's
gradient is compared, the decoder's included, for a pair, a list and an unpaired loss.
"""

from __future__ import annotations

import contextlib
from typing import Any

import pytest
import torch

pytest.importorskip("transformers")

from prefzoo.model import PolicyLogps, sequence_logps
from prefzoo.nn import FusedLinearPreferenceLoss
from prefzoo.registry import get_loss
from prefzoo.scoring import batch_fields, batch_type
from tests.support.tiny import build_model, build_tokenizer

IGNORE = -100


class _Reference:
    """The trainer's reference interface over a frozen model: pairs ``(ref_w, ref_l)``, rows ``(N,)``."""

    def __init__(self, lm: Any) -> None:
        self.lm = lm

    @torch.no_grad()
    def rows(self, rows: dict[str, Any]) -> torch.Tensor:
        return sequence_logps(self.lm, rows["input_ids"], rows["attention_mask"], rows["completion_mask"]).logps

    def __call__(self, batch: dict[str, Any]) -> tuple[torch.Tensor, torch.Tensor]:
        lp = self.rows(batch)
        return lp[: lp.shape[0] // 2], lp[lp.shape[0] // 2 :]


def _collated(r: int, seed: int) -> dict[str, Any]:
    """R rows [prompt, completion, right padding], chosen rows first (the trainer's pair collation)."""
    g = torch.Generator().manual_seed(seed)
    vocab, t = 40, 12
    input_ids = torch.randint(3, vocab, (r, t), generator=g)
    attention_mask = torch.ones(r, t, dtype=torch.long)
    completion_mask = torch.zeros(r, t, dtype=torch.long)
    for i in range(r):
        prompt, end = 3 + i % 2, t - (i % 3)
        completion_mask[i, prompt:end] = 1
        attention_mask[i, end:] = 0
        input_ids[i, end:] = 0
    return {"input_ids": input_ids, "attention_mask": attention_mask, "completion_mask": completion_mask,
            "ids": [f"e{i}" for i in range(r)]}  # fmt: skip


def _targets(batch: dict[str, Any]) -> torch.Tensor:
    """(R, T) the token each position predicts where it predicts a completion token, else -100."""
    nxt = torch.where(batch["completion_mask"][:, 1:].bool(), batch["input_ids"][:, 1:], IGNORE)
    return torch.cat((nxt, torch.full_like(nxt[:, :1], IGNORE)), dim=1)


def _grads(model: Any) -> dict[str, torch.Tensor]:
    out = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    model.zero_grad(set_to_none=True)
    return out


CASES = [
    ("dpo", {}, 6, {}),
    ("simpo", {}, 4, {}),
    ("dpo-pl", {}, 6, {"group_size": 3}),
    ("kto", {}, 5, {"labels": torch.tensor([True, False, True, True, False])}),
]


@pytest.mark.parametrize(("name", "params", "rows", "call_kw"), CASES, ids=[c[0] for c in CASES])
def test_loss_and_every_gradient_equal_the_trainers(name, params, rows, call_kw) -> None:
    torch.manual_seed(0)
    tok = build_tokenizer()
    policy, ref_lm = build_model(tok, seed=0), build_model(tok, seed=1).requires_grad_(False)
    rows_of = _collated(rows, seed=3)  # the module's layout: K blocks of G rows for lists
    batch = dict(rows_of)
    if "group_size" in call_kw:  # the trainer collates lists row-major: completion k of group g is row g·K + k
        k = call_kw["group_size"]
        batch["group_mask"] = torch.ones(rows // k, k, dtype=torch.bool)
        order = torch.arange(rows).reshape(k, rows // k).t().reshape(-1)  # row g·K + k ← row k·G + g
        batch.update({key: batch[key][order] for key in ("input_ids", "attention_mask", "completion_mask")})
        batch["ids"] = [f"g{i}" for i in range(rows // k)]
    if "group_size" not in call_kw and "labels" not in call_kw:
        batch["ids"] = batch["ids"][: rows // 2]  # one id per pair
    if "labels" in call_kw:
        batch["labels"] = call_kw["labels"]
        kl = torch.randn(rows) - 30, torch.randn(rows) - 30
        call_kw = {**call_kw, "kl_policy_logps": kl[0], "kl_ref_logps": kl[1]}

    loss = get_loss(name, **params)
    fields = batch_fields(loss, PolicyLogps(policy), _Reference(ref_lm), batch, contextlib.nullcontext)
    if "labels" in batch:
        fields.update(kl_policy_logps=call_kw["kl_policy_logps"], kl_ref_logps=call_kw["kl_ref_logps"])
    fields.pop("aux_loss", None)
    trainer_loss = loss(batch_type(batch)(**fields)).losses.mean()
    trainer_loss.backward()
    want = _grads(policy)

    h = policy.model(input_ids=rows_of["input_ids"], attention_mask=rows_of["attention_mask"]).last_hidden_state
    with torch.no_grad():
        ref_h = ref_lm.model(input_ids=rows_of["input_ids"], attention_mask=rows_of["attention_mask"]).last_hidden_state
    module = FusedLinearPreferenceLoss(name, **params)
    got, _ = module(policy.lm_head.weight, h, _targets(rows_of), None, ref_h, ref_lm.lm_head.weight, **call_kw)
    got.backward()
    have = _grads(policy)

    torch.testing.assert_close(got, trainer_loss, rtol=1e-5, atol=1e-6)
    assert have.keys() == want.keys() and len(want) > 3
    for n in want:
        torch.testing.assert_close(have[n], want[n], rtol=1e-4, atol=1e-6, msg=lambda m, n=n: f"{n}: {m}")
