"""Padding-free packing gives the unpacked path's log-probs, token tensors, losses and gradients (1 process)."""

from __future__ import annotations

import contextlib

import pytest
import torch

from prefzoo.data.collate import PreferenceCollator
from prefzoo.data.groups import GroupCollator
from prefzoo.model.fast.packing import PackingError, pack_rows
from prefzoo.model.logps import PolicyLogps, sequence_logps
from prefzoo.registry import get_loss
from prefzoo.scoring import FrozenReference, batch_fields
from prefzoo.types import PreferenceBatch

EXAMPLES = [  # lengths 6+3+2, 1+5+1, 6+1+6, 2+2+2: rows of several lengths, some of which share a packed row
    {"id": "a", "prompt_ids": [5, 6, 7, 8, 9, 3], "chosen_ids": [8, 9, 2], "rejected_ids": [10, 2]},
    {"id": "b", "prompt_ids": [5], "chosen_ids": [11, 12, 13, 14, 2], "rejected_ids": [2]},
    {"id": "c", "prompt_ids": [9, 9, 9, 9, 20, 21], "chosen_ids": [2], "rejected_ids": [15, 16, 17, 18, 19, 2]},
    {"id": "d", "prompt_ids": [4, 4], "chosen_ids": [7, 2], "rejected_ids": [8, 2]},
]
# the losses (and modifiers) that take token-level inputs: per-token log-probs, entropies, Σπ², reference tokens
TOKEN_LOSSES = [("mmpo-entropy", ()), ("dpo", ("wpo",)), ("dpo", ("ld-dpo:alpha=0.5",)), ("simpo", ("ld-dpo",))]


@pytest.fixture(scope="module", params=["sdpa", "eager"])
def model(request):
    from tests.support.tiny import build_model, build_tokenizer

    m = build_model(build_tokenizer(), seed=4)
    m.config._attn_implementation = request.param
    return m


def test_packed_rows_by_hand():
    b = PreferenceCollator(0)(EXAMPLES)  # 8 rows, longest 12 tokens: [x, y] lengths 9 6 7 4 | 8 2 12 4
    p = pack_rows(b["input_ids"], b["attention_mask"], b["completion_mask"], shared=False)
    # first-fit decreasing into rows of 12: [12] [9 2] [8 4] [7 4] [6]: 5 rows instead of 8
    assert b["input_ids"].shape == (8, 12) and p.input_ids.shape == (5, 12)
    assert int((p.doc != 0).sum()) == int(b["attention_mask"].sum()) == 52
    row = p.doc[p.doc.eq(7).any(1)][0]  # the 12-token row holds sequence 6 (doc 7) alone
    assert row.tolist() == [7] * 12
    for d in range(1, 9):  # each sequence is whole in one row, its positions restart at 0
        r, c = (p.doc == d).nonzero(as_tuple=True)
        assert len(set(r.tolist())) == 1 and p.position_ids[r, c].tolist() == list(range(len(c)))
    m = p.mask()[:, 0]
    assert not bool((m & (p.doc[:, :, None] != p.doc[:, None, :]) & (p.doc[:, :, None] != 0)).any())  # block-diagonal


def test_shared_rows_pack_and_keep_the_rejected_restart():
    b = PreferenceCollator(0, share_prompt=True)(EXAMPLES)  # [x, y_w, y_l]: 11 7 13 6 tokens
    p = pack_rows(b["input_ids"], b["attention_mask"], b["completion_mask"], shared=True)
    assert p.input_ids.shape == (3, 13)  # 7 + 6 share a row
    r, c = (p.doc == 4).nonzero(as_tuple=True)  # pair d: x (2), y_w (2), y_l (2) restarting at the prompt end
    assert p.position_ids[r, c].tolist() == [0, 1, 2, 3, 2, 3]


@pytest.mark.parametrize("share", [False, True], ids=["plain", "shared"])
def test_the_one_row_mask_built_block_by_block_is_the_generic_one(share):
    from prefzoo.model.fast.packing import one_row_mask, split_segments

    b = PreferenceCollator(0, share_prompt=share)(EXAMPLES)
    model = _sdpa_llama()
    seg = split_segments(model.get_decoder(), model.config, b["attention_mask"], b["completion_mask"], share)
    assert seg is not None
    p = pack_rows(b["input_ids"], b["attention_mask"], b["completion_mask"], share, one_row=True)
    flat_of = p.flat_positions()
    assert sorted(flat_of[seg != 0].tolist()) == list(range(p.input_ids.shape[1]))  # each flat column once
    assert torch.equal(p.input_ids[0, flat_of[seg != 0]], b["input_ids"][seg != 0])  # holding its own token
    assert torch.equal(one_row_mask(seg, flat_of), p.mask())


def _sdpa_llama():
    from tests.support.tiny import build_model, build_tokenizer

    m = build_model(build_tokenizer(), seed=4)
    m.config._attn_implementation = "sdpa"
    return m


def _fields(model, loss, share, packing):
    b = PreferenceCollator(0, share_prompt=share)(EXAMPLES)
    model.zero_grad()
    policy = PolicyLogps(model, chunk_size=4, packing=packing)
    ref = FrozenReference(model, chunk_size=4, packing=packing)
    fields = batch_fields(loss, policy, ref, b, contextlib.nullcontext)
    value = loss(PreferenceBatch(**fields)).losses.mean()
    value.backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    return fields, value, grads


@pytest.mark.parametrize("share", [False, True], ids=["plain", "shared"])
@pytest.mark.parametrize(("name", "mods"), TOKEN_LOSSES, ids=["+".join((n, *m)) for n, m in TOKEN_LOSSES])
def test_packed_equals_unpacked(model, share, name, mods):
    loss = get_loss(name, modifiers=list(mods))
    assert_same_step(_fields(model, loss, share, packing=True), _fields(model, loss, share, packing=False))


def assert_same_step(packed, plain):
    """Two :func:`_fields` results agree: every batch field, the loss value and every parameter's gradient."""
    (fields, value, grads), (want_fields, want_value, want_grads) = packed, plain
    assert fields.keys() == want_fields.keys()
    for k, v in want_fields.items():
        if isinstance(v, torch.Tensor):
            torch.testing.assert_close(fields[k], v, atol=1e-5, rtol=1e-5, msg=k)
    torch.testing.assert_close(value, want_value, atol=1e-6, rtol=1e-5)
    assert grads.keys() == want_grads.keys() and want_grads
    for n in want_grads:
        torch.testing.assert_close(grads[n], want_grads[n], atol=1e-5, rtol=1e-4, msg=n)


def test_list_rows_pack_too(model):
    groups = [{"id": "g", "prompt_ids": [5, 6], "completion_ids": [[7, 2], [8, 9, 10, 2], [11, 2]]},
              {"id": "h", "prompt_ids": [4, 4, 4], "completion_ids": [[12, 2], [13, 14, 2]]}]  # fmt: skip
    b = GroupCollator(0)(groups)
    args = (b["input_ids"], b["attention_mask"], b["completion_mask"])
    with torch.no_grad():
        plain = sequence_logps(model, *args, token_entropies=True)
        packed = sequence_logps(model, *args, token_entropies=True, packing=True)
    torch.testing.assert_close(packed.logps, plain.logps, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(packed.token_entropies, plain.token_entropies, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("model_type", ["gemma2", "qwen2"])
def test_windows_and_soft_capping_stay_exact(model_type):
    """Gemma 2 (soft-capped logits, sliding + full layers) and Qwen 2 (a sliding layer): packed = unpacked."""
    from prefzoo.testing.architectures import build_tiny, tiny_pairs

    m = build_tiny(model_type)
    window = m.config.sliding_window
    for share in (False, True):
        b = PreferenceCollator(0, share_prompt=share)(tiny_pairs(m.config.vocab_size))
        assert int(b["attention_mask"].sum(1).max()) > window  # the window cuts inside some sequence
        args = (b["input_ids"], b["attention_mask"], b["completion_mask"])
        with torch.no_grad():
            plain = sequence_logps(m, *args, token_logps=True)
            packed = sequence_logps(m, *args, token_logps=True, packing=True)
        torch.testing.assert_close(packed.token_logps, plain.token_logps, atol=1e-4, rtol=1e-4)


def test_without_the_block_mask_the_logps_differ(model, monkeypatch):
    """The equality above is not vacuous: letting packed sequences see each other changes their log-probs.  (Under
    SDPA the packed rows take the split attention, which reads no mask: the masked path is the one without it.)"""
    from prefzoo.model.fast import packing

    b = PreferenceCollator(0)(EXAMPLES)
    args = (b["input_ids"], b["attention_mask"], b["completion_mask"])
    with torch.no_grad():
        good = sequence_logps(model, *args, packing=True, split_attention=False)
        monkeypatch.setattr(packing.PackedRows, "mask", lambda self: _causal_only(self))
        leaky = sequence_logps(model, *args, packing=True, split_attention=False)
    assert not torch.allclose(leaky.logps, good.logps, atol=1e-4)


def _causal_only(p):
    t = p.doc.shape[1]
    return torch.ones(t, t, dtype=torch.bool).tril().expand(p.doc.shape[0], 1, t, t)


def test_unsupported_attention_is_a_one_line_error():
    from tests.support.tiny import build_model, build_tokenizer

    m = build_model(build_tokenizer(), seed=4)
    m.config._attn_implementation = "flex_attention"  # neither a 4-D mask nor varlen boundaries
    b = PreferenceCollator(0)(EXAMPLES)
    with pytest.raises(PackingError, match="packing needs an attention implementation") as e:
        sequence_logps(m, b["input_ids"], b["attention_mask"], b["completion_mask"], packing=True)
    assert "\n" not in str(e.value)
