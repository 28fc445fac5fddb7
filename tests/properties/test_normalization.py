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
from prefzoo.testing import loss_params, preference_batches
from prefzoo.testing.sharding import run_sharded, shard_batch
from tests.properties._helpers import F64, leaves64

COUPLED = ["mmpo", "mmpo-no-aux", "mmpo-length-norm"]
U = 2.0**-53
batches = preference_batches(dtypes=("float64",), reference=True, lengths=True)


def _rewards(batch, p, average: bool = False):
    """R_w = r_ε + β·log π_ref(y_w), R_l = r_l + β·log π_ref(y_l) (per-token averages of log π_ref when ``average``)."""
    qw, ql = batch.ref_chosen_logps.double(), batch.ref_rejected_logps.double()
    if average:
        qw, ql = qw / batch.chosen_lengths.double(), ql / batch.rejected_lengths.double()
    return p.reward_epsilon + p.beta * qw, p.rejected_reward + p.beta * ql


def _normalized(R_w, R_l, eps):
    """R̂ written out from the listing, over both responses of the (whole, gathered) batch."""
    R = torch.cat((R_w, R_l))
    lo, hi = R.min(), R.max()
    d = hi + eps - lo
    if float(d) == 0:
        return torch.zeros_like(R_w), torch.zeros_like(R_l)
    return (R_w + eps - lo) / d, (R_l + eps - lo) / d


def _added_rewards(loss, b, average: bool = False):
    """R̂_w, R̂_l as the loss applies them: its scores s = log π(/|y|) + R̂ minus the policy term."""
    out = loss(b)
    pw, pl = b.policy_chosen_logps.detach().double(), b.policy_rejected_logps.detach().double()
    if average:
        pw, pl = pw / b.chosen_lengths.double(), pl / b.rejected_lengths.double()
    return out.chosen_rewards.double() - pw, out.rejected_rewards.double() - pl


def _tol(b, R_w, R_l, eps, average: bool = False):
    """Rounding of (R + ε − min)/(max + ε − min) plus that of s = log π + R̂ (then s − log π): a few ulps."""
    R = torch.cat((R_w, R_l))
    d = float(R.max() - R.min()) + eps
    pw = torch.cat((b.policy_chosen_logps, b.policy_rejected_logps)).detach().double()
    if average:
        pw = pw / torch.cat((b.chosen_lengths, b.rejected_lengths)).double()
    scale = float(R.abs().max()) + eps + 1
    return 16 * U * (scale / d if d > 0 else 0.0) + 8 * U * (1 + float(pw.abs().max()))


def _well_spread(batch) -> bool:
    """Reward ranges not far below the rewards' magnitude (the rounding of R − min R stays far below 1)."""
    q = torch.cat((batch.ref_chosen_logps, batch.ref_rejected_logps)).double()
    return float(q.max() - q.min()) >= 1e-3 * (1 + float(q.abs().max()))


@given(batch=batches.filter(_well_spread), params=loss_params(prefzoo.loss_spec("mmpo")), data=st.data())
def test_scores_add_the_normalized_reward_of_the_gathered_batch(batch, params, data):
    """Each rank's s_w and s_l add R̂ over the WHOLE batch (uneven shards, one of a single pair), both responses."""
    b = leaves64(batch)
    n = b.batch_size
    cuts = sorted(data.draw(st.sets(st.integers(1, n - 1), max_size=3), label="cuts")) if n > 1 else []
    sizes = [j - i for i, j in zip([0, *cuts], [*cuts, n], strict=True)]
    if n > 1 and 1 not in sizes:
        sizes = [1, sizes[0] - 1, *sizes[1:]] if sizes[0] > 1 else sizes
    for name in COUPLED:
        avg = name == "mmpo-length-norm"
        R_w, R_l = _rewards(b, params, average=avg)
        want_w, want_l = _normalized(R_w, R_l, params.norm_eps)
        loss = prefzoo.Loss(prefzoo.loss_spec(name), params)
        shards = shard_batch(b, sizes)
        outs = run_sharded(lambda sh, gather, loss=loss: loss(sh, gather=gather), shards)
        got_w = torch.cat([o.chosen_rewards.double() - _pol(sh, avg)[0] for o, sh in zip(outs, shards, strict=True)])
        got_l = torch.cat([o.rejected_rewards.double() - _pol(sh, avg)[1] for o, sh in zip(outs, shards, strict=True)])
        tol = _tol(b, R_w, R_l, params.norm_eps, avg)
        assert float((got_w - want_w).abs().max()) <= tol, (name, sizes, got_w, want_w)
        assert float((got_l - want_l).abs().max()) <= tol, (name, sizes, got_l, want_l)
        both = torch.cat((got_w, got_l))
        assert bool((both >= -tol).all()) and bool((both <= 1 + tol).all())
        # the largest reward of the gathered batch maps to 1, the smallest to ε/(max + ε − min)
        assert abs(float(both.max()) - 1.0) <= tol, (name, float(both.max()))


def _pol(b, average: bool):
    pw, pl = b.policy_chosen_logps.detach().double(), b.policy_rejected_logps.detach().double()
    if average:
        pw, pl = pw / b.chosen_lengths.double(), pl / b.rejected_lengths.double()
    return pw, pl


def test_hand_computed_normalization_on_two_ranks():
    """Rewards R = r + β·log π_ref with β = 1, r_ε = r_l = 0, ε = 0: rank 0 holds R = (−1, −3), rank 1 R = (−2, −5).

    Over the gathered batch min = −5, max = −1: R̂ = (R + 5)/4 = rank 0: (1, 0.5), rank 1: (0.75, 0).
    Rank 1 alone would see min −5, max −2 and give (1, 0): a gather that is not called shows here.
    """
    spec = prefzoo.loss_spec("mmpo")
    p = spec.params(beta=1.0, reward_epsilon=0.0, rejected_reward=0.0, norm_eps=0.0)
    z = torch.zeros(1, dtype=F64)
    r0 = prefzoo.PreferenceBatch(z, z, torch.tensor([-1.0], dtype=F64), torch.tensor([-3.0], dtype=F64))
    r1 = prefzoo.PreferenceBatch(z, z, torch.tensor([-2.0], dtype=F64), torch.tensor([-5.0], dtype=F64))
    o0, o1 = run_sharded(lambda sh, gather: prefzoo.Loss(spec, p)(sh, gather=gather), [r0, r1])
    assert (o0.chosen_rewards.item(), o0.rejected_rewards.item()) == (1.0, 0.5)
    assert (o1.chosen_rewards.item(), o1.rejected_rewards.item()) == (0.75, 0.0)


@given(batch=batches.filter(_well_spread), params=loss_params(prefzoo.loss_spec("mmpo-no-aux")),
       c=st.floats(-1e3, 1e3))
def test_common_shift_of_reference_logps(batch, params, c):
    b = leaves64(batch)
    for name in COUPLED:
        # mmpo-length-norm normalizes log π_ref/|y|: its invariance is to log π_ref(y) + c·|y|
        avg = name == "mmpo-length-norm"
        cw, cl = (c * b.chosen_lengths.double(), c * b.rejected_lengths.double()) if avg else (c, c)
        shifted = b.replace(ref_chosen_logps=b.ref_chosen_logps + cw, ref_rejected_logps=b.ref_rejected_logps + cl)
        loss = prefzoo.Loss(prefzoo.loss_spec(name), params)
        base, moved = _added_rewards(loss, b, avg), _added_rewards(loss, shifted, avg)
        R_w, R_l = _rewards(b, params, avg)
        Rs_w, Rs_l = _rewards(shifted, params, avg)
        tol = _tol(b, R_w, R_l, params.norm_eps, avg) + _tol(shifted, Rs_w, Rs_l, params.norm_eps, avg)
        for got, want in zip(moved, base, strict=True):
            assert float((got - want).abs().max()) <= tol, (name, float((got - want).abs().max()), tol)


@given(batch=batches.filter(_well_spread), beta=st.floats(0.01, 5.0), r=st.floats(-2.0, 2.0), k=st.floats(0.01, 100.0))
def test_scaling_is_exact_when_rewards_equal_and_eps_zero(batch, beta, r, k):
    """With r_ε = r_l and ε = 0, R̂ is the min-max normalization of log π_ref itself, for every β and every k·β."""
    spec = prefzoo.loss_spec("mmpo")
    b = leaves64(batch)
    q = torch.cat((b.ref_chosen_logps, b.ref_rejected_logps)).double()
    t = (q - q.min()) / (q.max() - q.min())  # (2B,) written out, independent of β and r
    for bt in (beta, k * beta):
        p = spec.params(beta=bt, reward_epsilon=r, rejected_reward=r, norm_eps=0.0)
        got = torch.cat(_added_rewards(prefzoo.Loss(spec, p), b))
        R_w, R_l = _rewards(b, p)
        tol = _tol(b, R_w, R_l, 0.0)
        assert float((got - t).abs().max()) <= tol, (bt, got, t)


@given(batch=batches, params=loss_params(prefzoo.loss_spec("mmpo")), k=st.floats(0.1, 1000.0))
def test_scaling_bound_otherwise(batch, params, k):
    q = torch.cat((batch.ref_chosen_logps, batch.ref_rejected_logps)).double()
    b = q * params.beta
    D = float(b.max() - b.min())
    delta = abs(params.reward_epsilon - params.rejected_reward)
    eps = params.norm_eps
    if not k * D > delta or D == 0:
        return  # the bound is stated for k·D > δ only
    pk = prefzoo.loss_spec("mmpo").params(beta=k * params.beta, reward_epsilon=params.reward_epsilon,
                                          rejected_reward=params.rejected_reward, norm_eps=eps)
    bb = leaves64(batch)
    nk = torch.cat(_added_rewards(prefzoo.Loss(prefzoo.loss_spec("mmpo"), pk), bb))
    t = (b - b.min()) / D
    bound = (eps + 2 * delta) / (k * D - delta + eps)
    err = float((nk - t).abs().max())
    R_w, R_l = _rewards(bb, pk)
    rounding = _tol(bb, R_w, R_l, eps) + 64 * U * (float((k * b).abs().max()) + delta + 1) / (k * D)
    assert err <= bound + rounding, (err, bound)


def test_scaling_bound_is_attained_in_order_of_magnitude():
    """The bound is not vacuous: with r_ε ≠ r_l the error is of the order δ/(kD)."""
    spec = prefzoo.loss_spec("mmpo")
    ref_w, ref_l = torch.tensor([-10.0, -30.0], dtype=F64), torch.tensor([-20.0, -40.0], dtype=F64)
    z = torch.zeros(2, dtype=F64)
    for k in (1.0, 10.0, 100.0):
        p = spec.params(beta=0.1 * k, reward_epsilon=0.6, rejected_reward=0.1, norm_eps=0.0)
        out = prefzoo.Loss(spec, p)(prefzoo.PreferenceBatch(z, z, ref_w, ref_l))
        b = torch.cat((ref_w, ref_l)) * 0.1
        t = (b - b.min()) / (b.max() - b.min())
        err = float((torch.cat((out.chosen_rewards, out.rejected_rewards)) - t).abs().max())
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
