"""Theorem 3.1 for `mmpo-no-aux`: −∂L/∂log π(y_w) = σ(s_w − s_l), −∂L/∂log π(y_l) = σ(s_l − s_w), for every input.

Checked on the scores (Hypothesis, float64, the whole domain including s_l > s_w)
and through a real tiny causal LM, where ∇θ L must equal
−σ(s_w − s_l)∇θ log π(y_w) − σ(s_l − s_w)∇θ log π(y_l), each gradient computed separately.
"""

from __future__ import annotations

import pytest
import torch
from hypothesis import given

import prefzoo
from prefzoo.testing import loss_params, preference_batches
from tests.properties._helpers import F64, leaves64, mmpo_scores

SPEC = prefzoo.loss_spec("mmpo-no-aux")


@given(batch=preference_batches(dtypes=("float64",), reference=True), params=loss_params(SPEC))
def test_sigmoid_weights_for_every_input(batch, params):
    b = leaves64(batch)
    out = prefzoo.Loss(SPEC, params)(b)
    gw, gl = torch.autograd.grad(out.losses.sum(), [b.policy_chosen_logps, b.policy_rejected_logps])
    s_w, s_l = mmpo_scores(b, params)  # independent of prefzoo.losses.mmpo
    torch.testing.assert_close(-gw, torch.sigmoid(s_w - s_l), rtol=1e-9, atol=1e-12)
    torch.testing.assert_close(-gl, torch.sigmoid(s_l - s_w), rtol=1e-9, atol=1e-12)


def test_theorem_holds_where_rejected_scores_higher():
    """The weights are σ of the score difference also when s_l > s_w (the paper states the case s_l ≤ s_w)."""
    b = leaves64(prefzoo.PreferenceBatch(
        torch.tensor([-30.0, -5.0], dtype=F64), torch.tensor([-2.0, -4.0], dtype=F64),
        torch.tensor([-10.0, -3.0], dtype=F64), torch.tensor([-1.0, -8.0], dtype=F64)))
    params = SPEC.params()
    s_w, s_l = mmpo_scores(b, params)
    assert bool((s_l > s_w).any())
    out = prefzoo.Loss(SPEC, params)(b)
    gw, gl = torch.autograd.grad(out.losses.sum(), [b.policy_chosen_logps, b.policy_rejected_logps])
    torch.testing.assert_close(-gw, torch.sigmoid(s_w - s_l))
    torch.testing.assert_close(-gl, torch.sigmoid(s_l - s_w))


def _tiny_llama():
    transformers = pytest.importorskip("transformers", reason="the tiny-LM theorem test needs the [train] extra")
    cfg = transformers.LlamaConfig(vocab_size=11, hidden_size=16, intermediate_size=32, num_hidden_layers=2,
                                   num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=32)
    torch.manual_seed(0)
    return transformers.LlamaForCausalLM(cfg).to(F64).eval()


def _seq_logp(model, prompt: list[int], completion: list[int]) -> torch.Tensor:
    """log π(y|x) = Σ_t log π(y_t | x, y_<t), summed over completion tokens only."""
    ids = torch.tensor([prompt + completion])
    logits = model(input_ids=ids).logits[0, :-1]  # (L−1, V) predicts tokens 1..L−1
    logp = torch.log_softmax(logits, dim=-1).gather(1, ids[0, 1:, None])[:, 0]  # (L−1,)
    return logp[len(prompt) - 1 :].sum()


def test_theorem_through_a_tiny_causal_lm():
    model = _tiny_llama()
    params = list(model.parameters())
    pairs = [([1, 2, 3], [4, 5], [6, 7, 8]), ([2, 9], [3, 3, 3, 1], [10]), ([5], [1], [2, 2])]
    ref_w = torch.tensor([-9.0, -12.0, -3.0], dtype=F64)
    ref_l = torch.tensor([-7.0, -2.5, -6.0], dtype=F64)
    lw = torch.stack([_seq_logp(model, x, yw) for x, yw, _ in pairs])
    ll = torch.stack([_seq_logp(model, x, yl) for x, _, yl in pairs])
    loss = prefzoo.get_loss("mmpo-no-aux", beta=0.5)
    out = loss(prefzoo.PreferenceBatch(lw, ll, ref_w, ref_l))
    grad_loss = torch.autograd.grad(out.losses.sum(), params, retain_graph=True)
    s_w, s_l = out.chosen_rewards, out.rejected_rewards
    assert bool(((s_w - s_l) < 0).any()) or bool(((s_w - s_l) > 0).any())
    expected = [torch.zeros_like(p) for p in params]
    for i, (x, yw, yl) in enumerate(pairs):  # each ∇θ log π(y|x) computed on its own
        g_w = torch.autograd.grad(_seq_logp(model, x, yw), params)
        g_l = torch.autograd.grad(_seq_logp(model, x, yl), params)
        w_w, w_l = torch.sigmoid(s_w[i] - s_l[i]), torch.sigmoid(s_l[i] - s_w[i])
        for e, a, b in zip(expected, g_w, g_l, strict=True):
            e -= w_w * a + w_l * b
    # Llama's RMSNorm and rotary embedding compute in float32 even in a float64 model, so per-sequence
    # gradients carry float32 rounding: tolerance 1e-5 of the largest gradient entry.
    scale = max(float(w.abs().max()) for w in expected)
    for got, want in zip(grad_loss, expected, strict=True):
        torch.testing.assert_close(got, want, rtol=0, atol=1e-5 * scale)
    # and it is not the MMPO listing's gradient (−∇log π(y_w) only): the rejected response contributes
    nll_only = torch.autograd.grad(-lw.sum(), params)
    assert max(float((a - b).abs().max()) for a, b in zip(grad_loss, nll_only, strict=True)) > 1e-2 * scale
