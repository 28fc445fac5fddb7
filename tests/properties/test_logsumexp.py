"""logsumexp stability: scores down to −1e5 and gaps up to 1e4 give finite losses and gradients matching float64.

Stated tolerances (inputs are exactly representable in the dtype, the loss computes bf16 in float32):
  loss:     |L − L₆₄| ≤ 8·u·(1 + |s_w| + |s_l|)      u = 2⁻⁵³ (float64), 2⁻²⁴ (float32, bfloat16)
  gradient: |∂L/∂log π − (∂L/∂log π)₆₄| ≤ 8·u·(1 + |s_w| + |s_l|)   (σ weights are exp(s − lse))
            plus 2⁻⁸·|∂L/∂log π| for bf16, whose gradient is stored in bf16
The same inputs make a naive log(exp(a) + exp(b)) return −inf or NaN, so the test bites.
"""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, target
from hypothesis import strategies as st

import prefzoo
from prefzoo.testing.reference import lse2, naive_lse2

U = {torch.float64: 2.0**-53, torch.float32: 2.0**-24, torch.bfloat16: 2.0**-24}


@st.composite
def extreme_pairs(draw, dtype):
    b = draw(st.integers(1, 16))
    s_w = draw(st.lists(st.floats(-1e5, 0.0), min_size=b, max_size=b))
    gap = draw(st.lists(st.floats(-1e4, 1e4), min_size=b, max_size=b))
    pw = torch.tensor(s_w, dtype=torch.float64).to(dtype)
    pl = (pw.double() - torch.tensor(gap, dtype=torch.float64)).clamp(min=-1.1e5).to(dtype)
    return pw, pl


def _no_norm_batch(pw, pl):
    z = torch.zeros_like(pw)
    return prefzoo.PreferenceBatch(pw.clone().requires_grad_(), pl.clone().requires_grad_(), z, z)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("name", ["mmpo-no-aux", "mmpo"])
@given(data=st.data())
def test_extreme_scores_match_float64(name, dtype, data):
    pw, pl = data.draw(extreme_pairs(dtype))
    # β = 0, r = 0 and ε = 0 make s = log π exactly (normalization maps constant rewards to 0)
    loss = prefzoo.get_loss("mmpo-no-norm" if name == "mmpo" else name, beta=0.0, reward_epsilon=0.0,
                            rejected_reward=0.0, norm_eps=0.0)
    b = _no_norm_batch(pw, pl)
    out = loss(b)
    gw, gl = torch.autograd.grad(out.losses.sum(), [b.policy_chosen_logps, b.policy_rejected_logps])
    a, c = pw.double(), pl.double()  # the same (rounded) inputs in float64
    want = -lse2(a, c) if name == "mmpo-no-aux" else -a
    want_gw = -torch.sigmoid(a - c) if name == "mmpo-no-aux" else -torch.ones_like(a)
    want_gl = -torch.sigmoid(c - a) if name == "mmpo-no-aux" else torch.zeros_like(a)
    u = U[dtype]
    err = (out.losses.detach().double() - want).abs()
    target(float(err.max() / (u * (1 + a.abs() + c.abs())).max()), label="loss error in units of u·|s|")
    assert bool(torch.isfinite(out.losses).all()) and bool(torch.isfinite(gw).all()) and bool(torch.isfinite(gl).all())
    assert bool((err <= 8 * u * (1 + a.abs() + c.abs())).all()), (err.max(), pw, pl)
    gtol = 8 * u * (1 + a.abs() + c.abs())  # exp(s − lse) inherits lse's absolute error u·|s|
    store = 2.0**-8 if dtype == torch.bfloat16 else 0.0  # the gradient of a bf16 leaf is rounded to bf16
    assert bool(((gw.double() - want_gw).abs() <= gtol + store * want_gw.abs()).all())
    assert bool(((gl.double() - want_gl).abs() <= gtol + store * want_gl.abs()).all())


@given(data=st.data())
def test_naive_logsumexp_fails_on_the_same_inputs(data):
    """The same domain defeats log(exp(a) + exp(b)) whenever both scores are below about −745."""
    pw, pl = data.draw(extreme_pairs(torch.float64))
    a, c = pw.double(), pl.double()
    deep = (a < -800) & (c < -800)
    naive = naive_lse2(a, c)
    assert bool(torch.isfinite(lse2(a, c)).all())
    assert not bool(torch.isfinite(naive[deep]).any())  # every deep pair breaks the naive formula


def test_naive_logsumexp_fails_at_the_stated_extremes():
    a = torch.tensor([-1e5, -5e4, -800.0], dtype=torch.float64)
    c = a - 1e4
    assert not bool(torch.isfinite(naive_lse2(a, c)).any())
    torch.testing.assert_close(lse2(a, c), a)  # the gap of 1e4 makes e^{c − a} vanish
    loss = prefzoo.get_loss("mmpo-no-aux", beta=0.0, reward_epsilon=0.0, rejected_reward=0.0, norm_eps=0.0)
    torch.testing.assert_close(loss(_no_norm_batch(a, c)).losses.detach(), -a)
