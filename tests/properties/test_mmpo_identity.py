"""The MMPO identity: −logsumexp(s_w, s_l) − log σ(s_w − s_l) = −s_w exactly, so ∇L = −∇log π(y_w).

The gradient with respect to the policy log-probs is (−1, 0) per pair for every β,
r_ε, reference and rejected response (−1/|y_w| for the length-normalized ablation).
That gradient holds for any normalization, so the VALUE −s_w is what has teeth: it is
checked in one process and on 2–4 ranks through the production gather
(prefzoo.train.engines.accelerator.make_gather), where R̂ must use the whole batch's min and max.
"""

from __future__ import annotations

import itertools

import torch
from hypothesis import given
from hypothesis import strategies as st

import prefzoo
from prefzoo.testing import loss_params, preference_batches
from tests.properties._helpers import leaves64, mmpo_scores, run_on_ranks


def _check(name: str, batch, params, average: bool = False, normalize: bool = True) -> None:
    b = leaves64(batch)
    out = prefzoo.Loss(prefzoo.loss_spec(name), params)(b)
    s_w, _ = mmpo_scores(b, params, average=average, normalize=normalize)
    mag = 1 + max(float(t.abs().max()) for t in (b.policy_chosen_logps.detach(), b.policy_rejected_logps.detach(), s_w))
    tol = 16 * 2.0**-53 * mag  # float64 rounding of logsumexp at scores of size |s|
    torch.testing.assert_close(out.losses.detach(), -s_w, rtol=1e-12, atol=1e-9)
    gw, gl = torch.autograd.grad(out.losses.sum(), [b.policy_chosen_logps, b.policy_rejected_logps])
    want = -1 / b.chosen_lengths.to(gw.dtype) if average else -torch.ones_like(gw)
    torch.testing.assert_close(gw, want, rtol=1e-9, atol=tol)
    torch.testing.assert_close(gl, torch.zeros_like(gl), rtol=0, atol=tol)


@given(batch=preference_batches(dtypes=("float64",), reference=True), params=loss_params(prefzoo.loss_spec("mmpo")))
def test_mmpo_is_minus_chosen_score(batch, params):
    _check("mmpo", batch, params)


@given(batch=preference_batches(dtypes=("float64",), reference=True),
       params=loss_params(prefzoo.loss_spec("mmpo-no-norm")))
def test_mmpo_no_norm_is_minus_chosen_score(batch, params):
    _check("mmpo-no-norm", batch, params, normalize=False)


@given(batch=preference_batches(dtypes=("float64",), reference=True, lengths=True),
       params=loss_params(prefzoo.loss_spec("mmpo-length-norm")))
def test_mmpo_length_norm_gradient_is_per_token_nll(batch, params):
    _check("mmpo-length-norm", batch, params, average=True)


@given(batch=preference_batches(dtypes=("float64",), reference=True),
       p1=loss_params(prefzoo.loss_spec("mmpo")), p2=loss_params(prefzoo.loss_spec("mmpo")))
def test_gradient_is_the_same_for_every_params_reference_and_rejected(batch, p1, p2):
    """Two param draws, and a second batch with another reference and rejected response: identical gradients."""
    b1 = leaves64(batch)
    other = batch.replace(ref_chosen_logps=batch.ref_rejected_logps.flip(0), ref_rejected_logps=batch.ref_chosen_logps,
                          policy_rejected_logps=batch.policy_rejected_logps.flip(0))
    b2 = leaves64(other)
    spec = prefzoo.loss_spec("mmpo")
    g1 = torch.autograd.grad(prefzoo.Loss(spec, p1)(b1).losses.sum(), b1.policy_chosen_logps)[0]
    g2 = torch.autograd.grad(prefzoo.Loss(spec, p2)(b2).losses.sum(), b2.policy_chosen_logps)[0]
    torch.testing.assert_close(g1, g2, rtol=0, atol=1e-11)


@given(batch=preference_batches(dtypes=("float64",), reference=True, min_size=2, max_size=16),
       params=loss_params(prefzoo.loss_spec("mmpo")), world=st.integers(2, 4), data=st.data())
def test_identity_holds_on_every_rank_through_the_production_gather(batch, params, world, data):
    """Sharded over 2–4 ranks (uneven, the first holding one pair) with prefzoo.train.engines.accelerator.make_gather:
    every rank's loss is −s_w where s_w's R̂ uses the min and max of the WHOLE batch."""
    from prefzoo.testing.sharding import shard_batch

    b = leaves64(batch)
    n = b.batch_size
    cuts = sorted(data.draw(st.sets(st.integers(2, n - 1), max_size=world - 2), label="cuts")) if n > 2 else []
    edges = [0, 1, *cuts, n]
    sizes = [j - i for i, j in itertools.pairwise(edges)]  # the first rank holds one pair
    shards = shard_batch(b, sizes)
    s_w, _ = mmpo_scores(b, params)  # whole batch, independent of prefzoo.losses.mmpo
    loss = prefzoo.Loss(prefzoo.loss_spec("mmpo"), params)
    outs = run_on_ranks(lambda r, gather: loss(shards[r], gather=gather).losses.detach(), len(sizes))
    got = torch.cat(outs)
    torch.testing.assert_close(got, -s_w, rtol=1e-12, atol=1e-9)


def test_identity_on_two_uneven_ranks_by_hand():
    """β = 1, r_ε = r_l = 0, ε = 0, log π = 0.  Rank 0 holds one pair, R = (R_w, R_l) = (−1, −3); rank 1 holds two,
    R_w = (−2, −4), R_l = (−5, −2).

    Over the gathered batch min = −5, max = −1, so R̂_w = (R_w + 5)/4 and the losses −R̂_w are −1 (rank 0) and
    −0.75, −0.25 (rank 1).  A rank normalizing alone gives rank 1 (−1, −1/3); a gather that kept rank 0's zero
    padding would see max = 0 and give −0.8, −0.6, −0.2.
    """
    p = prefzoo.loss_spec("mmpo").params(beta=1.0, reward_epsilon=0.0, rejected_reward=0.0, norm_eps=0.0)
    t = lambda *v: torch.tensor(v, dtype=torch.float64)  # noqa: E731
    shards = [prefzoo.PreferenceBatch(t(0.0), t(0.0), t(-1.0), t(-3.0)),
              prefzoo.PreferenceBatch(t(0.0, 0.0), t(0.0, 0.0), t(-2.0, -4.0), t(-5.0, -2.0))]
    loss = prefzoo.Loss(prefzoo.loss_spec("mmpo"), p)
    outs = run_on_ranks(lambda r, gather: loss(shards[r], gather=gather).losses.detach(), 2)
    assert [o.tolist() for o in outs] == [[-1.0], [-0.75, -0.25]]


def test_production_gather_on_one_process_is_the_identity():
    """One process: ``make_gather`` hands the shard back unchanged (no collective)."""
    from types import SimpleNamespace

    from prefzoo.train.engines.accelerator import make_gather

    t = torch.arange(3.0)
    assert make_gather(SimpleNamespace(num_processes=1))(t) is t
