"""In-batch min-max normalization of the MMPO rewards: R̂ = (R + ε − min R) / (max R + ε − min R).

Properties (R over both responses of the gathered batch, R_w = r_ε + β·log π_ref(y_w), R_l = r_l + β·log π_ref(y_l)):
  * R̂ ∈ [0, 1];
  * invariant to a common shift c of every reference log-prob (R moves by β·c, min and max with it);
    for mmpo-length-norm, to a common shift of the per-token average (log π_ref(y) + c·|y|);
  * scaling β·log π_ref by k > 0: exact invariance when r_ε = r_l and ε = 0; otherwise, with
    t = (b − min b)/(max b − min b), b = β·log π_ref, D = max b − min b and δ = |r_ε − r_l|,
        |R̂_k − t| ≤ (ε + 2δ) / (k·D − δ + ε)      whenever k·D > δ,
    so R̂ tends to the normalization of β·log π_ref alone at rate O(1/k);
  * permutation-equivariant;
  * a pair's loss depends on the other pairs only through the batch min and max of R.
"""

from __future__ import annotations

import torch
from hypothesis import given
from hypothesis import strategies as st

import prefzoo
from prefzoo.losses._common import minmax_normalize
from prefzoo.testing import loss_params, preference_batches
from tests.properties._helpers import F64, leaves64

COUPLED = ["mmpo", "mmpo-no-aux", "mmpo-length-norm"]
batches = preference_batches(dtypes=("float64",), reference=True, lengths=True)


def _rewards(batch, p):
    R_w = p.reward_epsilon + p.beta * batch.ref_chosen_logps.double()
    R_l = p.rejected_reward + p.beta * batch.ref_rejected_logps.double()
    return R_w, R_l


@given(batch=batches, params=loss_params(prefzoo.loss_spec("mmpo")))
def test_normalized_rewards_lie_in_unit_interval(batch, params):
    R_w, R_l = _rewards(batch, params)
    nw, nl, _, _ = minmax_normalize(R_w, R_l, lambda t: t, params.norm_eps)
    both = torch.cat((nw, nl))
    assert bool((both >= 0).all()) and bool((both <= 1).all()), both
    # and what the loss adds to log π is exactly that R̂ (s = log π + R̂)
    out = prefzoo.Loss(prefzoo.loss_spec("mmpo"), params)(leaves64(batch))
    tol = 1e-12 * (1 + batch.policy_chosen_logps.double().abs())
    assert bool(((out.chosen_rewards - batch.policy_chosen_logps.double() - nw).abs() <= tol).all())


@given(batch=batches, params=loss_params(prefzoo.loss_spec("mmpo-no-aux")), c=st.floats(-1e3, 1e3))
def test_common_shift_of_reference_logps(batch, params, c):
    b = leaves64(batch)
    for name in COUPLED:
        # mmpo-length-norm normalizes log π_ref/|y|: its invariance is to log π_ref(y) + c·|y|
        avg = name == "mmpo-length-norm"
        cw, cl = (c * b.chosen_lengths.double(), c * b.rejected_lengths.double()) if avg else (c, c)
        shifted = b.replace(ref_chosen_logps=b.ref_chosen_logps + cw, ref_rejected_logps=b.ref_rejected_logps + cl)
        loss = prefzoo.Loss(prefzoo.loss_spec(name), params)
        base, moved = loss(b), loss(shifted)
        # R̂ changes only by rounding of R + β·c: a few ulps of the largest |R| relative to the range
        R_w, R_l = _rewards(b, params)
        R = torch.cat((R_w, R_l))
        rng = float(R.max() - R.min()) + params.norm_eps
        scale = float(R.abs().max()) + abs(params.beta * c) + 1
        tol = 64 * 2.0**-53 * scale / rng if rng > 0 else 0.0
        tol = tol * (1 + float(b.policy_chosen_logps.detach().abs().max())) if name != "mmpo-length-norm" else tol
        err = (moved.chosen_rewards - base.chosen_rewards).abs().max()
        assert float(err) <= tol + 1e-9, (name, float(err), tol)


@given(batch=batches, beta=st.floats(0.01, 5.0), r=st.floats(-2.0, 2.0), k=st.floats(0.01, 100.0))
def test_scaling_is_exact_when_rewards_equal_and_eps_zero(batch, beta, r, k):
    spec = prefzoo.loss_spec("mmpo")
    p1 = spec.params(beta=beta, reward_epsilon=r, rejected_reward=r, norm_eps=0.0)
    pk = spec.params(beta=k * beta, reward_epsilon=r, rejected_reward=r, norm_eps=0.0)
    R1, Rk = torch.cat(_rewards(batch, p1)), torch.cat(_rewards(batch, pk))
    n1 = torch.cat(minmax_normalize(*R1.chunk(2), lambda t: t, 0.0)[:2])
    nk = torch.cat(minmax_normalize(*Rk.chunk(2), lambda t: t, 0.0)[:2])
    b = torch.cat((batch.ref_chosen_logps, batch.ref_rejected_logps)).double()
    rng = float(b.max() - b.min())
    tol = 0.0 if rng == 0 else 64 * 2.0**-53 * (float(b.abs().max()) + abs(r) / beta + 1) / rng
    assert float((n1 - nk).abs().max()) <= tol, (n1, nk)


@given(batch=batches, params=loss_params(prefzoo.loss_spec("mmpo")), k=st.floats(0.1, 1000.0))
def test_scaling_bound_otherwise(batch, params, k):
    b = torch.cat((batch.ref_chosen_logps, batch.ref_rejected_logps)).double() * params.beta
    D = float(b.max() - b.min())
    delta = abs(params.reward_epsilon - params.rejected_reward)
    eps = params.norm_eps
    if not k * D > delta or D == 0:
        return  # the bound is stated for k·D > δ only
    pk = prefzoo.loss_spec("mmpo").params(beta=k * params.beta, reward_epsilon=params.reward_epsilon,
                                          rejected_reward=params.rejected_reward, norm_eps=eps)
    nk = torch.cat(minmax_normalize(*_rewards(batch, pk), lambda t: t, eps)[:2])
    t = (b - b.min()) / D
    bound = (eps + 2 * delta) / (k * D - delta + eps)
    err = float((nk - t).abs().max())
    rounding = 64 * 2.0**-53 * (float((k * b).abs().max()) + delta + 1) / (k * D)
    assert err <= bound + rounding, (err, bound)


def test_scaling_bound_is_attained_in_order_of_magnitude():
    """The bound is not vacuous: with r_ε ≠ r_l the error is of the order δ/(kD)."""
    spec = prefzoo.loss_spec("mmpo")
    ref_w, ref_l = torch.tensor([-10.0, -30.0], dtype=F64), torch.tensor([-20.0, -40.0], dtype=F64)
    for k in (1.0, 10.0, 100.0):
        p = spec.params(beta=0.1 * k, reward_epsilon=0.6, rejected_reward=0.1, norm_eps=0.0)
        nw, nl, *_ = minmax_normalize(0.6 + p.beta * ref_w, 0.1 + p.beta * ref_l, lambda t: t, 0.0)
        b = torch.cat((ref_w, ref_l)) * 0.1
        t = (b - b.min()) / (b.max() - b.min())
        err = float((torch.cat((nw, nl)) - t).abs().max())
        bound = 2 * 0.5 / (k * 3.0 - 0.5)
        assert 0.05 * bound < err <= bound


@given(batch=batches, params=loss_params(prefzoo.loss_spec("mmpo-no-aux")), seed=st.integers(0, 2**16))
def test_permutation_equivariant(batch, params, seed):
    b = leaves64(batch)
    perm = torch.randperm(b.batch_size, generator=torch.Generator().manual_seed(seed))
    pb = b.replace(**{n: getattr(b, n).detach()[perm] for n in ("policy_chosen_logps", "policy_rejected_logps",
                                                                 "ref_chosen_logps", "ref_rejected_logps",
                                                                 "chosen_lengths", "rejected_lengths")})
    for name in COUPLED:
        loss = prefzoo.Loss(prefzoo.loss_spec(name), params)
        torch.testing.assert_close(loss(pb).losses, loss(b).losses.detach()[perm], rtol=0, atol=0)


@given(batch=batches, params=loss_params(prefzoo.loss_spec("mmpo-no-aux")))
def test_depends_on_others_only_through_min_and_max(batch, params):
    """Pair i's loss in the full batch equals its loss in the batch {i, the pair with min R, the pair with max R}."""
    b = leaves64(batch)
    for name in COUPLED:
        loss = prefzoo.Loss(prefzoo.loss_spec(name), params)
        full = loss(b).losses.detach()
        avg = name == "mmpo-length-norm"
        lw, ll = b.chosen_lengths.double(), b.rejected_lengths.double()
        R_w = params.reward_epsilon + params.beta * (b.ref_chosen_logps / lw if avg else b.ref_chosen_logps)
        R_l = params.rejected_reward + params.beta * (b.ref_rejected_logps / ll if avg else b.ref_rejected_logps)
        R = torch.stack((R_w, R_l), dim=1)  # (B, 2)
        i_min, i_max = int(R.min(dim=1).values.argmin()), int(R.max(dim=1).values.argmax())
        for i in range(min(b.batch_size, 8)):
            idx = torch.tensor([i, i_min, i_max])
            sub = b.replace(**{n: getattr(b, n).detach()[idx] for n in (
                "policy_chosen_logps", "policy_rejected_logps", "ref_chosen_logps", "ref_rejected_logps",
                "chosen_lengths", "rejected_lengths")})
            assert float(loss(sub).losses[0]) == float(full[i]), (name, i)
