"""The kit's generic checks called one by one (prefzoo/testing/properties.py): the failures each one states, the
losses each one must leave alone, and its helpers."""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch

import prefzoo
from prefzoo.testing import properties as P
from prefzoo.types import LossOutput
from tests.testing._probes import changed, probe_loss

F = torch.float64


def _batch(**kw) -> prefzoo.PreferenceBatch:
    t = lambda *v: torch.tensor(v, dtype=F)  # noqa: E731
    base = dict(policy_chosen_logps=t(-1.0, -4.0, -2.0), policy_rejected_logps=t(-3.0, -1.5, -2.5),
                ref_chosen_logps=t(-1.5, -3.0, -2.0), ref_rejected_logps=t(-2.0, -2.0, -3.0))  # fmt: skip
    return prefzoo.PreferenceBatch(**{**base, **kw})


def test_shape_fails_when_the_losses_were_cut_from_the_graph():
    cut = changed("dpo", losses=lambda b, o: o.losses.detach())
    with pytest.raises(P.PropertyFailure) as e:
        P.check_shape(probe_loss(cut), _batch())
    assert str(e.value) == "probe: losses do not require grad although policy log-probs do: the graph was cut"
    P.check_shape(probe_loss(prefzoo.loss_spec("dpo").fn), _batch())


def test_detached_rewards_fails_on_a_metric_that_keeps_the_graph():
    leaky = changed("dpo", metrics=lambda b, o: {"margin": o.losses.mean()})
    with pytest.raises(P.PropertyFailure) as e:
        P.check_detached_rewards(probe_loss(leaky), _batch())
    assert str(e.value) == "probe: metrics['margin'] requires grad; return it .detach()ed"
    detached = changed("dpo", metrics=lambda b, o: {"margin": o.losses.mean().detach()})
    P.check_detached_rewards(probe_loss(detached), _batch())  # a detached tensor metric is what the check asks for


def test_cast_batch_gives_leaves_and_only_the_policy_fields_require_grad():
    """The reference log-probs are constants: cast_batch makes every float field a new leaf of the dtype asked for,
    and only the policy log-probs require grad (none with requires_grad=False)."""
    b = _batch()
    for requires_grad in (True, False):
        c = P.cast_batch(b, torch.float32, requires_grad=requires_grad)
        given = {n: getattr(c, n) for n in ("policy_chosen_logps", "policy_rejected_logps", "ref_chosen_logps",
                                            "ref_rejected_logps")}  # fmt: skip
        assert all(t.dtype == torch.float32 and t.grad_fn is None for t in given.values())
        want = {"policy_chosen_logps", "policy_rejected_logps"} if requires_grad else set()
        assert {n for n, t in given.items() if t.requires_grad} == want


_not_monotone = changed("dpo", losses=lambda b, o: o.losses + 5.0 * b.policy_chosen_logps)


def test_monotone_is_checked_only_where_it_is_declared():
    with pytest.raises(P.PropertyFailure, match=r"^probe: ∂L/∂log π\(y_w\) = "):
        P.check_monotone(probe_loss(_not_monotone), _batch())
    P.check_monotone(probe_loss(_not_monotone, monotone=False), _batch())  # declared not monotone: nothing to check


@pytest.mark.parametrize("side", ["chosen", "rejected"])
def test_monotone_names_the_first_pair_with_a_wrong_sign(side):
    """A wrong sign of 5 on pairs 1 and 2, none on pair 0: the failure names pair 1 with its gradient, ±(5 − β·σ(0.15))
    (DPO's own −β·σ(−β·margin) on y_w, margin (−4 + 3) − (−1.5 + 2) = −1.5, β = 0.1)."""
    w = torch.tensor([0.0, 1.0, 1.0], dtype=F)
    sign = 1.0 if side == "chosen" else -1.0
    wrong = changed("dpo", losses=lambda b, o: o.losses + sign * 5.0 * w * getattr(b, f"policy_{side}_logps"))
    value = sign * (5.0 - 0.1 / (1.0 + math.exp(-0.15)))
    y, op = ("y_w", ">") if side == "chosen" else ("y_l", "<")
    with pytest.raises(P.PropertyFailure) as e:
        P.check_monotone(probe_loss(wrong), _batch())
    pair_1 = "policy_chosen_logps=-4.0, policy_rejected_logps=-1.5, ref_chosen_logps=-3.0, ref_rejected_logps=-2.0"
    assert str(e.value).startswith(f"probe: ∂L/∂log π({y}) = {value:.6g} {op} 0 at example 1 ({pair_1}) with ")
    what = "chosen likelihood increases" if side == "chosen" else "rejected likelihood decreases"
    assert str(e.value).endswith(f": raising the {what} the loss, but the spec declares monotone=True")


def _linear(gw, gl) -> prefzoo.Loss:
    """L = gw·log π(y_w) + gl·log π(y_l) per pair (DPO's spec, so declared monotone): its gradients are gw and gl."""
    a, c = torch.tensor(gw, dtype=F), torch.tensor(gl, dtype=F)

    def fn(b, p, ctx):
        z = torch.zeros_like(b.policy_chosen_logps.detach())
        return LossOutput(a * b.policy_chosen_logps + c * b.policy_rejected_logps, z, z)

    return probe_loss(fn)


@pytest.mark.parametrize("side", ["chosen", "rejected"])
def test_monotone_allows_rounding_up_to_its_bound_exactly_and_names_the_pair_beyond_it(side):
    """The bound is 64·u·(1 + max|∂L|)·(1 + max|log π|).  With u = 2⁻⁵³, max|∂L| = 1 (the other side's gradient on
    pair 0, of the allowed sign) and max|log π| = 1, it is 2⁻⁴⁵ exactly: a wrong-signed gradient of 2⁻⁴⁵ is rounding
    and passes; one of 2⁻⁴⁴ fails, and with both in the batch the failure names the pair beyond the bound (1), not
    the one on it (0)."""
    t = lambda *v: torch.tensor(v, dtype=F)  # noqa: E731
    b = _batch(policy_chosen_logps=t(-1.0, -0.5, -0.25), policy_rejected_logps=t(-0.5, -0.75, -1.0))
    s = 2.0**-45
    sign, y, op = (1.0, "y_w", ">") if side == "chosen" else (-1.0, "y_l", "<")

    def loss(*wrong):  # ±wrong on the checked side; an allowed gradient of magnitude 1 on pair 0 of the other
        w = [sign * x for x in wrong]
        return _linear(w, [1.0, 0.0, 0.0]) if side == "chosen" else _linear([-1.0, 0.0, 0.0], w)

    P.check_monotone(loss(s, 0.0, 0.0), b)
    with pytest.raises(P.PropertyFailure):  # just past the bound: 65/64 of it (the bound's 64, 1 and 1 are exact)
        P.check_monotone(loss(s * 65 / 64, 0.0, 0.0), b)
    with pytest.raises(P.PropertyFailure) as e:
        P.check_monotone(loss(s, 2 * s, 0.0), b)
    assert str(e.value).startswith(f"probe: ∂L/∂log π({y}) = {sign * 2 * s:.6g} {op} 0 at example 1 (")


_reads_the_batch_mean = changed(
    "dpo", losses=lambda b, o: o.losses + 0.1 * torch.tanh(b.policy_chosen_logps.detach().mean())
)


def test_batch_decoupled_is_checked_only_for_losses_not_declared_coupled():
    with pytest.raises(P.PropertyFailure, match=r"^probe: per-example loss in micro-batches"):
        P.check_batch_decoupled(probe_loss(_reads_the_batch_mean), _batch())
    P.check_batch_decoupled(probe_loss(_reads_the_batch_mean, batch_coupled=True), _batch())


def test_grads_is_empty_when_nothing_requires_grad():
    loss = prefzoo.get_loss("dpo")
    out, g = P.grads(loss, _batch())
    assert g == {} and not out.losses.requires_grad
    out, g = P.grads(loss, P.cast_batch(_batch()))
    assert sorted(g) == ["policy_chosen_logps", "policy_rejected_logps"]
    assert torch.equal(g["policy_chosen_logps"], -g["policy_rejected_logps"])  # DPO: ∂L/∂s_w = −∂L/∂s_l

    def constant(batch, p, ctx):
        return LossOutput(torch.zeros(batch.batch_size, dtype=F), torch.zeros(3, dtype=F), torch.zeros(3, dtype=F))

    out, g = P.grads(probe_loss(constant), P.cast_batch(_batch()))  # the inputs require grad, the losses do not
    assert g == {} and torch.equal(out.losses, torch.zeros(3, dtype=F))


def test_a_permuted_batch_permutes_its_ids_with_its_pairs():
    b = _batch(example_ids=("a", "b", "c"))
    got = P._take(b, torch.tensor([2, 0, 1]))
    assert got.example_ids == ("c", "a", "b")
    assert got.policy_chosen_logps.tolist() == [-2.0, -1.0, -4.0]


def test_permutation_never_uses_the_identity_even_when_the_seeded_draw_is_one():
    """The permutation is seeded by the batch size, and for 2 pairs that draw is the identity, which no loss can fail:
    the check reverses it.  A loss that adds its pair's position fails on 2 pairs, under the permutation [1, 0]."""
    assert torch.randperm(2, generator=torch.Generator().manual_seed(2)).tolist() == [0, 1]  # the draw the check gets
    by_position = changed("dpo", losses=lambda b, o: o.losses + 0.5 * torch.arange(b.batch_size, dtype=F))
    two = _batch(**{n: getattr(_batch(), n)[:2] for n in ("policy_chosen_logps", "policy_rejected_logps",
                                                         "ref_chosen_logps", "ref_rejected_logps")})
    with pytest.raises(P.PropertyFailure, match=r"^probe: losses after permutation \[1, 0\] at example 0 "):
        P.check_permutation(probe_loss(by_position), two)
    P.check_permutation(probe_loss(prefzoo.loss_spec("dpo").fn), two)


def test_perturbed_params_scale_the_float_fields_and_keep_anything_else():
    loss = prefzoo.get_loss("dpo", beta=0.2)
    p = P._perturbed_params(loss, 0.5)
    assert p.beta == pytest.approx(0.3) and p.f_divergence == loss.params.f_divergence

    class Plain:  # a params object that is not a dataclass: left as it is
        beta = 0.1

    plain = Plain()
    odd = prefzoo.get_loss("dpo")
    object.__setattr__(odd, "params", plain)
    assert P._perturbed_params(odd, 0.5) is plain


def test_unit_roundoff_of_each_compute_dtype():
    assert P.unit_roundoff(torch.float64) == 2.0**-53
    assert P.unit_roundoff(torch.float32) == 2.0**-24 and P.unit_roundoff(torch.bfloat16) == 2.0**-24  # upcast


def test_the_reference_property_of_a_plugin_loss_without_a_formula_is_skipped_with_the_fix():
    from prefzoo.testing import conformance_tests

    spec = dataclasses.replace(prefzoo.loss_spec("dpo"), name="no-formula", plugin="tests")
    test = conformance_tests(spec)
    with pytest.raises(pytest.skip.Exception) as e:
        test("reference")
    assert str(e.value) == "no reference formula given (pass reference=fn to conformance_tests)"
    with_formula = conformance_tests(spec, reference=lambda b, p: prefzoo.Loss(spec, p)(b).losses, max_examples=3)
    try:
        with_formula("reference")  # given a formula, the property runs (and this one holds)
    except pytest.skip.Exception as skipped:
        pytest.fail(f"skipped although a reference was given: {skipped}")


@pytest.mark.parametrize(
    ("dtypes", "compared"),
    [(["bfloat16"], (torch.bfloat16,)), (["float32", "bfloat16"], (torch.float32, torch.bfloat16)),
     (["float64"], (torch.float32,))],  # only float64 asked for: float32 is still compared against it
)  # fmt: skip
def test_low_precision_compares_the_dtypes_asked_for(monkeypatch, dtypes, compared):
    from prefzoo.testing import check_loss, conformance

    seen = set()
    monkeypatch.setattr(conformance, "check_low_precision", lambda loss, b, low: seen.add(low))
    report = check_loss("dpo", properties=["low-precision"], dtypes=dtypes, max_examples=2)
    assert report.passed and seen == {compared}


def test_shift_invariance_tolerance_comes_from_the_two_margin_perturbations_only():
    """The shift check's tolerance is 1e-9·(1 + |L|) + 100·Δ, Δ the larger change of L under the two margin
    perturbations (chosen inputs × (1 + u), rejected × (1 − u), the parameters × (1 − u); then all reversed), u =
    1e-12: computed here by hand.  At ρ_w = ρ_l = 0 those two barely move this DPO (β = 10) plus 1e-3·(log π_w +
    log π_l), where a random sign pattern would move it 200 times more and loosen the check as much."""
    broken = changed("dpo", losses=lambda b, o: o.losses + 1e-3 * (b.policy_chosen_logps + b.policy_rejected_logps))
    probe = probe_loss(broken)
    loss = prefzoo.Loss(probe.spec, dataclasses.replace(probe.params, beta=10.0))
    t = lambda v: torch.tensor([v], dtype=F)  # noqa: E731
    pw, pl, rw, rl = -20.0, -300.0, -20.0, -300.0

    def value(s_w, s_l, s_beta):
        bound = prefzoo.Loss(probe.spec, dataclasses.replace(probe.params, beta=10.0 * (1 + s_beta)))
        b = prefzoo.PreferenceBatch(t(pw * (1 + s_w)), t(pl * (1 + s_l)), t(rw * (1 + s_w)), t(rl * (1 + s_l)))
        return float(bound(b).losses)

    u = 1e-12
    base = value(0.0, 0.0, 0.0)
    delta = max(abs(value(u, -u, -u) - base), abs(value(-u, u, u) - base))
    tolerance = 1e-9 * (1 + abs(base)) + 100 * delta
    with pytest.raises(P.PropertyFailure) as e:
        P.check_shift_invariance(loss, prefzoo.PreferenceBatch(t(pw), t(pl), t(rw), t(rl)))
    assert str(e.value).endswith(f"> tolerance {tolerance:.3g})"), (str(e.value), tolerance)


def test_batch_decoupled_names_the_pair_whose_loss_its_micro_batch_changed():
    """A DPO plus 1e-3 × its micro-batch's mean log π(y_w): the failure shows the first pair's inputs."""
    coupled = changed("dpo", losses=lambda b, o: o.losses + 1e-3 * b.policy_chosen_logps.mean())
    with pytest.raises(P.PropertyFailure) as e:
        P.check_batch_decoupled(probe_loss(coupled), _batch())
    assert str(e.value).startswith(
        "probe: per-example loss in micro-batches [2, 1] differs from the full batch, but the spec says "
        "batch_coupled=False at example 0 (policy_chosen_logps=-1.0, policy_rejected_logps=-3.0, "
        "ref_chosen_logps=-1.5, ref_rejected_logps=-2.0): got "
    ), str(e.value)


def test_the_reference_free_check_draws_its_fake_references_from_its_own_generator():
    """The fake reference log-probs come from a seeded generator of the check's own: the same draw every call (a
    failure reproduces), and the caller's global RNG is left exactly as it was."""
    loss = prefzoo.get_loss("simpo")  # reference-free
    lengths = torch.tensor([3, 5, 4])
    batch = _batch(chosen_lengths=lengths, rejected_lengths=lengths.flip(0))
    torch.manual_seed(123)
    before = torch.get_rng_state()
    P.check_reference_free(loss, batch)
    assert torch.equal(torch.get_rng_state(), before)
    seen: list[torch.Tensor] = []

    class Spy:  # a "loss" that records the reference it is given
        name, spec, params = loss.name, loss.spec, loss.params

        def __call__(self, b):
            if b.ref_chosen_logps is not None:
                seen.append(b.ref_chosen_logps.clone())
            return loss(b)

    for seed in (0, 1):
        torch.manual_seed(seed)
        P.check_reference_free(Spy(), batch)
    assert len(seen) == 2 and torch.equal(seen[0], seen[1])
    assert seen[0].dtype == F and bool((seen[0] < 0).all()) and float(seen[0].min()) < -100  # log-probs, far from 0


def test_the_reference_free_check_supplies_both_references():
    """A loss that reads only the chosen reference (1e-6·tanh of it), on pairs given without references: the check
    must supply the chosen reference too, or the leak goes unseen."""
    base = prefzoo.get_loss("simpo")

    def fn(b, p, ctx):
        out = base.spec.fn(b, p, ctx)
        leak = 0.0 if b.ref_chosen_logps is None else 1e-6 * torch.tanh(b.ref_chosen_logps)
        return dataclasses.replace(out, losses=out.losses + leak)

    lengths = torch.tensor([3, 5, 4])
    batch = _batch(chosen_lengths=lengths, rejected_lengths=lengths.flip(0))
    bare = batch.replace(ref_chosen_logps=None, ref_rejected_logps=None)
    with pytest.raises(P.PropertyFailure, match=r"^probe: losses changed when reference log-probs were supplied"):
        P.check_reference_free(probe_loss(fn, "simpo"), bare)
