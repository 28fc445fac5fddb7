"""Properties of the list losses beyond the kit's generic ones (tests/properties/test_generic.py runs those).

* Theorem 3.1 for n samples: for ``mml``, −∂L/∂log π(z_k|x) = softmax(s)_k, on drawn groups built backwards from
  scores in the transition region, and through a tiny float64 Llama (∇θ L = −Σ_k softmax(s)_k ∇θ log π(z_k|x)).
* K = 2 reductions, value and gradient: mml (rank) ≡ mmpo-no-aux bit for bit; mmpo-list = mmpo, dpo-pl = dpo
  to a few ulps (a logsumexp of differences against a log-sigmoid).
* The mmpo-list identity for K > 2 (docs/theory.md): L = −s_best + Σ_{j≥2} PL factor j; ∂L/∂log π(z_best) = −1.
* logsumexp stability: log π down to −1e4 in float32 and bfloat16 against float64 on the same inputs.
* The gathered normalisation of mml / mmpo-list over 2 and 4 ranks with uneven shards, through the production
  gather (prefzoo.train.engines.accelerator.make_gather), equals one process; and the kit's list properties bite.
"""

from __future__ import annotations

import math
import re

import pytest
import torch
from hypothesis import given, settings, target
from hypothesis import strategies as st

import prefzoo
from prefzoo import GroupBatch, PreferenceBatch, group_from_pairs
from prefzoo.testing import group_batches, loss_params, preference_batches
from prefzoo.testing.reference_lists import LIST_REFERENCES, _mml_scores, groups_of
from tests.properties._helpers import F64, leaves64, run_on_ranks

MML = prefzoo.loss_spec("mml")

# score gaps s_k − s_1: mostly in the transition region 0.5 < |gap| ≤ 8 where softmax weights are neither ½ nor 0/1
_inside = st.floats(0.5, 8.0).flatmap(lambda m: st.sampled_from([m, -m]))
gaps = st.integers(0, 9).flatmap(lambda k: _inside if k < 7 else st.floats(-0.5, 0.5) if k < 9 else st.just(0.0))


def _masked_softmax(s: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
    return torch.softmax(s.masked_fill(~valid, -torch.inf), dim=1)


@st.composite
def groups_with_scores(draw):
    """(GroupBatch, params, s): references, scores and the target s drawn; log π solved from s = log π + R̂, where R̂
    comes from prefzoo.testing.reference_lists (it does not depend on the policy)."""
    g, k = draw(st.integers(1, 6)), draw(st.integers(2, 6))
    p = draw(loss_params(MML))
    ref = torch.tensor(draw(st.lists(st.floats(-200.0, -0.01), min_size=g * k, max_size=g * k)), dtype=F64)
    scores = draw(st.none() | st.lists(st.integers(0, 3).map(float), min_size=g * k, max_size=g * k))
    mask = torch.ones(g, k, dtype=torch.bool)
    if k > 2 and draw(st.booleans()):
        mask[:, -1] = torch.tensor(draw(st.lists(st.booleans(), min_size=g, max_size=g)))
    s0 = torch.tensor(draw(st.lists(st.floats(-60.0, -1.0), min_size=g, max_size=g)), dtype=F64)
    gap = torch.tensor(draw(st.lists(gaps, min_size=g * k, max_size=g * k)), dtype=F64).view(g, k)
    gap[:, 0] = 0.0
    s = s0[:, None] + gap  # (G, K) target scores
    zero = torch.zeros(g, k, dtype=F64)
    sc = None if scores is None else torch.tensor(scores, dtype=F64).view(g, k)
    b0 = GroupBatch(policy_logps=zero, ref_logps=ref.view(g, k), scores=sc, mask=mask)
    rhat = zero.clone()
    rhat[mask] = torch.tensor([v for row in _mml_scores(groups_of(b0), p) for v in row], dtype=F64)  # R̂ (log π = 0)
    logp = (s - rhat).masked_fill(~mask, 0.0)
    return b0.replace(policy_logps=logp.requires_grad_()), p, s


@given(case=groups_with_scores())
def test_mml_gradient_is_the_softmax_of_the_scores(case):
    """Theorem 3.1 for n samples: −∂L/∂log π(z_k|x) = softmax(s)_k over the group's completions, 0 on padding."""
    b, params, s = case
    out = prefzoo.Loss(MML, params)(b)
    (g,) = torch.autograd.grad(out.losses.sum(), b.policy_logps)
    want = _masked_softmax(s, b.valid)
    err = (-g - want).abs().max()
    target(float(err) * 1e12, label="weight error × 1e12")
    torch.testing.assert_close(-g, want, rtol=1e-9, atol=1e-12)
    s_loss = out.rewards.masked_fill(~b.valid, 0.0)
    torch.testing.assert_close(s_loss, s.masked_fill(~b.valid, 0.0), rtol=0, atol=1e-9)  # the s it used


def test_scores_cover_the_transition_region():
    """The strategy is not all ties and saturation: most groups have a best weight between 0.05 and 0.95."""
    weights: list[float] = []

    @settings(max_examples=150, database=None, derandomize=True)
    @given(case=groups_with_scores())
    def collect(case):
        b, _, s = case
        weights.extend(_masked_softmax(s, b.valid).max(dim=1).values.tolist())

    collect()
    inside = sum(0.05 < w < 0.95 for w in weights)
    assert inside >= 0.5 * len(weights), (inside, len(weights))


def test_theorem_through_a_tiny_causal_lm():
    """Two prompts, three completions each, float64 Llama: ∇θ L = −Σ_k softmax(s)_k ∇θ log π(z_k|x), each ∇θ log π
    computed on its own; and it is not NLL on the best alone (every completion contributes)."""
    from tests.properties.test_gradient_theorem import _seq_logp, _tiny_llama

    model = _tiny_llama()
    params = list(model.parameters())
    prompts = [[1, 2, 3], [2, 9]]
    completions = [[[4, 5], [6, 7, 8], [1]], [[3, 3, 3, 1], [10], [5, 6]]]
    ref = torch.tensor([[-9.0, -7.0, -4.0], [-12.0, -2.5, -6.0]], dtype=F64)
    logp = torch.stack([torch.stack([_seq_logp(model, x, z) for z in zs]) for x, zs in zip(prompts, completions,
                                                                                           strict=True)])
    loss = prefzoo.get_loss("mml", beta=0.5)
    out = loss(GroupBatch(policy_logps=logp, ref_logps=ref))
    grad_loss = torch.autograd.grad(out.losses.sum(), params, retain_graph=True)
    s = torch.tensor([row for row in _mml_scores(groups_of(GroupBatch(policy_logps=logp.detach(), ref_logps=ref)),
                                                  loss.params)], dtype=F64)  # independent of prefzoo.losses.lists
    w = torch.softmax(s, dim=1)
    assert int(((w > 0.05) & (w < 0.95)).sum()) >= 3, w  # the transition region, not saturated
    expected = [torch.zeros_like(p) for p in params]
    for i, (x, zs) in enumerate(zip(prompts, completions, strict=True)):
        for k, z in enumerate(zs):
            for e, gz in zip(expected, torch.autograd.grad(_seq_logp(model, x, z), params), strict=True):
                e -= w[i, k] * gz
    scale = max(float(e.abs().max()) for e in expected)
    for got, want in zip(grad_loss, expected, strict=True):  # Llama's norms run in float32: 1e-5 of the largest entry
        torch.testing.assert_close(got, want, rtol=0, atol=1e-5 * scale)
    nll_best = torch.autograd.grad(-logp[:, 0].sum(), params)
    assert max(float((a - b).abs().max()) for a, b in zip(grad_loss, nll_best, strict=True)) > 1e-2 * scale


# --- K = 2 reductions -----------------------------------------------------------------------------------------------


def _value_grad(name, params, b):
    out = prefzoo.Loss(prefzoo.loss_spec(name), params)(b)
    return out.losses.detach(), torch.autograd.grad(out.losses.sum(), [b.policy_chosen_logps,
                                                                          b.policy_rejected_logps])


@pytest.mark.parametrize(("lst", "pair", "exact"), [("mml", "mmpo-no-aux", True), ("mmpo-list", "mmpo", False),
                                                    ("dpo-pl", "dpo", False)])
@given(batch=preference_batches(dtypes=("float64",), reference=True), data=st.data())
def test_k2_lists_are_the_pairwise_losses(lst, pair, exact, batch, data):
    """Same params (the pair loss's, drawn), K = 2 groups in column order: equal values and gradients."""
    p_pair = data.draw(loss_params(prefzoo.loss_spec(pair)), label="params")
    if pair == "dpo":  # plain DPO: dpo's f-divergence variants have no Plackett–Luce form here
        p_pair = prefzoo.loss_spec("dpo").params(beta=p_pair.beta)
    shared = {k: getattr(p_pair, k) for k in prefzoo.loss_spec(lst).params_cls.__dataclass_fields__
              if hasattr(p_pair, k)}
    p_list = prefzoo.loss_spec(lst).params(**shared)  # reward_from = 'rank' (the default)
    b1, b2 = leaves64(batch), leaves64(batch)
    v_pair, g_pair = _value_grad(pair, p_pair, b1)
    v_list, g_list = _value_grad(lst, p_list, b2)  # a PreferenceBatch through a list loss: K = 2 groups
    if exact:
        assert torch.equal(v_list, v_pair) and all(torch.equal(a, b) for a, b in zip(g_list, g_pair, strict=True))
        return
    fields = (b1.policy_chosen_logps, b1.policy_rejected_logps, b1.ref_chosen_logps, b1.ref_rejected_logps)
    mag = 1 + 2 * float(torch.cat(fields).detach().abs().max())  # |s| or |β·Δ| (β ≤ 10 for dpo's draws)
    mag *= max(1.0, getattr(p_pair, "beta", 1.0))
    tol = 8 * 2.0**-53 * mag  # a few ulps of the scores
    torch.testing.assert_close(v_list, v_pair, rtol=0, atol=tol)
    for a, b in zip(g_list, g_pair, strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=tol)


# --- the mmpo-list identity ---------------------------------------------------------------------------------------


def _lse(xs: list[float]) -> float:
    m = max(xs)
    return m + math.log(math.fsum(math.exp(x - m) for x in xs))



@given(batch=group_batches(dtypes=("float64",), reference=True, scores=False, max_k=8),
       params=loss_params(prefzoo.loss_spec("mmpo-list")))
def test_mmpo_list_is_nll_on_the_best_plus_a_ranking_loss_over_the_rest(batch, params):
    """Column order (unique best): L = −s_1 + Σ_{j ≥ 2} log Σ_{m ≥ j} e^{s_m − s_j} over real completions, so
    ∂L/∂log π(z_1) = −1 exactly, and the rest's gradient is the Plackett–Luce gradient of the rest alone."""
    b = batch.replace(policy_logps=batch.policy_logps.detach().clone().requires_grad_())
    out = prefzoo.Loss(prefzoo.loss_spec("mmpo-list"), params)(b)
    (g,) = torch.autograd.grad(out.losses.sum(), b.policy_logps)
    s = out.rewards  # s_k (detached), 0 on padding
    valid = b.valid.tolist()
    want = []
    for i, row in enumerate(s.tolist()):
        real = [v for v, ok in zip(row, valid[i], strict=True) if ok]
        rest = [_lse([real[m] - real[j] for m in range(j, len(real))]) for j in range(1, len(real))]
        want.append(-real[0] + math.fsum(rest))
    mag = 1 + float(s.abs().max())
    torch.testing.assert_close(out.losses.detach(), torch.tensor(want, dtype=F64), rtol=0, atol=64 * 2.0**-53 * mag)
    first = b.valid.int().argmax(dim=1)  # the best completion's column
    torch.testing.assert_close(g.gather(1, first[:, None])[:, 0], -torch.ones(b.batch_size, dtype=F64), rtol=0,
                               atol=16 * 2.0**-53 * mag)


# --- logsumexp stability ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("name", ["mml", "mmpo-list", "dpo-pl"])
@given(data=st.data())
def test_extreme_log_probs_match_float64(name, dtype, data):
    """log π in [−1e4, 0] and gaps up to 1e4 within a group: finite, and within 16·u·K·(1 + max|s|) of float64 on the
    same (rounded) inputs; gradients within the same bound plus bf16 storage rounding."""
    g, k = data.draw(st.integers(1, 6), label="G"), data.draw(st.integers(2, 6), label="K")
    vals = st.lists(st.floats(-1e4, 0.0), min_size=g * k, max_size=g * k)
    pol = torch.tensor(data.draw(vals, label="log π"), dtype=F64).view(g, k).to(dtype)
    ref = torch.tensor(data.draw(st.lists(st.floats(-200.0, 0.0), min_size=g * k, max_size=g * k)),
                       dtype=F64).view(g, k).to(dtype)
    params = data.draw(loss_params(prefzoo.loss_spec(name)), label="params")
    loss = prefzoo.Loss(prefzoo.loss_spec(name), params)
    low = GroupBatch(policy_logps=pol.clone().requires_grad_(), ref_logps=ref)
    hi = GroupBatch(policy_logps=pol.double().requires_grad_(), ref_logps=ref.double())
    out_l, out_h = loss(low), loss(hi)
    (g_l,) = torch.autograd.grad(out_l.losses.sum(), low.policy_logps)
    (g_h,) = torch.autograd.grad(out_h.losses.sum(), hi.policy_logps)
    assert bool(torch.isfinite(out_l.losses).all()) and bool(torch.isfinite(g_l).all())
    u = 2.0**-24
    mag = 1 + out_h.rewards.abs().amax(dim=1)  # max |s| per group
    tol = 16 * u * k * mag
    err = (out_l.losses.double() - out_h.losses).abs()
    target(float((err / tol).max().detach()), label="error over tolerance")
    assert bool((err <= tol).all()), (err, tol)
    store = 2.0**-8 if dtype == torch.bfloat16 else 0.0
    gerr = (g_l.double() - g_h).abs()
    assert bool((gerr <= tol[:, None] + store * g_h.abs()).all()), (gerr, tol)


def test_a_naive_logsumexp_fails_at_the_same_extremes():
    """log(Σ e^s) computed literally underflows to −inf at log π = −1e4: the check above would see inf."""
    s = torch.tensor([[-1e4, -1e4 - 5.0, -9000.0]], dtype=torch.float32)
    assert torch.isinf(torch.log(torch.exp(s).sum(dim=1))).all()
    b = GroupBatch(policy_logps=s, ref_logps=torch.zeros_like(s))
    assert bool(torch.isfinite(prefzoo.get_loss("mml")(b).losses).all())


# --- gathered normalisation -------------------------------------------------------------------------------------------


@pytest.mark.parametrize("world", [2, 4])
@pytest.mark.parametrize("name", ["mml", "mmpo-list"])
@given(batch=group_batches(dtypes=("float64",), reference=True, min_size=4, max_size=12), data=st.data())
def test_gathered_normalisation_on_uneven_ranks_equals_one_process(world, name, batch, data):
    """Groups sharded unevenly over 2 or 4 ranks (the first holding one group), the production gather
    (make_gather on a thread accelerator): every rank's losses and gradients equal one process and the reference."""
    from prefzoo.testing import shard_batch, split_sizes

    params = data.draw(loss_params(prefzoo.loss_spec(name)), label="params")
    loss = prefzoo.Loss(prefzoo.loss_spec(name), params)
    b = batch.replace(policy_logps=batch.policy_logps.detach().clone().requires_grad_())
    full = loss(b).losses
    (g_full,) = torch.autograd.grad(full.sum(), b.policy_logps)
    sizes = split_sizes(b.batch_size, world)
    shards = shard_batch(b.replace(policy_logps=b.policy_logps.detach()), sizes)

    def rank(r, gather):
        sb = shards[r].replace(policy_logps=shards[r].policy_logps.clone().requires_grad_())
        out = loss(sb, gather=gather).losses
        return out.detach(), torch.autograd.grad(out.sum(), sb.policy_logps)[0]

    outs = run_on_ranks(rank, len(sizes))
    torch.testing.assert_close(torch.cat([o for o, _ in outs]), full.detach(), rtol=1e-12, atol=1e-10)
    torch.testing.assert_close(torch.cat([gr for _, gr in outs]), g_full, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(full.detach(), LIST_REFERENCES[name](b, params), rtol=1e-10, atol=1e-9)


def test_gathered_normalisation_by_hand_on_two_ranks():
    """β = 1, r_ε = r_rest = 0, ε = 0, log π = 0, mml.  Rank 0: one group with log π_ref = (−1, −3); rank 1: one group
    (−2, −5, −4).  Over both ranks min R = −5, max = −1, so R̂ = (R + 5)/4 and the losses are −log(e¹ + e^½) and
    −log(e^¾ + e⁰ + e^¼).  Rank 1 alone would normalise over (−5, −2) instead."""
    p = dict(beta=1.0, reward_epsilon=0.0, rejected_reward=0.0, norm_eps=0.0)
    t = lambda *rows: torch.tensor(rows, dtype=F64)  # noqa: E731
    shards = [GroupBatch(policy_logps=t([0.0, 0.0]), ref_logps=t([-1.0, -3.0])),
              GroupBatch(policy_logps=t([0.0, 0.0, 0.0]), ref_logps=t([-2.0, -5.0, -4.0]))]
    loss = prefzoo.get_loss("mml", **p)
    outs = run_on_ranks(lambda r, gather: loss(shards[r], gather=gather).losses.detach(), 2)
    want = [-math.log(math.e + math.exp(0.5)), -math.log(math.exp(0.75) + 1 + math.exp(0.25))]
    assert [o.item() for o in outs] == pytest.approx(want, rel=1e-14)
    alone = loss(shards[1]).losses.item()
    assert abs(alone - want[1]) > 0.1


# --- the kit's list properties bite ---------------------------------------------------------------------------------


def _mutant(fn):
    from dataclasses import dataclass

    @dataclass(frozen=True, kw_only=True)
    class NoParams(prefzoo.LossParams):
        pass

    spec = prefzoo.LossSpec(name="mutant", fn=fn, params_cls=NoParams, family="t", formula="", paper="", scores="",
                            monotone=False, shapes=frozenset({prefzoo.Shape.LIST}))
    return prefzoo.Loss(spec, NoParams())


def _out(losses, s):
    sd = s.detach()
    return prefzoo.LossOutput(losses, sd[:, 0], sd[:, -1], rewards=sd)


@pytest.mark.parametrize(("prop", "fn", "match"), [
    ("list-padding", lambda b, p, c: _out(-torch.logsumexp(b.policy_logps, dim=1), b.policy_logps),  # no mask
     r"^mutant: losses after adding a padding slot to every group at index \d+: got "),
    ("list-within-group-permutation", lambda b, p, c: _out(-b.policy_logps[:, 0], b.policy_logps),  # column 0
     r"^mutant: losses after permuting every group's completions by \[[\d, ]+\] at index \d+: got "),
    ("list-permutation", lambda b, p, c: _out(-b.policy_logps.sum(1) * torch.arange(1, b.batch_size + 1),
                                              b.policy_logps),  # depends on the group's position
     r"^mutant: losses after permuting the groups by \[[\d, ]+\] at index \d+: got "),
    ("list-low-precision", lambda b, p, c: _out((-torch.logsumexp(b.policy_logps.masked_fill(~b.valid, -torch.inf),
                                                                  dim=1) + 1e4) - 1e4, b.policy_logps),  # ±1e-3 in fp32
     r"^mutant: torch.float32 loss vs float64 on the same inputs at index \d+: got "),
    ("list-batch-decoupled", lambda b, p, c: _out(-b.policy_logps[:, 0] + b.policy_logps.detach()[:, 0].mean(),
                                                  b.policy_logps),  # batch mean, declared batch_coupled=False
     r"^mutant: per-example loss in micro-batches \[\d+, \d+\] differs from the full batch \(batch_coupled=False\)"),
])
def test_list_properties_fail_on_broken_losses(prop, fn, match):
    """Each broken list loss fails its property with a message naming the loss, what changed and where; mml passes."""
    report = prefzoo.testing.check_loss(_mutant(fn), properties=[prop], max_examples=60, max_batch=8,
                                        dtypes=["float64", "float32"], derandomize=True)
    (res,) = report.results
    assert res.status == "failed" and re.search(match, res.message), report.table() + report.failures_text()
    assert prefzoo.testing.check_loss("mml", properties=[prop], max_examples=20, derandomize=True).passed


@pytest.mark.parametrize("name", ["mml", "mmpo-list", "dpo-pl", "lipo", "rrhf"])
def test_float32_groups_keep_the_within_group_permutation(name):
    """The check compares in float64 on the float64 copy of the batch: a float32 sum reordered by the permutation
    (a few ulps) is not a failure of the loss."""
    report = prefzoo.testing.check_loss(name, properties=["list-within-group-permutation"], max_examples=20,
                                        dtypes=["float32"], derandomize=True)
    assert report.passed, report.table() + report.failures_text()


@pytest.mark.parametrize("name", sorted(LIST_REFERENCES))
def test_list_losses_equal_their_references_with_lengths_and_padding(name):
    """Every list loss on a float64 group batch with lengths, scores with a tie and a padding slot equals
    prefzoo.testing.reference_lists' formula (rrhf reads the lengths)."""
    gen = torch.Generator().manual_seed(3)
    g, k = 3, 4
    mask = torch.ones(g, k, dtype=torch.bool)
    mask[1, 3] = False
    b = GroupBatch(policy_logps=-20 * torch.rand(g, k, generator=gen, dtype=F64),
                   ref_logps=-20 * torch.rand(g, k, generator=gen, dtype=F64),
                   lengths=torch.randint(1, 30, (g, k), generator=gen),
                   scores=torch.tensor([[3.0, 1.0, 1.0, 0.0], [2.0, 0.0, 1.0, 9.0], [0.5, 1.5, 2.5, 3.5]], dtype=F64),
                   mask=mask)
    loss = prefzoo.get_loss(name)
    torch.testing.assert_close(loss(b).losses.detach(), LIST_REFERENCES[name](b, loss.params), rtol=1e-10,
                               atol=1e-10)


def test_group_from_pairs_feeds_list_losses_the_pair_gradients():
    """A list loss on pairs: gradients reach the PreferenceBatch's fields through group_from_pairs."""
    b = PreferenceBatch(policy_chosen_logps=torch.tensor([-1.0], dtype=F64, requires_grad=True),
                        policy_rejected_logps=torch.tensor([-2.0], dtype=F64, requires_grad=True),
                        ref_chosen_logps=torch.zeros(1, dtype=F64), ref_rejected_logps=torch.zeros(1, dtype=F64))
    g = group_from_pairs(b)
    out = prefzoo.get_loss("dpo-pl", beta=1.0)(g)
    gw, gl = torch.autograd.grad(out.losses.sum(), [b.policy_chosen_logps, b.policy_rejected_logps])
    assert gw.item() == pytest.approx(-torch.sigmoid(torch.tensor(-1.0)).item())
    assert gl.item() == pytest.approx(torch.sigmoid(torch.tensor(-1.0)).item())


@pytest.mark.parametrize("name", ["mml", "mmpo-list"])
@pytest.mark.parametrize(("beta", "norm_eps"), [(0.5, 0.01), (0.0, 0.0)])
def test_equal_scores_everywhere_give_the_references_degenerate_normalisation(name, beta, norm_eps):
    """Every completion scored the same: the scores' min-max range is 0, so each gets reward 0 (and with β = 0, ε = 0
    the rewards' range is 0 too, each R̂ = 0): prefzoo and the reference agree, finite, on both."""
    gen = torch.Generator().manual_seed(5)
    b = GroupBatch(policy_logps=-20 * torch.rand(2, 3, generator=gen, dtype=F64),
                   ref_logps=-20 * torch.rand(2, 3, generator=gen, dtype=F64),
                   scores=torch.full((2, 3), 2.0, dtype=F64), mask=torch.ones(2, 3, dtype=torch.bool))
    spec = prefzoo.loss_spec(name)
    p = spec.params(reward_from="score", beta=beta, norm_eps=norm_eps)
    got = prefzoo.Loss(spec, p)(b).losses.detach()
    want = LIST_REFERENCES[name](b, p)
    assert torch.isfinite(got).all()
    torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)
