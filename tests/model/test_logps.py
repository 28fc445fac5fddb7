"""Chunked completion log-probs equal the naive full log-softmax; token tensors agree with the sums."""

from __future__ import annotations

import pytest
import torch

from prefzoo.data.collate import PreferenceCollator
from prefzoo.model.logps import PolicyLogps, completion_logps_naive


@pytest.fixture(scope="module")
def setup():
    from tests.support.tiny import build_model, build_tokenizer

    tok = build_tokenizer()
    model = build_model(tok, seed=1).eval()
    ex = [
        {"id": "a", "prompt_ids": [5, 6, 7], "chosen_ids": [8, 9, 2], "rejected_ids": [10, 2]},
        {"id": "b", "prompt_ids": [5], "chosen_ids": [11, 12, 13, 14, 2], "rejected_ids": [2]},
        {"id": "c", "prompt_ids": [9, 9, 9, 9], "chosen_ids": [2], "rejected_ids": [15, 16, 2]},
    ]
    return model, PreferenceCollator(tok.pad_token_id)(ex)


@pytest.mark.parametrize("chunk", [1, 3, 7, 4096])
def test_chunked_equals_naive(setup, chunk):
    model, b = setup
    naive = completion_logps_naive(model, b["input_ids"], b["attention_mask"], b["completion_mask"])  # (6,)
    out = PolicyLogps(model, chunk_size=chunk)(b["input_ids"], b["attention_mask"], b["completion_mask"])
    torch.testing.assert_close(out.logps, naive, atol=1e-5, rtol=1e-5)
    assert out.lengths.tolist() == [3, 5, 1, 2, 1, 3]
    assert out.token_logps is None and out.token_entropies is None  # only computed when asked for


def test_token_tensors_match(setup):
    model, b = setup
    out = PolicyLogps(model, chunk_size=2)(
        b["input_ids"], b["attention_mask"], b["completion_mask"], token_logps=True, token_entropies=True
    )
    assert out.token_logps.shape == (6, 5) and out.token_mask.shape == (6, 5)
    torch.testing.assert_close(out.token_logps.sum(1), out.logps)
    assert out.token_mask.sum(1).tolist() == out.lengths.tolist()
    assert bool((out.token_logps[~out.token_mask] == 0).all())
    # entropies from the full distribution, position by position
    logits = model(input_ids=b["input_ids"], attention_mask=b["attention_mask"]).logits.float()
    logp = torch.log_softmax(logits[:, :-1], -1)
    ent = -(logp.exp() * logp).sum(-1)  # (6, T-1)
    expected = [ent[i][b["completion_mask"][i, 1:]] for i in range(6)]
    for i in range(6):
        torch.testing.assert_close(out.token_entropies[i, : len(expected[i])], expected[i], atol=1e-5, rtol=1e-5)


def test_gradient_matches_naive(setup):
    model, b = setup
    model.zero_grad()
    completion_logps_naive(model, b["input_ids"], b["attention_mask"], b["completion_mask"]).sum().backward()
    g_naive = {n: p.grad.clone() for n, p in model.named_parameters()}
    model.zero_grad()
    PolicyLogps(model, 2)(b["input_ids"], b["attention_mask"], b["completion_mask"]).logps.sum().backward()
    for n, p in model.named_parameters():
        torch.testing.assert_close(p.grad, g_naive[n], atol=1e-5, rtol=1e-4)
    model.zero_grad()


def test_completion_logps_survives_accelerate_output_conversion(setup):
    """accelerate rebuilds dict outputs as type(out)(mapping) under mixed precision (convert_to_fp32)."""
    from accelerate.utils.operations import convert_to_fp32

    model, b = setup
    out = PolicyLogps(model)(b["input_ids"], b["attention_mask"], b["completion_mask"])
    half = type(out)({k: (v.to(torch.bfloat16) if k == "logps" else v) for k, v in out.items()})
    back = convert_to_fp32(half)
    assert type(back) is type(out) and back.logps.dtype == torch.float32
    assert torch.equal(back.lengths, out.lengths) and back.token_logps is None
