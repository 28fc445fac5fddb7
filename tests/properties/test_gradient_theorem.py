"""Theorem 3.1 for `mmpo-no-aux`: −∂L/∂log π(y_w) = σ(s_w − s_l), −∂L/∂log π(y_l) = σ(s_l − s_w), for every input.

Checked on the scores (Hypothesis, float64, the whole domain including s_l > s_w)
and through a real tiny causal LM, where ∇θ L must equal
−σ(s_w − s_l)∇θ log π(y_w) − σ(s_l − s_w)∇θ log π(y_l), each gradient computed separately.
"""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, target
from hypothesis import strategies as st

import prefzoo
from prefzoo.testing import loss_params
from tests.properties._helpers import F64

SPEC = prefzoo.loss_spec("mmpo-no-aux")


def _scores(pw, pl, qw, ql, p):
    """s_w, s_l written out from the listing (not taken from prefzoo): s = log π + R̂, R̂ = (R + ε − min)/(max + ε − min).

    R_w = r_ε + β·log π_ref(y_w), R_l = r_l + β·log π_ref(y_l), min and max over both responses of the batch.
    """
    R_w, R_l = p.reward_epsilon + p.beta * qw, p.rejected_reward + p.beta * ql
    R = torch.cat((R_w, R_l))
    d = R.max() + p.norm_eps - R.min()
    if float(d) > 0:
        R_w, R_l = (R_w + p.norm_eps - R.min()) / d, (R_l + p.norm_eps - R.min()) / d
    else:
        R_w, R_l = torch.zeros_like(R_w), torch.zeros_like(R_l)
    return pw + R_w, pl + R_l


# score margins Δs = s_w − s_l: mostly inside the transition region 1 < |Δs| ≤ 30 where σ is neither ½ nor 0/1,
# plus small margins and a few saturated ones and exact ties.
_inside = st.floats(1.5, 30.0).flatmap(lambda m: st.sampled_from([m, -m]))
_small = st.floats(-1.0, 1.0)
_ends = st.sampled_from([0.0, 35.0, -35.0])
margins = st.integers(0, 9).flatmap(lambda k: _inside if k < 7 else _small if k < 9 else _ends)  # ~70% inside


@st.composite
def pairs_with_margins(draw):
    """A float64 batch built backwards from drawn margins: references and log π_w drawn, log π_l solved for Δs."""
    b = draw(st.integers(1, 12))
    p = draw(loss_params(SPEC))
    logp = st.floats(-200.0, -0.01)
    qw = torch.tensor(draw(st.lists(logp, min_size=b, max_size=b)), dtype=F64)
    ql = torch.tensor(draw(st.lists(logp, min_size=b, max_size=b)), dtype=F64)
    pw = torch.tensor(draw(st.lists(logp, min_size=b, max_size=b)), dtype=F64)
    dm = torch.tensor(draw(st.lists(margins, min_size=b, max_size=b)), dtype=F64)
    # R̂ does not depend on the policy: solve log π_l = s_l − R̂_l with s_l = s_w − Δs
    zero = torch.zeros_like(pw)
    rw, rl = _scores(zero, zero, qw, ql, p)  # R̂_w, R̂_l
    pl = pw + rw - dm - rl
    return prefzoo.PreferenceBatch(pw.clone().requires_grad_(), pl.clone().requires_grad_(), qw, ql), p, dm


@given(case=pairs_with_margins())
def test_sigmoid_weights_for_every_input(case):
    b, params, margin = case
    out = prefzoo.Loss(SPEC, params)(b)
    gw, gl = torch.autograd.grad(out.losses.sum(), [b.policy_chosen_logps, b.policy_rejected_logps])
    s_w, s_l = _scores(b.policy_chosen_logps.detach(), b.policy_rejected_logps.detach(), b.ref_chosen_logps,
                       b.ref_rejected_logps, params)
    # the built margin is the margin the formula sees, up to the rounding of log π_l = log π_w + R̂_w − Δs − R̂_l
    scale = 1 + float(b.policy_chosen_logps.detach().abs().max())
    torch.testing.assert_close(s_w - s_l, margin, rtol=0, atol=1e-12 * scale)
    err = torch.maximum((-gw - torch.sigmoid(s_w - s_l)).abs(), (-gl - torch.sigmoid(s_l - s_w)).abs())
    target(float(err.max()) * 1e12, label="weight error × 1e12")
    torch.testing.assert_close(-gw, torch.sigmoid(s_w - s_l), rtol=1e-9, atol=1e-12)
    torch.testing.assert_close(-gl, torch.sigmoid(s_l - s_w), rtol=1e-9, atol=1e-12)


def test_margins_cover_the_transition_region():
    """The strategy is not all ties and saturation: most drawn pairs have 1 < |Δs| ≤ 30."""
    from hypothesis import settings

    seen: list[float] = []

    @settings(max_examples=200, database=None, derandomize=True)
    @given(case=pairs_with_margins())
    def collect(case):
        seen.extend(case[2].tolist())

    collect()
    inside = sum(1 < abs(m) <= 30 for m in seen)
    assert inside >= 0.5 * len(seen), (inside, len(seen))


def test_hand_computed_weights():
    """β = 0 and r_ε = r_l = 0, ε = 0: R = 0 everywhere so R̂ = 0 and s = log π.

    Pair (log π_w, log π_l) = (−3, −1): Δs = −2, so −∂L/∂log π_w = σ(−2) = 0.11920292202211757 and
    −∂L/∂log π_l = σ(2) = 0.8807970779778823.  The (−1, 0) of the listing or a sign error cannot give these.
    """
    p = SPEC.params(beta=0.0, reward_epsilon=0.0, rejected_reward=0.0, norm_eps=0.0)
    pw = torch.tensor([-3.0], dtype=F64, requires_grad=True)
    pl = torch.tensor([-1.0], dtype=F64, requires_grad=True)
    z = torch.zeros(1, dtype=F64)
    out = prefzoo.Loss(SPEC, p)(prefzoo.PreferenceBatch(pw, pl, z, z))
    gw, gl = torch.autograd.grad(out.losses.sum(), [pw, pl])
    assert -gw.item() == pytest.approx(0.11920292202211757, rel=1e-14)
    assert -gl.item() == pytest.approx(0.8807970779778823, rel=1e-14)


def test_theorem_holds_where_rejected_scores_higher():
    """The weights are σ of the score difference also when s_l > s_w (the paper states the case s_l ≤ s_w)."""
    pw, pl = torch.tensor([-30.0, -5.0], dtype=F64), torch.tensor([-2.0, -4.0], dtype=F64)
    qw, ql = torch.tensor([-10.0, -3.0], dtype=F64), torch.tensor([-1.0, -8.0], dtype=F64)
    b = prefzoo.PreferenceBatch(pw.clone().requires_grad_(), pl.clone().requires_grad_(), qw, ql)
    params = SPEC.params()
    s_w, s_l = _scores(pw, pl, qw, ql, params)
    assert bool((s_l > s_w).all())
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
    s_w, s_l = _scores(lw.detach(), ll.detach(), ref_w, ref_l, loss.params)  # independent of prefzoo
    # the pairs exercise both orders, and two sit in the transition region (weights between 0.05 and 0.95)
    assert bool(((s_w - s_l) < 0).any()) and bool(((s_w - s_l) > 0).any()), (s_w - s_l)
    assert int((torch.sigmoid(s_w - s_l) - 0.5).abs().lt(0.45).sum()) >= 2, (s_w - s_l)
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
