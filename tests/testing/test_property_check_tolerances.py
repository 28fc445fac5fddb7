"""Each pair check's tolerance, pinned (prefzoo/testing/properties.py): a loss whose transformed call drifts just past
the documented tolerance fails, one that drifts just within it passes, as tests/testing/test_shape_check_tolerances.py
does for lists.  A complete mutation run of the module found these constants free (``2 + |L|`` for ``1 + |L|``,
``/`` for ``·``)."""

from __future__ import annotations

import re

import pytest
import torch

from prefzoo.testing import properties as P
from prefzoo.types import LossOutput
from tests.testing._probes import drifting, probe_loss
from tests.testing.test_property_checks import _batch

F = torch.float64


def _margin(b):
    return (b.policy_chosen_logps - b.ref_chosen_logps) - (b.policy_rejected_logps - b.ref_rejected_logps)


def _drifting(picks, **kw):
    """:func:`drifting` over DPO's margin: invariant under permutations, splits and shifts but for the drift."""
    return drifting("dpo", lambda b, p: _margin(b), picks, **kw)


def _pairs(pc: float, pr: float, rc: float, rr: float, n: int = 1):
    """``n`` equal pairs of these log-probs."""
    t = lambda v: torch.full((n,), v, dtype=F)  # noqa: E731
    return _batch(policy_chosen_logps=t(pc), policy_rejected_logps=t(pr), ref_chosen_logps=t(rc),
                  ref_rejected_logps=t(rr))  # fmt: skip


FLOAT32 = lambda i, b, ctx: b.policy_chosen_logps.dtype == torch.float32  # noqa: E731  (the low-precision call)


# (check, the calls that are its transformed batch, the constant k of its tolerance k·(1 + |x|), the failure's text)
CHECKS = {
    "permutation": (P.check_permutation, lambda i, b, ctx: i == 1, 1e-9, "losses after permutation [1, 0, 2]"),
    "sharded": (
        P.check_sharded_gather,
        lambda i, b, ctx: ctx.distributed,
        1e-9,
        "per-example loss sharded as [1, 1, 1] with the gather hook",
    ),
    "decoupled": (
        P.check_batch_decoupled,
        lambda i, b, ctx: i >= 1,
        1e-12,
        "per-example loss in micro-batches [2, 1] differs from the full batch, but the spec says batch_coupled=False",
    ),
    "shift": (
        P.check_shift_invariance,
        lambda i, b, ctx: i == 3,  # after the loss itself and its two margin perturbations
        1e-9,
        "loss changed when c was added to policy and reference log-probs of one response",
    ),
}


@pytest.mark.parametrize("name", CHECKS)
def test_a_loss_that_drifts_half_again_its_tolerance_fails(name):
    """|L| = 0: the tolerance is k exactly, and a drift of 1.5·k is past it (``2 + |L|`` would allow it)."""
    check, picks, k, what = CHECKS[name]
    with pytest.raises(P.PropertyFailure, match="^" + re.escape(f"probe: {what} at example 0 (")):
        check(_drifting(picks, value=1.5 * k), _batch())
    check(_drifting(picks), _batch())


@pytest.mark.parametrize("name", CHECKS)
def test_a_loss_that_drifts_half_its_tolerance_passes(name):
    """|L| = 10: the tolerance is 11·k, and a drift of 5.5·k is within it (``k / (1 + |L|)`` would not allow it)."""
    check, picks, k, _ = CHECKS[name]
    check(_drifting(picks, value=5.5 * k, level=10.0), _batch())


def test_the_reference_formula_is_matched_to_one_part_in_a_billion():
    """The reference says 0 (then 10): the loss 1.5e-9 away fails, 5.5e-9 away from 10 passes."""
    always = lambda i, b, ctx: True  # noqa: E731
    with pytest.raises(P.PropertyFailure, match=r"^probe: loss vs float64 reference formula at example 0 \("):
        P.check_matches_reference(_drifting(always, value=1.5e-9), _batch(), lambda b, p: torch.zeros(3, dtype=F))
    ten = lambda b, p: torch.full((b.batch_size,), 10.0, dtype=F)  # noqa: E731
    P.check_matches_reference(_drifting(always, value=5.5e-9, level=10.0), _batch(), ten)


def test_sharded_gradients_within_their_tolerance_pass_and_past_it_fail():
    """∂L/∂log π(y_w) = 10 (tolerance 11e-9) drifting by 5.5e-9 on the ranks passes; = 0 (tolerance 1e-9) drifting
    by 1.5e-9 fails, named by the gradient and the split."""
    on_ranks = CHECKS["sharded"][1]
    P.check_sharded_gather(_drifting(on_ranks, grad=5.5e-9, slope=10.0), _batch())
    with pytest.raises(P.PropertyFailure) as e:
        P.check_sharded_gather(_drifting(on_ranks, grad=1.5e-9), _batch())
    assert str(e.value).startswith("probe: ∂ΣL/∂policy_chosen_logps sharded as [1, 1, 1] at index 0: got "), str(
        e.value
    )


def test_the_shift_tolerance_is_a_hundred_times_the_margin_sensitivity():
    """One pair with margin 0 but log-ratios of 1: the margin perturbations (±1e-12) move L = 1e6·margin by 2e-6,
    so the tolerance is 1e-9 + 100·2e-6.  A drift of 0.995 of it passes and 1.005 of it fails (101·Δ would allow it)."""
    one = _pairs(-1.0, -3.0, -2.0, -4.0)
    tol = 1e-9 + 100 * 1e6 * 2e-12
    after_shift = CHECKS["shift"][1]
    P.check_shift_invariance(_drifting(after_shift, value=0.995 * tol, slope=1e6), one)
    with pytest.raises(P.PropertyFailure, match=r"^probe: loss changed when c was added"):
        P.check_shift_invariance(_drifting(after_shift, value=1.005 * tol, slope=1e6), one)


def test_low_precision_tolerance_is_sixteen_times_the_change_under_u_plus_sixteen_u_exactly():
    """L = log π(y_w) = −100 on float32 pairs: each of the sensitivity's patterns (the two margin ones, then random
    signs) changes it by exactly 100·u, so the tolerance is 16·100·u + 16·u·(1 + 100).  A drift a hair within
    passes and a hair past fails (17 for either 16 would allow it)."""
    pairs = _pairs(-100.0, -3.0, -1.0, -2.0, n=2)
    tol = 16 * 100 * P.U32 + 16 * P.U32 * (1 + 100)
    margin = 8 * 100 * P.U32**2  # far above float64 rounding at |L| = 100

    def check(drift):
        loss = drifting("dpo", lambda b, p: b.policy_chosen_logps.double(), FLOAT32, value=drift, slope=1.0)
        P.check_low_precision(loss, pairs, dtypes=(torch.float32,))

    check(tol - margin)
    with pytest.raises(P.PropertyFailure, match=r"^probe: torch.float32 loss vs float64 on the same inputs at exam"):
        check(tol + margin)


def test_the_shift_sensitivity_moves_the_margin_each_way_with_the_params_the_other_way():
    """L = M·(β/β₀)·m − M·m₀ at β = β₀, with log-ratios 2 (chosen) and 1 (rejected): m₀ = 1.  The two patterns,
    chosen × (1 + u), rejected × (1 − u), β × (1 − u), then all reversed, change L by M·u·|3 − 1| = 2·M·u each
    (u = 1e-12, M = 1e6): the tolerance is 1e-9 + 100·2e-6.  Pairing the margin's directions with the other β
    signs (or moving the margin one way only) measures 4·M·u and would let a drift of 3e-4 pass."""
    one = _pairs(-1.0, -2.0, -3.0, -3.0)
    m, beta0 = 1e6, 0.1

    def loss(drift):
        read = lambda b, p: m * (p.beta / beta0) * _margin(b) - m * 1.0  # noqa: E731
        return drifting("dpo", read, CHECKS["shift"][1], value=drift, slope=1.0)

    P.check_shift_invariance(loss(1.9e-4), one)
    with pytest.raises(P.PropertyFailure, match=r"^probe: loss changed when c was added"):
        P.check_shift_invariance(loss(3e-4), one)


@pytest.mark.parametrize("field", ["chosen_rewards", "rejected_rewards"])
def test_sharded_scores_are_held_to_one_part_in_a_billion(field):
    """A score that drifts on the ranks by 1.5e-9 from 0 fails, named by the score; by 5.5e-9 from 10 passes."""

    def loss(value, level):
        def fn(b, p, ctx):
            x = _margin(b)
            r = torch.full_like(x, level + value * ctx.distributed).detach()
            scores = {"chosen_rewards": torch.zeros_like(r), "rejected_rewards": torch.zeros_like(r), field: r}
            return LossOutput(x, scores["chosen_rewards"], scores["rejected_rewards"])

        return probe_loss(fn, "dpo", batch_coupled=False)

    with pytest.raises(P.PropertyFailure, match=rf"^probe: {field} sharded as \[1, 1, 1\] at example 0 \("):
        P.check_sharded_gather(loss(1.5e-9, 0.0), _batch())
    P.check_sharded_gather(loss(5.5e-9, 10.0), _batch())


def test_low_precision_draws_each_input_its_own_random_sign():
    """L = log π(y_w) − log π_ref(y_w) with both −100: the margin patterns move both inputs alike (no change), a
    random pattern with the two signs apart changes it by 200·u, so the tolerance is 16·200·u + 16·u.  Random signs
    from {−1, −½} would measure 50·u and fail a drift just within."""
    pairs = _pairs(-100.0, -3.0, -100.0, -2.0, n=2)
    tol = 16 * 200 * P.U32 + 16 * P.U32
    read = lambda b, p: (b.policy_chosen_logps - b.ref_chosen_logps).double()  # noqa: E731
    P.check_low_precision(drifting("dpo", read, FLOAT32, value=tol - 8 * 200 * P.U32**2, slope=1.0), pairs,
                          dtypes=(torch.float32,))  # fmt: skip
