"""Each shaped check's tolerance, pinned (prefzoo/testing/properties_shapes.py): a loss whose transformed call drifts
just past the documented tolerance fails, one that drifts just within it passes.  A complete mutation run of the
module found these constants free: ``2 + |L|`` for ``1 + |L|``, ``/`` for ``·``, 17 for 16, and the low-precision
check's Δ_u estimated from other signs all passed the suite."""

from __future__ import annotations

import re
from collections.abc import Callable

import pytest
import torch

from prefzoo.testing import properties_shapes as S
from prefzoo.testing.properties import U32, PropertyFailure
from prefzoo.types import GroupBatch
from tests.testing._probes import drifting
from tests.testing.test_shape_checks import _groups

F = torch.float64


def _drifting(picks, **kw):
    """:func:`drifting` over the real slots' Σ_k log π_gk: invariant under permutations, padding and splits."""
    return drifting("dpo-pl", lambda b, p: torch.where(b.valid, b.policy_logps, 0.0).sum(1), picks, **kw)


# (check, the calls that are its transformed batch, the constant k of its tolerance k·(1 + |x|), the failure's text)
CHECKS = {
    "permutation": (
        S.check_shape_permutation,
        lambda i, b, ctx: i == 1,
        1e-9,
        "losses after permuting the groups by [1, 0]",
    ),
    "within-group": (
        S.check_within_group_permutation,
        lambda i, b, ctx: i == 1,
        1e-9,
        "losses after permuting every group's completions by [1, 0, 2]",
    ),
    "padding": (
        S.check_padding_invariance,
        lambda i, b, ctx: i == 0,
        1e-12,
        "losses after adding a padding slot to every group",
    ),
    "decoupled": (
        S.check_shape_decoupled,
        lambda i, b, ctx: i >= 1,
        1e-12,
        "per-example loss in micro-batches [1, 1] differs from the full batch (batch_coupled=False)",
    ),
    "sharded": (
        S.check_shape_sharded_gather,
        lambda i, b, ctx: ctx.distributed,
        1e-9,
        "losses sharded as [1, 1] with the gather hook",
    ),
}


@pytest.mark.parametrize("name", CHECKS)
def test_a_loss_that_drifts_half_again_its_tolerance_fails(name):
    """|L| = 0: the tolerance is k exactly, and a drift of 1.5·k is past it (``2 + |L|`` would allow it)."""
    check, picks, k, what = CHECKS[name]
    with pytest.raises(PropertyFailure, match="^" + re.escape(f"probe: {what} at index 0: got ")):
        check(_drifting(picks, value=1.5 * k), _groups())
    check(_drifting(picks, value=0.0), _groups())


@pytest.mark.parametrize("name", CHECKS)
def test_a_loss_that_drifts_half_its_tolerance_passes(name):
    """|L| = 10: the tolerance is 11·k, and a drift of 5.5·k is within it (``k / (1 + |L|)`` would not allow it)."""
    check, picks, k, _ = CHECKS[name]
    check(_drifting(picks, value=5.5 * k, level=10.0), _groups())


GRADIENTS = {  # the checks that compare gradients too, as CHECKS
    "padding": (
        S.check_padding_invariance,
        CHECKS["padding"][1],
        1e-12,
        "∂ΣL/∂policy_logps on the real slots after padding",
    ),
    "sharded": (S.check_shape_sharded_gather, CHECKS["sharded"][1], 1e-9, "∂ΣL/∂policy_logps sharded as [1, 1]"),
}


@pytest.mark.parametrize("name", GRADIENTS)
def test_a_gradient_within_its_tolerance_passes_and_one_past_it_fails(name):
    """∂L/∂log π = 10 (tolerance 11·k) drifting by 5.5·k passes; ∂L/∂log π = 0 (tolerance k) drifting by 1.5·k fails,
    and the failure names the loss, the gradient and the split."""
    check, picks, k, what = GRADIENTS[name]
    check(_drifting(picks, grad=5.5 * k, slope=10.0), _groups())
    with pytest.raises(PropertyFailure) as e:
        check(_drifting(picks, grad=1.5 * k), _groups())
    assert str(e.value).startswith(f"probe: {what} at index 0: got ")


def test_the_sharded_check_splits_across_four_ranks_by_default():
    """Five groups over four ranks, the first holding one: [1, 2, 1, 1] (five ranks would be [1, 1, 1, 1, 1])."""
    lp = -torch.arange(1.0, 16.0, dtype=F).reshape(5, 3)
    g = GroupBatch(policy_logps=lp, ref_logps=lp - 0.5, scores=torch.tensor([[3.0, 2.0, 1.0]] * 5, dtype=F))
    with pytest.raises(PropertyFailure, match=r"^probe: losses sharded as \[1, 2, 1, 1\] with the gather hook"):
        S.check_shape_sharded_gather(_drifting(CHECKS["sharded"][1], value=1.0), g)


# --- the low-precision check: 16·Δ_u + 16·u·(1 + |L₆₄|) ------------------------------------------------------------

X = -100.0  # exact in bfloat16 and float32; x·(1 ± u) and its change are exact in float64
MARGIN = 8 * 100 * U32**2  # far above float64 rounding at |L| = 100, below any change of the tolerance's terms


def _low(read: Callable[[GroupBatch, object], torch.Tensor], drift: float) -> None:
    """The low-precision check on float32 groups of L = read(batch, params), plus ``drift`` on the float32 call: the
    float64 loss it is compared with is the same function on the same (rounded) inputs."""
    lp = torch.tensor([[X, X, -1.0], [X, X, -2.0]], dtype=F)
    groups = GroupBatch(policy_logps=lp, ref_logps=lp - 0.5, scores=torch.tensor([[3.0, 2.0, 1.0]] * 2, dtype=F))
    low = lambda i, b, ctx: b.policy_logps.dtype == torch.float32  # noqa: E731
    loss = drifting("dpo-pl", lambda b, p: read(b, p).double(), low, value=drift, slope=1.0)
    S.check_shape_low_precision(loss, groups, dtypes=(torch.float32,))


def test_low_precision_tolerance_is_sixteen_times_the_change_under_u_plus_sixteen_u_exactly():
    """L = log π of the first slot (−100): every ±u perturbation changes it by exactly 100·u, so the tolerance is
    16·100·u + 16·u·(1 + 100).  A drift a hair within passes and a hair past fails: larger signs (±3, 0/−2, ±2),
    17 for 16, ``2 + |L|`` or x / (1 ± u) for x·(1 ± u) in the perturbation all allow the second."""
    tol = 16 * 100 * U32 + 16 * U32 * (1 + 100)
    first = lambda b, p: b.policy_logps[:, 0]  # noqa: E731
    _low(first, tol - MARGIN)
    with pytest.raises(PropertyFailure, match=r"^probe: torch.float32 loss vs float64 on the same inputs at index 0"):
        _low(first, tol + MARGIN)


def test_low_precision_perturbs_each_input_with_its_own_sign():
    """L = log π₀ − log π₁ with both −100: the float64 loss is 0, but signs drawn apart change it by 200·u, so the
    tolerance is 16·200·u + 16·u.  Signs all equal (or all of one kind, or no perturbed inputs) would measure less."""
    tol = 16 * 200 * U32 + 16 * U32
    _low(lambda b, p: b.policy_logps[:, 0] - b.policy_logps[:, 1], tol - MARGIN)


@pytest.mark.parametrize("side", [1.0, -1.0])
def test_low_precision_perturbs_the_params_both_ways(side):
    """L = 1000·max(0, ±(β − β₀)) at β = β₀ = 0.1: only β(1 + u) (or only β(1 − u)) changes it, by 1000·0.1·u.  The
    tolerance 16·100·u + 16·u lets a drift of 800·u pass; perturbing β one way only would measure Δ_u = 0 on one
    side and fail it."""
    read = lambda b, p: 1000 * torch.relu(torch.full((b.batch_size,), side * (p.beta - 0.1), dtype=F))  # noqa: E731
    _low(read, 800 * U32)
