"""Prompt prefix sharing gives the plain forward's per-example log-probs, token tensors, losses and gradients."""

from __future__ import annotations

import pytest
import torch

from prefzoo.data.collate import PreferenceCollator
from prefzoo.model.fast.prompt import SharedPromptError, shared_prompt_mask
from prefzoo.model.logps import PolicyLogps

EXAMPLES = [
    {"id": "a", "prompt_ids": [5, 6, 7], "chosen_ids": [8, 9, 2], "rejected_ids": [10, 2]},
    {"id": "b", "prompt_ids": [5], "chosen_ids": [11, 12, 13, 14, 2], "rejected_ids": [2]},
    {"id": "c", "prompt_ids": [9, 9, 9, 9, 20, 21], "chosen_ids": [2], "rejected_ids": [15, 16, 17, 18, 19, 2]},
]


@pytest.fixture(scope="module", params=["sdpa", "eager"])
def model(request):
    from tests.support.tiny import build_model, build_tokenizer

    m = build_model(build_tokenizer(), seed=4)
    m.config._attn_implementation = request.param
    return m


def _run(model, collate, loss_name=None, want=False):
    b = collate(EXAMPLES)
    model.zero_grad()
    out = PolicyLogps(model, chunk_size=4)(
        b["input_ids"], b["attention_mask"], b["completion_mask"], token_logps=want, token_entropies=want
    )
    value = None
    if loss_name is not None:
        from prefzoo.registry import get_loss
        from prefzoo.types import PreferenceBatch

        w, l_ = out.split()
        pb = PreferenceBatch(
            policy_chosen_logps=w["logps"],
            policy_rejected_logps=l_["logps"],
            ref_chosen_logps=torch.tensor([-20.0, -30.0, -5.0]),
            ref_rejected_logps=torch.tensor([-10.0, -3.0, -40.0]),
            chosen_lengths=w["lengths"],
            rejected_lengths=l_["lengths"],
            example_ids=tuple(b["ids"]),
        )
        value = get_loss(loss_name)(pb).losses.mean()
        value.backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    return b, out, value, grads


def test_collated_layout_is_one_row_per_pair():
    b = PreferenceCollator(0, share_prompt=True)(EXAMPLES)
    assert b["input_ids"].shape == (3, 13)  # max of 3+3+2, 1+5+1, 6+1+6
    assert b["completion_mask"][0].tolist()[:9] == [1, 1, 1, 2, 2, 2, 3, 3, 0]
    assert b["chosen_lengths"].tolist() == [3, 5, 1] and b["rejected_lengths"].tolist() == [2, 1, 6]
    assert int(b["attention_mask"].sum()) == sum(
        len(e["prompt_ids"]) + len(e["chosen_ids"]) + len(e["rejected_ids"]) for e in EXAMPLES
    )


def test_mask_hides_chosen_from_rejected():
    seg = torch.tensor([[1, 1, 2, 2, 3, 3, 0]])
    m = shared_prompt_mask(seg)[0, 0]
    assert m[4].tolist() == [True, True, False, False, True, False, False]  # first y_l token: prompt + itself
    assert m[3].tolist() == [True, True, True, True, False, False, False]  # y_w is plainly causal
    assert bool(m[6, 6]) and not bool(m[:6, 6].any())  # padding: never a key, but its own query is not all-masked


@pytest.mark.parametrize("loss_name", ["dpo", "simpo"])
def test_shared_equals_plain(model, loss_name):
    _, plain, v_plain, g_plain = _run(model, PreferenceCollator(0), loss_name, want=True)
    _, shared, v_shared, g_shared = _run(model, PreferenceCollator(0, share_prompt=True), loss_name, want=True)
    torch.testing.assert_close(shared.logps, plain.logps, atol=1e-5, rtol=1e-5)
    assert shared.lengths.tolist() == plain.lengths.tolist() == [3, 5, 1, 2, 1, 6]
    assert torch.equal(shared.token_mask, plain.token_mask)
    torch.testing.assert_close(shared.token_logps, plain.token_logps, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(shared.token_entropies, plain.token_entropies, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(v_shared, v_plain, atol=1e-6, rtol=1e-5)
    assert g_shared.keys() == g_plain.keys()
    for name in g_plain:
        torch.testing.assert_close(g_shared[name], g_plain[name], atol=1e-5, rtol=1e-4, msg=name)


def test_without_the_mask_the_rejected_logps_differ(model, monkeypatch):
    """The equality above is not vacuous: letting y_l see y_w (plain causal mask) changes its log-probs.  (The
    split attention, which needs no mask, has its own such test in test_fastpath_split.py.)"""
    from prefzoo.model.fast import prompt as fastpath_prompt

    monkeypatch.setattr(fastpath_prompt, "split_refusal", lambda *a: "the masked path under test")
    b = PreferenceCollator(0, share_prompt=True)(EXAMPLES)
    orig = fastpath_prompt.shared_prompt_mask
    try:
        fastpath_prompt.shared_prompt_mask = lambda seg: orig(torch.where(seg == 3, 2, seg))  # no y_l → y_w block
        with torch.no_grad():
            leaky = PolicyLogps(model)(b["input_ids"], b["attention_mask"], b["completion_mask"])
    finally:
        fastpath_prompt.shared_prompt_mask = orig
    with torch.no_grad():
        good = PolicyLogps(model)(b["input_ids"], b["attention_mask"], b["completion_mask"])
    torch.testing.assert_close(leaky.logps[:3], good.logps[:3])  # y_w unaffected
    assert not torch.allclose(leaky.logps[3:], good.logps[3:], atol=1e-4)


def test_every_layer_gets_one_shared_additive_mask_equal_to_sdpas_own_conversion(monkeypatch):
    """SDPA gets one float mask (0 / -inf) for every layer, built once; the log-probs and gradients are bit for bit
    those of handing each layer the boolean mask (which SDPA converts, and autograd keeps, once per layer)."""
    from prefzoo.model.fast import prompt as fastpath_prompt
    from tests.support.tiny import build_model, build_tokenizer

    m = build_model(build_tokenizer(), seed=4)
    m.config._attn_implementation = "sdpa"
    monkeypatch.setattr(fastpath_prompt, "split_refusal", lambda *a: "the masked path under test")
    seen: list[torch.Tensor] = []
    sdpa = torch.nn.functional.scaled_dot_product_attention

    def spy(*a, **k):
        seen.append(k["attn_mask"])
        return sdpa(*a, **k)

    monkeypatch.setattr(torch.nn.functional, "scaled_dot_product_attention", spy)
    _, shared, value, grads = _run(m, PreferenceCollator(0, share_prompt=True), "simpo")
    assert len(seen) == m.config.num_hidden_layers >= 2
    assert all(t.dtype == torch.float32 and t.data_ptr() == seen[0].data_ptr() for t in seen)
    b = PreferenceCollator(0, share_prompt=True)(EXAMPLES)
    allowed = fastpath_prompt.shared_prompt_mask(b["completion_mask"])  # the collator's segment ids
    assert torch.equal(seen[0], torch.where(allowed, 0.0, float("-inf")))

    monkeypatch.setattr(fastpath_prompt, "_attention_mask_for", lambda config, allowed, dtype, feature="": allowed)
    _, boolean, value_b, grads_b = _run(m, PreferenceCollator(0, share_prompt=True), "simpo")
    assert seen[-1].dtype == torch.bool  # the comparison really ran with the boolean mask
    assert torch.equal(shared.logps, boolean.logps) and torch.equal(value, value_b)
    assert grads.keys() == grads_b.keys() and all(torch.equal(grads[n], grads_b[n]) for n in grads)


def test_unsupported_attention_is_a_clear_error():
    from tests.support.tiny import build_model, build_tokenizer

    m = build_model(build_tokenizer(), seed=4)
    m.config._attn_implementation = "flash_attention_2"
    b = PreferenceCollator(0, share_prompt=True)(EXAMPLES)
    with pytest.raises(SharedPromptError, match="sdpa"):
        PolicyLogps(m)(b["input_ids"], b["attention_mask"], b["completion_mask"])
