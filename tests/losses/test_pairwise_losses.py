"""Hand-derived values of the pairwise losses added for issue 12, and the capped exponentials' numerics.

The formula and TRL comparisons live in test_formulas.py (paper transcriptions) and test_trl_code.py (TRL 1.16's
own loss code); here each loss has one case worked out by hand, and the f-DPO / DiscoPOP / IPO caps are shown to
keep a finite gradient that still raises the chosen margin far beyond them, with no cliff at the cap.
"""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

import prefzoo

F64 = torch.float64


def _grads(name, params, pw, pl, rw=None, rl=None, lw=None, ll=None, dtype=F64):
    t = lambda v: torch.tensor(v, dtype=dtype)  # noqa: E731
    pw, pl = t(pw).requires_grad_(), t(pl).requires_grad_()
    batch = prefzoo.PreferenceBatch(
        pw, pl, None if rw is None else t(rw), None if rl is None else t(rl),
        None if lw is None else torch.tensor(lw), None if ll is None else torch.tensor(ll),
    )  # fmt: skip
    out = prefzoo.get_loss(name, **params)(batch)
    gw, gl = torch.autograd.grad(out.losses.sum(), (pw, pl), allow_unused=True, materialize_grads=True)
    return out.losses.detach(), gw, gl


# name, params, (pw, pl, rw, rl, lw, ll), expected losses, expected ∂L/∂log π(y_w), expected ∂L/∂log π(y_l)
HAND = [
    # dpop, β = 0.5, λ = 1: ρ_w = −3 − (−1) = −2, ρ_l = −2; z = β(ρ_w − ρ_l − λ·max(0, 2)) = −1; L = log(1 + e);
    # ∂L/∂pw = −σ(1)·β(1 + λ) = −σ(1), ∂L/∂pl = σ(1)·β.  Pair 2: ρ_w = +1 ≥ 0, no penalty: plain DPO at z = 0.5·2.
    ("dpop", {"beta": 0.5, "dpop_lambda": 1.0}, ([-3.0, -1.0], [-4.0, -3.0], [-1.0, -2.0], [-2.0, -2.0], None, None),
     [math.log1p(math.e), math.log1p(math.exp(-1.0))], [-1 / (1 + math.exp(-1)), -0.5 / (1 + math.e)],
     [0.5 / (1 + math.exp(-1)), 0.5 / (1 + math.e)]),
    # simper: exp(−2/2) = e^−1, exp(−6/3) = e^−2; L = −e^−1 + e^−2; ∂L/∂pw = −e^−1/2, ∂L/∂pl = e^−2/3
    ("simper", {}, ([-2.0], [-6.0], None, None, [2], [3]),
     [-math.exp(-1) + math.exp(-2)], [-math.exp(-1) / 2], [math.exp(-2) / 3]),
    # slic, δ = 1, λ = 0.5: max(0, 1 + 3 − 2.5) = 1.5, −λ·pw = 1.5; pair 2 past the margin: hinge 0, L = 0.5·1
    ("slic", {}, ([-3.0, -1.0], [-2.5, -4.0], None, None, None, None), [3.0, 0.5], [-1.5, -0.5], [1.0, 0.0]),
    # cpo-simpo, β = 2, γ/β = 0.5, α = 1: averages −4/2 = −2, −9/3 = −3; z = 2·(1) − 1 = 1; L = log(1 + e^−1) + 2
    # ∂L/∂pw = −σ(−1)·2/2 − 1/2, ∂L/∂pl = σ(−1)·2/3
    ("cpo-simpo", {}, ([-4.0], [-9.0], None, None, [2], [3]), [math.log1p(math.exp(-1)) + 2.0],
     [-1 / (1 + math.e) - 0.5], [2 / 3 / (1 + math.e)]),
    # cpo-hinge, β = 0.1, α = 1: max(0, 1 − 0.1·5) = 0.5, NLL 4/2 = 2; ∂L/∂pw = −0.1 − 1/2, ∂L/∂pl = 0.1
    ("cpo-hinge", {}, ([-4.0], [-9.0], None, None, [2], [3]), [2.5], [-0.6], [0.1]),
    # cpo-ipo, β = 1, α = 1: (−2 + 3 − 0.5)² = 0.25, NLL 2; ∂L/∂pw = 2·0.5/2 − 1/2 = 0, ∂L/∂pl = −2·0.5/3
    ("cpo-ipo", {"beta": 1.0}, ([-4.0], [-9.0], None, None, [2], [3]), [2.25], [0.0], [-1 / 3]),
    # rpo, β = 0.1, α = 1, batch tokens: ρ = 0 so DPO gives log 2 each; NLL shares N·(−pw)/Σ|y_w| = 2·4/6, 2·6/6
    ("rpo", {}, ([-4.0, -6.0], [-1.0, -1.0], [-4.0, -6.0], [-1.0, -1.0], [2, 4], [1, 1]),
     [math.log(2) + 4 / 3, math.log(2) + 2.0], [-0.05 - 1 / 3, -0.05 - 1 / 3], [0.05, 0.05]),
    # sft, batch tokens: the same shares; example: −pw/|y_w| = 2, 1.5
    ("sft", {"nll_reduction": "batch-tokens"}, ([-4.0, -6.0], [-1.0, -1.0], None, None, [2, 4], [1, 1]),
     [4 / 3, 2.0], [-1 / 3, -1 / 3], [0.0, 0.0]),
    ("sft", {}, ([-4.0, -6.0], [-1.0, -1.0], None, None, [2, 4], [1, 1]), [2.0, 1.5], [-0.5, -0.25], [0.0, 0.0]),
]  # fmt: skip


@pytest.mark.parametrize(("name", "params", "x", "loss", "gw", "gl"), HAND, ids=[f"{h[0]}-{i}" for i, h in
                                                                                  enumerate(HAND)])
def test_hand_derived(name, params, x, loss, gw, gl):
    got = _grads(name, params, *x)
    for g, w in zip(got, (loss, gw, gl), strict=True):
        torch.testing.assert_close(g, torch.tensor(w, dtype=F64), rtol=1e-12, atol=1e-12)


def test_batch_token_nll_is_gathered_across_processes():
    """Split over 2 ranks with the gather hook, the batch-token NLL shares equal one process on the whole batch."""
    from prefzoo.testing.properties import check_sharded_gather

    t = lambda v: torch.tensor(v, dtype=F64)  # noqa: E731
    b = prefzoo.PreferenceBatch(t([-4.0, -6.0, -1.0, -9.0]), t([-1.0, -2.0, -3.0, -4.0]), t([-3.0, -5.0, -1.0, -8.0]),
                                t([-2.0, -2.0, -2.0, -2.0]), torch.tensor([2, 4, 1, 7]), torch.tensor([1, 3, 2, 2]))
    for name, params in [("rpo", {}), ("sft", {"nll_reduction": "batch-tokens"}),
                         ("orpo", {"nll_reduction": "batch-tokens"})]:
        check_sharded_gather(prefzoo.get_loss(name, **params), b, shards=2)


# ---- numerics: exponentials and squares capped without losing the gradient ----------------------------------------

# (loss, params, which log-ratio is pushed far out, its sign): at those ρ the f-DPO scores e^{±aρ} pass the cap
EXTREMES = [
    ("dpo", {"f_divergence": "forward_kl"}, "w", -1),
    ("dpo", {"f_divergence": "alpha_divergence", "alpha_divergence_coef": 0.3}, "w", -1),
    ("dpo", {"f_divergence": "alpha_divergence", "alpha_divergence_coef": 3.0}, "l", +1),
    ("sigmoid-norm", {"f_divergence": "forward_kl"}, "w", -1),
    ("discopop", {"tau": 2.0}, "w", -1),
    ("discopop", {"tau": 5.0, "f_divergence": "forward_kl"}, "w", -1),
    ("ipo", {"f_divergence": "forward_kl"}, "w", -1),
    ("ipo", {"f_divergence": "alpha_divergence", "alpha_divergence_coef": 3.0}, "l", +1),
    ("ipo", {}, "w", -1),  # reverse KL: |Δ̄| passes 1e18 only at such ρ, but float32 lets a batch carry them
]


def _at(name, params, side, rho, other, dtype, length=3):
    """Loss and gradient with ρ on ``side`` (reference log-probs 0) and ``other`` on the other side."""
    pw, pl = (rho, other) if side == "w" else (other, rho)
    loss, gw, gl = _grads(name, params, [pw], [pl], [0.0], [0.0], [length], [length], dtype=dtype)
    return loss.double(), gw.double(), gl.double()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize(("name", "params", "side", "sign"), EXTREMES, ids=[f"{e[0]}-{i}" for i, e in
                                                                             enumerate(EXTREMES)])
def test_gradient_is_finite_and_points_back_at_extreme_log_ratios(name, params, side, sign, dtype):
    """|ρ| from 100 to 1e15, far past any summed log-prob (float32 and bfloat16 inputs, computed in float32; the
    cap's slope e^80·0.01/u² leaves float32 past u ≈ 1e18): the loss and the gradient are
    finite, and the gradient of the far-out side is non-zero and pulls it back, raising the chosen margin."""

    @given(exponent=st.floats(2.0, 15.0), other=st.floats(-20.0, 0.0))
    def run(exponent, other):
        loss, gw, gl = _at(name, params, side, sign * 10.0**exponent, other, dtype)
        assert torch.isfinite(loss).all() and torch.isfinite(gw).all() and torch.isfinite(gl).all(), (loss, gw, gl)
        pulls_back = float(gw) < 0 if side == "w" else float(gl) > 0  # a clamp leaves this side's gradient 0
        assert pulls_back and float(gw - gl) < 0, (exponent, loss, gw, gl)

    run()


# (loss, params, side, sign, ρ where the cap is reached): e^{x} capped at x = 80, IPO's square at |Δ̄ − 1/(2β)| = 1e18
CAPS = [
    ("dpo", {"f_divergence": "forward_kl"}, "w", -1, 80.0),
    ("dpo", {"f_divergence": "alpha_divergence", "alpha_divergence_coef": 0.5}, "w", -1, 160.0),
    ("dpo", {"f_divergence": "alpha_divergence", "alpha_divergence_coef": 3.0}, "l", +1, 40.0),
    ("discopop", {"tau": 2.0}, "w", -1, 1605.0),  # x = −z + log σ(z/τ) ≈ −z/2 = 80 at z = β(ρ_w − ρ_l) = −160
    ("ipo", {}, "w", -1, 3e18),  # Δ̄ = ρ_w/3
]


@pytest.mark.parametrize(("name", "params", "side", "sign", "rho"), CAPS, ids=[f"{c[0]}-{i}" for i, c in
                                                                              enumerate(CAPS)])
def test_no_cliff_at_the_cap(name, params, side, sign, rho):
    """Just past the cap the gradient is within a factor 2 of just before it (a clamp would drop it to 0 or to the
    logistic term's ≈ β), and the loss keeps growing as the margin shrinks."""
    eps = 1e-5 * rho
    before, after, further = (_at(name, params, side, sign * r, -5.0, F64) for r in (rho - eps, rho + eps, 2 * rho))
    dir_before, dir_after = float(before[1] - before[2]), float(after[1] - after[2])
    assert dir_before < 0 and 0.5 < dir_after / dir_before < 2, (dir_before, dir_after)
    assert float(further[0]) > float(after[0]) > float(before[0])


def test_values_equal_trl_below_the_cap():
    """Below the cap the capped forms are the plain ones: e^x, and the square (TRL's values, to rounding)."""
    from prefzoo.losses._common import exp_capped, square_capped

    x = torch.linspace(-50, 80, 27, dtype=F64)
    torch.testing.assert_close(exp_capped(x), torch.exp(x), rtol=1e-15, atol=0)
    u = torch.tensor([-1e18, -3.0, 0.0, 2.5, 1e18], dtype=F64)
    torch.testing.assert_close(square_capped(u, 1e18), u**2, rtol=1e-15, atol=0)


def test_per_token_logratios_divide_each_side_by_its_own_length():
    """_common.logratios(batch, average=True): (log π − log π_ref)/|y| per side, and a one-line error naming the
    missing length field (no built-in calls it with average=True today; plugins may)."""
    from prefzoo.losses._common import logratios

    b = prefzoo.PreferenceBatch(
        policy_chosen_logps=torch.tensor([-4.0, -9.0], dtype=F64),
        policy_rejected_logps=torch.tensor([-6.0, -2.0], dtype=F64),
        ref_chosen_logps=torch.tensor([-2.0, -3.0], dtype=F64),
        ref_rejected_logps=torch.tensor([-1.0, -5.0], dtype=F64),
        chosen_lengths=torch.tensor([2, 3]), rejected_lengths=torch.tensor([5, 1]),
    )
    w, lo = logratios(b, average=True)
    torch.testing.assert_close(w, torch.tensor([-1.0, -2.0], dtype=F64), rtol=0, atol=0)
    torch.testing.assert_close(lo, torch.tensor([-1.0, 3.0], dtype=F64), rtol=0, atol=0)
    with pytest.raises(prefzoo.PreferenceBatchError, match=r"^PreferenceBatch.chosen_lengths is None but this loss"):
        logratios(b.replace(chosen_lengths=None), average=True)


def test_square_capped_is_continuous_at_the_cap_and_logarithmic_beyond():
    """cap²·(1 + 2·log(|u|/cap)) past the cap: equal to u² at ±cap, cap²·(1 + 2 log 2) at ±2·cap."""
    from prefzoo.losses._common import square_capped

    u = torch.tensor([-2.0, -1.0 - 1e-12, 1.0 + 1e-12, 2.0, 10.0], dtype=F64)
    want = torch.tensor([1 + 2 * math.log(2), 1.0, 1.0, 1 + 2 * math.log(2), 1 + 2 * math.log(10)], dtype=F64)
    torch.testing.assert_close(square_capped(u, 1.0), want, rtol=1e-11, atol=0)


@pytest.mark.parametrize("name", ["aot", "aot-unpaired"])
def test_aot_ties_share_their_sorted_slots(name):
    """Three tied margins and two tied reference margins: the tied examples split their slots equally, so the mean
    is still TRL's mean over the sorted slots and identical examples get identical losses."""
    from tests.losses.reference import ref_aot, ref_aot_unpaired

    t = lambda v: torch.tensor(v, dtype=F64)  # noqa: E731
    x = {"pw": t([-1.0, -2.0, -3.0, -5.0]), "pl": t([-2.0, -3.0, -4.0, -3.0]),
         "rw": t([-1.0, -2.0, -1.5, -1.5]), "rl": t([-1.0, -2.0, -2.0, -2.0])}
    if name == "aot-unpaired":  # the same ties in its quantities, log π − log π_ref of each side
        x["rw"], x["rl"] = x["pw"] - t([1.0, 1.0, 1.0, -2.0]), x["pl"] - t([0.0, 0.0, 0.5, 0.5])
    b = prefzoo.PreferenceBatch(policy_chosen_logps=x["pw"], policy_rejected_logps=x["pl"],
                                ref_chosen_logps=x["rw"], ref_rejected_logps=x["rl"])
    losses = prefzoo.get_loss(name, beta=0.5)(b).losses
    want = (ref_aot if name == "aot" else ref_aot_unpaired)(x, {"beta": 0.5})
    torch.testing.assert_close(losses.mean(), want, rtol=1e-12, atol=0)
    if name == "aot":
        torch.testing.assert_close(losses[0], losses[1], rtol=0, atol=0)  # same margin 1, same reference margin 0


def test_minmax_scale_gives_a_zero_gradient_when_every_value_ties():
    """ε = 0 and lo = hi: the scaled values are 0 and so is their gradient, not 0·∞ = NaN from the branch torch.where
    does not take.  The built-in losses scale constants (reference rewards, scores); a loss that scales a
    differentiable quantity with this helper must not get NaN gradients on a batch where every value ties."""
    from prefzoo.losses._common import minmax_scale

    x = torch.full((3,), 0.25, dtype=F64, requires_grad=True)
    y = minmax_scale(x, x.detach().min(), x.detach().max(), 0.0)
    (g,) = torch.autograd.grad(y.sum(), x)
    assert y.detach().tolist() == [0.0, 0.0, 0.0] and g.tolist() == [0.0, 0.0, 0.0]


def test_past_the_cap_delta_keeps_a_log_ratio_gap_that_the_capped_exponentials_round_away():
    """α-divergence DPO (α = 1.5, a = α − 1 = 0.5) at ρ ≈ 2e17, one float64 step apart (32): both capped
    exponentials are (1 + h)·e^80 to every float64 digit (h²/(h + u) ≈ 1e-19 of 1.1), so their plain difference is
    0 and the loss would be log 2.  Past the cap f_delta takes e^80·h²·(ρ_w − ρ_l)/((h + u_w)(h + u_l)), u = a·ρ − 80:
    Δ ≈ 1.77 here, and −log σ(βΔ) follows it."""
    from prefzoo.losses._common import EXP_CAP, EXP_HEADROOM

    a, h, rho_l = 0.5, EXP_HEADROOM, 2e17
    rho_w = rho_l + 32.0  # the next float64 but one: ρ_w − ρ_l is exact
    delta = math.exp(EXP_CAP) * h * h * (rho_w - rho_l) / ((h + a * rho_w - EXP_CAP) * (h + a * rho_l - EXP_CAP))
    assert 1.5 < delta < 2.0
    params = {"f_divergence": "alpha_divergence", "alpha_divergence_coef": 1.5, "beta": 1.0}
    loss, gw, gl = _grads("dpo", params, [rho_w], [rho_l], [0.0], [0.0])
    assert float(loss) == pytest.approx(math.log1p(math.exp(-delta)), rel=1e-12)  # not log 2 = 0.693
    assert float(gw) < 0 < float(gl)
