"""logsumexp stability: scores down to −1e5 and gaps up to 1e4 give finite losses and gradients matching float64.

Stated tolerances (inputs are exactly representable in the dtype, the loss computes bf16 in float32):
  loss:     |L − L₆₄| ≤ 8·u·(1 + |s_w| + |s_l|)      u = 2⁻⁵³ (float64), 2⁻²⁴ (float32, bfloat16)
  gradient: |∂L/∂log π − (∂L/∂log π)₆₄| ≤ 8·u·(1 + |s_w| + |s_l|)   (σ weights are exp(s − lse))
            plus 2⁻⁸·|∂L/∂log π| for bf16, whose gradient is stored in bf16
Run on the shipped losses with drawn params and references: ``mmpo`` (normalized, the listing), ``mmpo-no-aux``
and ``mmpo-no-norm``.  The same check fails on a naive log(exp(a) + exp(b)) loss (the registered mutant), so it bites.
"""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, target
from hypothesis import strategies as st

import prefzoo
from prefzoo.testing import loss_params
from prefzoo.testing.reference import lse2

U = {torch.float64: 2.0**-53, torch.float32: 2.0**-24, torch.bfloat16: 2.0**-24}


@st.composite
def extreme_pairs(draw, dtype):
    b = draw(st.integers(1, 16))
    s_w = draw(st.lists(st.floats(-1e5, 0.0), min_size=b, max_size=b))
    gap = draw(st.lists(st.floats(-1e4, 1e4), min_size=b, max_size=b))
    pw = torch.tensor(s_w, dtype=torch.float64).to(dtype)
    pl = (pw.double() - torch.tensor(gap, dtype=torch.float64)).clamp(min=-1.1e5).to(dtype)
    return pw, pl


@st.composite
def references(draw, b: int):
    """log π_ref of both responses in [−200, 0]: R̂ is then a number in [0, 1] added to the extreme log π."""
    logp = st.floats(-200.0, 0.0)
    return (torch.tensor(draw(st.lists(logp, min_size=b, max_size=b)), dtype=torch.float64),
            torch.tensor(draw(st.lists(logp, min_size=b, max_size=b)), dtype=torch.float64))


def _expected(name, a, c, qw, ql, p):
    """Float64 loss and weights from the formulas, computed here: s = log π + R̂ (R for mmpo-no-norm)."""
    R_w, R_l = p.reward_epsilon + p.beta * qw, p.rejected_reward + p.beta * ql
    if name != "mmpo-no-norm":
        R = torch.cat((R_w, R_l))
        d = R.max() + p.norm_eps - R.min()
        R_w, R_l = ((R_w + p.norm_eps - R.min()) / d, (R_l + p.norm_eps - R.min()) / d) if float(d) > 0 else (
            torch.zeros_like(R_w), torch.zeros_like(R_l))
    s_w, s_l = a + R_w, c + R_l
    if name == "mmpo-no-aux":
        return s_w, s_l, -lse2(s_w, s_l), -torch.sigmoid(s_w - s_l), -torch.sigmoid(s_l - s_w)
    return s_w, s_l, -s_w, -torch.ones_like(a), torch.zeros_like(a)  # the listing's loss is −s_w exactly


def _check_extremes(loss, name, dtype, pw, pl, qw, ql):
    b = prefzoo.PreferenceBatch(pw.clone().requires_grad_(), pl.clone().requires_grad_(), qw.to(dtype), ql.to(dtype))
    out = loss(b)
    gw, gl = torch.autograd.grad(out.losses.sum(), [b.policy_chosen_logps, b.policy_rejected_logps])
    a, c = pw.double(), pl.double()  # the same (rounded) inputs in float64
    s_w, s_l, want, want_gw, want_gl = _expected(name, a, c, qw.to(dtype).double(), ql.to(dtype).double(), loss.params)
    u = U[dtype]
    # R̂ itself is computed in the working precision: its error is a few u relative to the reward range
    r_err = 0.0 if dtype == torch.float64 else 64 * u * (1 + 200 * loss.params.beta + 1) / max(
        float(torch.cat((s_w - a, s_l - c)).max() - torch.cat((s_w - a, s_l - c)).min()), 1e-3)
    tol = 8 * u * (1 + s_w.abs() + s_l.abs()) + min(r_err, 1.0)
    err = (out.losses.detach().double() - want).abs()
    assert bool(torch.isfinite(out.losses).all()) and bool(torch.isfinite(gw).all()) and bool(torch.isfinite(gl).all())
    assert bool((err <= tol).all()), (name, err.max(), pw, pl)
    store = 2.0**-8 if dtype == torch.bfloat16 else 0.0  # the gradient of a bf16 leaf is rounded to bf16
    gtol = 8 * u * (1 + s_w.abs() + s_l.abs()) + min(r_err, 1.0)  # exp(s − lse) inherits lse's error u·|s|
    assert bool(((gw.double() - want_gw).abs() <= gtol + store * want_gw.abs()).all()), name
    assert bool(((gl.double() - want_gl).abs() <= gtol + store * want_gl.abs()).all()), name
    return float((err / tol).max())


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("name", ["mmpo", "mmpo-no-aux", "mmpo-no-norm"])
@given(data=st.data())
def test_extreme_scores_match_float64(name, dtype, data):
    """The shipped losses, normalization included, with drawn params and references, at scores down to −1e5."""
    pw, pl = data.draw(extreme_pairs(dtype), label="log π")
    qw, ql = data.draw(references(pw.shape[0]), label="log π_ref")
    params = data.draw(loss_params(prefzoo.loss_spec(name)), label="params")
    ratio = _check_extremes(prefzoo.Loss(prefzoo.loss_spec(name), params), name, dtype, pw, pl, qw, ql)
    target(ratio, label="loss error over its tolerance")


def test_a_naive_logsumexp_loss_fails_the_same_check():
    """The check bites: the registered naive-logsumexp mutant of mmpo-no-aux fails it at the stated extremes."""
    from tests.properties.mutants import mutant_registry

    a = torch.tensor([-1e5, -5e4, -800.0], dtype=torch.float64)
    c = a - 1e4
    q = torch.tensor([-10.0, -20.0, -30.0], dtype=torch.float64)
    prefzoo.reset_registry(mutant_registry())
    try:
        spec = prefzoo.loss_spec("mutant-naive-lse")
        with pytest.raises(AssertionError):
            _check_extremes(prefzoo.Loss(spec, spec.params()), "mmpo-no-aux", torch.float64, a, c, q, q - 1)
    finally:
        prefzoo.reset_registry()
    # and the shipped loss passes it on the same inputs
    spec = prefzoo.loss_spec("mmpo-no-aux")
    _check_extremes(prefzoo.Loss(spec, spec.params()), "mmpo-no-aux", torch.float64, a, c, q, q - 1)


def test_hand_computed_extreme_value():
    """β = 0, r_ε = r_l = 0, ε = 0 (R̂ = 0): log π = (−1e5, −1e5 − 1e4) gives −logsumexp = 1e5 exactly in float64
    (e^{−1e4} vanishes next to 1), where log(e^a + e^b) is log 0 = −inf."""
    loss = prefzoo.get_loss("mmpo-no-aux", beta=0.0, reward_epsilon=0.0, rejected_reward=0.0, norm_eps=0.0)
    z = torch.zeros(1, dtype=torch.float64)
    a = torch.tensor([-1e5], dtype=torch.float64)
    out = loss(prefzoo.PreferenceBatch(a, a - 1e4, z, z))
    assert out.losses.tolist() == [1e5]
