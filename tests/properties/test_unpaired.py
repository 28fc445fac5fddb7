"""Properties of the unpaired losses (kto, apo-zero-unpaired, bco) on random UnpairedBatches.

Domains: N in 1..24 completions, summed log-probs in [−1e4, 0] (ρ in ±10 or up to ±1e4, KL log-ratios ±10), β and the weights drawn from their
declared ranges (prefzoo.testing.loss_params), float64 unless stated.

* only-desirable (only-undesirable) batches: every loss is its desirable (undesirable) branch as the formula says,
  and every gradient ∂L/∂log π is ≤ 0 (≥ 0);
* mirror symmetry: flipping every label and reflecting each ρ about the reference point (z₀, 0, δ) leaves the losses
  unchanged (with λ_D = λ_U);
* permuting the examples permutes the losses;
* split across simulated ranks (uneven, a shard of one) with an all-gather: the same losses, z₀ and δ as one process;
* BCO's δ after any sequence of training batches is the mean of every reward β·ρ seen (TRL's running mean);
* float32 and bfloat16 inputs at |ρ| up to 1e4: finite losses within [0, λ] (KTO, APO) and finite gradients.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from hypothesis import given
from hypothesis import strategies as st

import prefzoo
from prefzoo.testing import loss_params
from prefzoo.testing.sharding import run_threads

F64 = torch.float64
NAMES = ["kto", "apo-zero-unpaired", "bco"]
SPECS = {n: prefzoo.loss_spec(n) for n in NAMES}
LOGP = st.floats(-1e4, 0.0, allow_nan=False, width=64)


@st.composite
def unpaired_batches(draw, *, min_size=1, max_size=24, labels=None, dtype=F64, span=1e4):
    """An UnpairedBatch with KL completions: ρ = log π − log π_ref in ±10 or ±``span``, ties (ρ = 0) drawn on purpose;
    mismatched-completion log-ratios in ±10."""
    n = draw(st.integers(min_size, max_size))
    ref = torch.tensor(draw(st.lists(LOGP, min_size=n, max_size=n)), dtype=F64)
    rhos = st.one_of(st.just(0.0), st.floats(-10, 10), st.floats(-span, span))  # mostly in σ's transition region
    rho = torch.tensor(draw(st.lists(rhos, min_size=n, max_size=n)), dtype=F64)
    kl_ref = torch.tensor(draw(st.lists(LOGP, min_size=n, max_size=n)), dtype=F64)
    kl = torch.tensor(draw(st.lists(st.floats(-10, 10), min_size=n, max_size=n)), dtype=F64)
    lab = labels if labels is not None else draw(st.lists(st.booleans(), min_size=n, max_size=n))
    lab = torch.tensor([lab] * n if isinstance(lab, bool) else lab)
    return prefzoo.UnpairedBatch(
        policy_logps=(ref + rho).to(dtype).requires_grad_(), ref_logps=ref.to(dtype), labels=lab,
        kl_policy_logps=(kl_ref + kl).to(dtype), kl_ref_logps=kl_ref.to(dtype),
    )


def _run(name, params, b, **kw):
    out = prefzoo.Loss(SPECS[name], params)(b, **kw)
    (g,) = torch.autograd.grad(out.losses.sum(), b.policy_logps)
    return out, g


def _branch(name, p, b, desirable: bool):
    """The formula's branch, written out in float64."""
    rho = (b.policy_logps.detach() - b.ref_logps).double()
    if name == "bco":
        r = p.beta * rho
        d = r.mean()  # δ after one batch, from δ = 0: the batch's mean reward
        return F.softplus(-(r - d)) if desirable else F.softplus(r - d)
    z0 = (b.kl_policy_logps - b.kl_ref_logps).double().mean().clamp(min=0) if name == "kto" else 0.0
    w = p.desirable_weight if desirable else p.undesirable_weight
    return w * torch.sigmoid(-p.beta * (rho - z0)) if desirable else w * torch.sigmoid(-p.beta * (z0 - rho))


@given(data=st.data(), name=st.sampled_from(NAMES), desirable=st.booleans())
def test_one_label_batches_follow_their_branch(data, name, desirable):
    p = data.draw(loss_params(SPECS[name]), label="params")
    b = data.draw(unpaired_batches(labels=desirable), label="batch")
    out, g = _run(name, p, b)
    torch.testing.assert_close(out.losses.detach(), _branch(name, p, b, desirable), atol=1e-12, rtol=1e-10)
    assert bool((g <= 0).all()) if desirable else bool((g >= 0).all()), g


@given(data=st.data(), name=st.sampled_from(NAMES))
def test_flipping_labels_and_mirroring_rho_about_the_reference_point(data, name):
    p = data.draw(loss_params(SPECS[name]), label="params")
    if name != "bco":
        p = SPECS[name].params(beta=p.beta, desirable_weight=p.desirable_weight, undesirable_weight=p.desirable_weight)
    b = data.draw(unpaired_batches(), label="batch")
    out, _ = _run(name, p, b)
    rho = b.policy_logps.detach() - b.ref_logps
    point = {"kto": out.metrics.get("kto/z0"), "bco": out.metrics.get("bco/delta")}.get(name)
    centre = torch.zeros((), dtype=F64) if point is None else point / (p.beta if name == "bco" else 1.0)
    mirrored = b.replace(policy_logps=(b.ref_logps + 2 * centre - rho).requires_grad_(), labels=~b.labels)
    out2, _ = _run(name, p, mirrored)
    scale = 1 + float(rho.abs().max()) * p.beta
    torch.testing.assert_close(out2.losses.detach(), out.losses.detach(), atol=1e-13 * scale, rtol=1e-9)


@given(data=st.data(), name=st.sampled_from(NAMES))
def test_permuting_examples_permutes_losses(data, name):
    p = data.draw(loss_params(SPECS[name]), label="params")
    b = data.draw(unpaired_batches(min_size=2), label="batch")
    perm = torch.tensor(data.draw(st.permutations(range(b.batch_size)), label="perm"))
    shuffled = b.replace(**{k: getattr(b, k)[perm] for k in ("ref_logps", "labels", "kl_policy_logps",
                                                             "kl_ref_logps")},
                         policy_logps=b.policy_logps.detach()[perm].requires_grad_())
    out, g = _run(name, p, b)
    out2, g2 = _run(name, p, shuffled)
    torch.testing.assert_close(out2.losses.detach(), out.losses.detach()[perm], atol=1e-12, rtol=1e-10)
    torch.testing.assert_close(g2, g[perm], atol=1e-12, rtol=1e-10)


@given(data=st.data(), name=st.sampled_from(NAMES))
def test_uneven_shards_with_a_gather_equal_one_process(data, name):
    p = data.draw(loss_params(SPECS[name]), label="params")
    b = data.draw(unpaired_batches(min_size=2), label="batch")
    n = b.batch_size
    cuts = sorted({1, *data.draw(st.sets(st.integers(1, n - 1), max_size=3), label="cuts")})
    bounds = list(zip([0, *cuts], [*cuts, n], strict=True))
    whole, _ = _run(name, p, b)
    fields = ("policy_logps", "ref_logps", "labels", "kl_policy_logps", "kl_ref_logps")

    def rank(r, ex):
        lo, hi = bounds[r]
        part = b.replace(**{k: getattr(b, k).detach()[lo:hi] for k in fields})
        return prefzoo.Loss(SPECS[name], p)(part, gather=lambda t: ex.gather(r, t))

    outs = run_threads(rank, len(bounds))
    torch.testing.assert_close(torch.cat([o.losses.detach() for o in outs]), whole.losses.detach(), atol=1e-12,
                               rtol=1e-10)
    for key in ("kto/z0", "bco/delta"):
        if key in whole.metrics:
            for o in outs:
                torch.testing.assert_close(o.metrics[key], whole.metrics[key], atol=1e-9, rtol=1e-12)


@given(data=st.data())
def test_bco_delta_is_the_mean_of_every_reward_seen(data):
    p = data.draw(loss_params(SPECS["bco"]), label="params")
    loss = prefzoo.Loss(SPECS["bco"], p)
    seen = []
    for _ in range(data.draw(st.integers(1, 5), label="steps")):
        b = data.draw(unpaired_batches(max_size=8, span=50.0), label="batch")
        if data.draw(st.booleans(), label="evaluate"):
            with torch.no_grad():
                loss(b)  # an evaluation call: δ is read, not advanced
        else:
            loss(b)
            seen.append(p.beta * (b.policy_logps.detach() - b.ref_logps))
    if seen:
        all_r = torch.cat(seen)
        torch.testing.assert_close(loss.state["delta"], all_r.mean(), atol=1e-12 * (1 + float(all_r.abs().max())),
                                   rtol=1e-10)
        assert float(loss.state["count"]) == all_r.numel()
    else:
        assert float(loss.state["delta"]) == 0 and float(loss.state["count"]) == 0


@given(data=st.data(), name=st.sampled_from(NAMES), dtype=st.sampled_from([torch.float32, torch.bfloat16]))
def test_low_precision_stays_finite_and_bounded(data, name, dtype):
    p = data.draw(loss_params(SPECS[name]), label="params")
    b = data.draw(unpaired_batches(dtype=dtype), label="batch")
    out, g = _run(name, p, b)
    assert bool(torch.isfinite(out.losses).all()) and bool(torch.isfinite(g).all()), (out.losses, g)
    if name != "bco":
        top = max(p.desirable_weight, p.undesirable_weight)
        assert bool((out.losses >= 0).all()) and bool((out.losses <= top * (1 + 1e-6)).all()), out.losses
    else:
        assert bool((out.losses >= 0).all())
