"""The conformance kit on shaped plugin losses: every unpaired property runs and a broken loss fails one; the list
properties' tolerances are as tight as documented (each broken loss below sits just outside one), and shared
properties read the same in every shape's report."""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass

import pytest
import torch
import torch.nn.functional as F

import prefzoo
from prefzoo.testing import GENERIC_PROPERTIES, LIST_PROPERTIES, UNPAIRED_PROPERTIES, PropertyFailure, check_loss
from prefzoo.testing.properties_shapes import (
    check_list_monotone,
    check_padding_invariance,
    check_shape_decoupled,
    check_shape_low_precision,
    check_shape_permutation,
    fresh,
    shape_grads,
)


@dataclass(frozen=True, kw_only=True)
class _Beta(prefzoo.LossParams):
    beta: float = prefzoo.param(0.1, "β", gt=0.0)


def _toy(sign: float):
    """−log σ(±β·(log π − log π_ref)): + for desirable, − for undesirable (sign = −1 breaks the desirable side)."""

    def fn(b, p, ctx):
        r = p.beta * (b.policy_logps - b.ref_logps.detach())  # (N,)
        z = torch.where(b.labels, sign * r, -r)
        rd = r.detach()
        return prefzoo.LossOutput(-F.logsigmoid(z), rd, torch.zeros_like(rd), rewards=rd)

    spec = prefzoo.LossSpec(name="toy-unpaired", fn=fn, params_cls=_Beta, family="t", formula="", paper="",
                            scores="", needs=frozenset({prefzoo.Need.REFERENCE}), shift_invariant=True,
                            shapes=frozenset({prefzoo.Shape.UNPAIRED}), plugin="tests")
    return spec


def test_an_unpaired_loss_gets_the_unpaired_properties_and_passes():
    report = check_loss(_toy(1.0), max_examples=15, derandomize=True)
    ran = {r.name for r in report.results if r.status != "n/a"}
    assert {"unpaired-finite", "unpaired-permutation", "unpaired-sharded-gather", "unpaired-monotone",
            "unpaired-low-precision"} <= ran, ran
    assert not any(n.startswith(("list-", "finite")) for n in ran)  # no pair or list property on an unpaired loss
    assert report.passed, report.table() + report.failures_text()


def test_a_wrong_sign_on_desirable_completions_fails_unpaired_monotone():
    report = check_loss(_toy(-1.0), properties=["unpaired-monotone"], max_examples=30, derandomize=True)
    assert not report.passed and "desirable completion" in report.results[0].message, report.table()


def test_unpaired_monotone_sees_a_float64_sized_wrong_sign():
    """+1e-8·log π(y) on every completion: ∂L/∂log π = +1e-8 for desirable ones, far above float64's tolerance
    (64·u₆₄·scale ≈ 1e-14·scale) but below float32's (≈ 4e-6·scale), so only the float64 tolerance catches it."""
    spec = _toy(1.0)
    sound = spec.fn

    def fn(b, p, ctx):
        out = sound(b, p, ctx)
        return prefzoo.LossOutput(out.losses.detach() + 1e-8 * b.policy_logps, out.chosen_rewards,
                                  out.rejected_rewards, rewards=out.rewards)

    broken = dataclasses.replace(spec, name="toy-wrong-sign", fn=fn, monotone=True)
    report = check_loss(broken, properties=["unpaired-monotone"], dtypes=["float64"], max_examples=10,
                        derandomize=True)
    (res,) = report.results
    assert res.status == "failed" and re.search(r"^toy-wrong-sign: ∂L/∂log π\(y\) = 1e-08 for a desirable completion",
                                                res.message), report.table() + report.failures_text()


def test_unpaired_sharded_gather_catches_a_local_batch_mean():
    """Declared batch-coupled, adds 0.01·tanh(mean reward of the local shard) without the gather hook: an error of
    about 1e-3, far above the property's 1e-9 tolerance."""
    spec = _toy(1.0)
    sound = spec.fn

    def fn(b, p, ctx):
        out = sound(b, p, ctx)
        return prefzoo.LossOutput(out.losses + 0.01 * torch.tanh(out.rewards.mean() + 1), out.chosen_rewards,
                                  out.rejected_rewards, rewards=out.rewards)

    broken = dataclasses.replace(spec, name="toy-local-mean", fn=fn, batch_coupled=True)
    report = check_loss(broken, properties=["unpaired-sharded-gather"], dtypes=["float64"], max_examples=20,
                        derandomize=True)
    (res,) = report.results
    assert res.status == "failed" and res.message.startswith("toy-local-mean: losses sharded as"), report.table()


# --- list properties: tolerances and the monotone check, on fixed batches ------------------------------------------


@dataclass(frozen=True, kw_only=True)
class _NoParams(prefzoo.LossParams):
    pass


def _list_loss(fn, monotone=False):
    spec = prefzoo.LossSpec(name="toy-list", fn=fn, params_cls=_NoParams, family="t", formula="", paper="",
                            scores="", monotone=monotone, shapes=frozenset({prefzoo.Shape.LIST}), plugin="tests")
    return prefzoo.Loss(spec, _NoParams())


def _list_out(losses, b):
    s = b.policy_logps.detach()
    return prefzoo.LossOutput(losses, s[:, 0], s[:, -1], rewards=s)


def _groups():
    """3 groups of 4 completions, log-probs in [−9, −1], distinct scores, a padding slot in group 1."""
    gen = torch.Generator().manual_seed(11)
    mask = torch.ones(3, 4, dtype=torch.bool)
    mask[1, 3] = False
    return prefzoo.GroupBatch(policy_logps=-1 - 8 * torch.rand(3, 4, generator=gen, dtype=torch.float64),
                              ref_logps=-1 - 8 * torch.rand(3, 4, generator=gen, dtype=torch.float64),
                              scores=torch.tensor([[3.0, 1.0, 2.0, 0.0], [0.0, 2.0, 1.0, 5.0], [1.0, 4.0, 3.0, 2.0]],
                                                  dtype=torch.float64), mask=mask)


def _lse(b):
    return torch.logsumexp(b.policy_logps.masked_fill(~b.valid, -torch.inf), dim=1)


def test_low_precision_tolerance_comes_from_ulp_sized_perturbations():
    """(−lse + 1e4) − 1e4 loses ~5e-4 in float32 at log-probs of −1 to −9: far outside 16·Δ_u with Δ_u from ±u32
    perturbations (~1e-5), though inside what a perturbation of the inputs by a factor of 2 would allow."""
    sound = _list_loss(lambda b, p, c: _list_out(-_lse(b), b))
    broken = _list_loss(lambda b, p, c: _list_out((-_lse(b) + 1e4) - 1e4, b))
    check_shape_low_precision(sound, _groups(), dtypes=(torch.float32,))
    with pytest.raises(PropertyFailure, match=r"^toy-list: torch.float32 loss vs float64 on the same inputs"):
        check_shape_low_precision(broken, _groups(), dtypes=(torch.float32,))


def test_low_precision_leaves_tied_scores_alone_so_their_order_cannot_widen_the_tolerance():
    """A list loss that reads the log-prob of the best-scored completion, ties to the first (a stable sort): the ±u
    perturbations that set the tolerance must leave the scores alone.  Perturbing tied scores would reorder them,
    move the loss by the gap between two log-probs (~1) and make the tolerance 16 times that, so the float32 loss of
    ``(x + 1e4) − 1e4`` (off by ~5e-4) would pass."""

    def top(b):
        order = torch.sort(b.scores.masked_fill(~b.valid, -torch.inf), dim=1, descending=True, stable=True).indices
        return b.policy_logps.gather(1, order[:, :1]).squeeze(1)

    tied = _groups().replace(scores=torch.tensor([[2.0, 2.0, 1.0, 0.0], [3.0, 3.0, 3.0, 0.0], [1.0, 1.0, 1.0, 1.0]],
                                                  dtype=torch.float64))
    sound = _list_loss(lambda b, p, c: _list_out(-top(b), b))
    broken = _list_loss(lambda b, p, c: _list_out((-top(b) + 1e4) - 1e4, b))
    check_shape_low_precision(sound, tied, dtypes=(torch.float32,))
    with pytest.raises(PropertyFailure, match=r"^toy-list: torch.float32 loss vs float64 on the same inputs"):
        check_shape_low_precision(broken, tied, dtypes=(torch.float32,))


def test_padding_gradient_tolerance_is_1e_12_relative():
    """A loss whose value ignores padding but whose gradient on the real slots moves by 2.5e-12 per padding slot
    (a straight-through term scaled by the number of slots): outside 1e-12·(1 + |∂L|) ≈ 2e-12, not outside 3e-12."""
    delta = 2.5e-12

    def fn(b, p, c):
        x = b.policy_logps.masked_fill(~b.valid, 0.0).sum(1)
        return _list_out(-x + delta * b.group_size * (x - x.detach()), b)

    with pytest.raises(PropertyFailure, match=r"^toy-list: ∂ΣL/∂policy_logps on the real slots after padding"):
        check_padding_invariance(_list_loss(fn), _groups())


def test_any_gradient_on_the_padding_slot_fails_however_small():
    """A straight-through term on the padding slots only: the value and the real slots' gradients are untouched, but
    the padding slot gets ∂L = 1e-3; the property allows it no gradient at all (tolerance 0, not a relative one)."""

    def fn(b, p, c):
        x = b.policy_logps
        leak = 1e-3 * (x - x.detach()).masked_fill(b.valid, 0.0).sum(1)
        return _list_out(-_lse(b) + leak, b)

    message = r"^toy-list: ∂ΣL/∂policy_logps on the padding slot at index 0: got 0.001"
    with pytest.raises(PropertyFailure, match=message):
        check_padding_invariance(_list_loss(fn), _groups())


def test_a_field_the_loss_ignores_gets_a_zero_gradient_and_the_gradient_checks_still_run():
    """A list loss given token-level log-probs it does not read: their gradient is zero (not a crash), so the
    padding property, which compares every field's gradient, passes it."""
    gen = torch.Generator().manual_seed(5)
    b = _groups().replace(policy_token_logps=-torch.rand(3, 4, 6, generator=gen, dtype=torch.float64),
                          token_mask=torch.ones(3, 4, 6, dtype=torch.bool))
    loss = _list_loss(lambda b, p, c: _list_out(-_lse(b), b))
    _, g = shape_grads(loss, fresh(b))
    assert set(g) == {"policy_logps", "policy_token_logps"}
    assert g["policy_token_logps"].shape == (3, 4, 6) and not bool(g["policy_token_logps"].any())
    check_padding_invariance(loss, b)


def _top1(sign):
    """±(−log softmax of the best-scored completion): + is monotone (the best gets ∂L ≤ 0, the worst ≥ 0)."""

    def fn(b, p, c):
        best = b.scores.masked_fill(~b.valid, -torch.inf).argmax(1, keepdim=True)
        logp = torch.log_softmax(b.policy_logps.masked_fill(~b.valid, -torch.inf), dim=1)
        return _list_out(-sign * logp.gather(1, best).squeeze(1), b)

    return _list_loss(fn, monotone=True)


def test_list_monotone_passes_a_monotone_list_loss_and_names_a_wrong_sign():
    """No built-in list loss declares monotone, so only plugin losses reach this property: it must pass a sound one
    and name the group and slot of a wrong sign."""
    check_list_monotone(_top1(1.0), _groups())
    with pytest.raises(PropertyFailure, match=r"^toy-list: ∂L/∂log π of group 0's best completion \(slot 0\) is "):
        check_list_monotone(_top1(-1.0), _groups())


@pytest.mark.parametrize("kit", [LIST_PROPERTIES, UNPAIRED_PROPERTIES], ids=["list", "unpaired"])
@pytest.mark.parametrize("name", ["reference-free", "low-precision", "sharded-gather"])
def test_a_shared_property_reads_the_same_in_every_shapes_report(kit, name):
    """The report table shows each property's guarantee: the same check says the same thing for pairs, lists and
    unpaired completions."""
    pair = {p.name: p.guarantee for p in GENERIC_PROPERTIES}
    shaped = {p.name.split("-", 1)[1]: p.guarantee for p in kit}
    assert shaped[name] == pair[name]


def _peeks_at_reference(shape: str, declared: bool) -> prefzoo.LossSpec:
    """A list or unpaired loss computed from log π + 0.01·log π_ref when reference log-probs are given (none is
    read as zeros): reference-dependent, declared as needing the reference or not."""

    def fn(b, p, ctx):
        ref = b.ref_logps if b.ref_logps is not None else torch.zeros_like(b.policy_logps)
        s = b.policy_logps + 0.01 * ref
        if shape == "list":
            return _list_out(-torch.log_softmax(s.masked_fill(~b.valid, -torch.inf), dim=1)[:, 0], b)
        sd = s.detach()
        return prefzoo.LossOutput(-F.logsigmoid(torch.where(b.labels, s, -s)), sd, torch.zeros_like(sd), rewards=sd)

    needs = frozenset({prefzoo.Need.REFERENCE}) if declared else frozenset()
    kind = prefzoo.Shape.LIST if shape == "list" else prefzoo.Shape.UNPAIRED
    return prefzoo.LossSpec(name=f"toy-{shape}-peeks", fn=fn, params_cls=_NoParams, family="t", formula="", paper="",
                            scores="", needs=needs, shapes=frozenset({kind}), plugin="tests")


@pytest.mark.parametrize("shape", ["list", "unpaired"])
def test_reference_free_fails_a_shaped_loss_that_reads_the_reference_unless_it_declares_it(shape):
    """Not declared: the property runs and fails with its message. Declared (Need.REFERENCE): it does not apply."""
    name = f"{shape}-reference-free"
    undeclared = check_loss(_peeks_at_reference(shape, False), properties=[name], dtypes=["float64"],
                            max_examples=5, derandomize=True)
    (res,) = undeclared.results
    assert res.status == "failed", undeclared.table() + undeclared.failures_text()
    assert res.message.startswith(f"toy-{shape}-peeks: losses changed when reference log-probs were supplied")
    declared = check_loss(_peeks_at_reference(shape, True), properties=[name], dtypes=["float64"], max_examples=5,
                          derandomize=True)
    assert [r.status for r in declared.results] == ["n/a"], declared.table()


@pytest.mark.parametrize("loss", ["dpo-pl", "kto"])
def test_the_report_states_the_shaped_detached_guarantee_with_the_rewards_it_checks(loss):
    """List and unpaired losses report per-completion ``rewards`` beside the scores, and their detached property
    checks them too: the report's guarantee says so, word for word (the pairs' one says only scores and metrics)."""
    prefix = "list" if loss == "dpo-pl" else "unpaired"
    report = check_loss(loss, max_examples=2, properties=[f"{prefix}-detached-rewards"])
    row = next(line for line in report.table().splitlines() if line.startswith(f"{prefix}-detached-rewards "))
    assert row.endswith("s  scores, rewards and metrics are detached") and "PASSED" in row


def test_an_unpaired_permutation_failure_names_completions_not_groups():
    """A toy unpaired loss plus its completion's position fails permutation, and the message says what was permuted."""
    spec = _toy(1.0)
    shifted = dataclasses.replace(spec, fn=lambda b, p, c: dataclasses.replace(
        out := spec.fn(b, p, c), losses=out.losses + 0.5 * torch.arange(b.batch_size, dtype=out.losses.dtype)))
    t = lambda *v: torch.tensor(v, dtype=torch.float64)  # noqa: E731
    b = prefzoo.UnpairedBatch(policy_logps=t(-1.0, -2.0, -3.0, -4.0), ref_logps=t(-1.5, -1.0, -2.5, -4.5),
                              labels=torch.tensor([True, False, True, False]))
    message = r"^toy-unpaired: losses after permuting the completions by \[2, 1, 3, 0\]"
    with pytest.raises(PropertyFailure, match=message):
        check_shape_permutation(prefzoo.Loss(shifted, _Beta()), b)


def test_the_docs_table_of_shaped_properties_is_the_kits_own_guarantees():
    """docs/properties.md lists every list and unpaired property with the guarantee its report prints, word for
    word once the page's formulas ($...$) are read as text, and nothing else: the page cannot drift from the kit."""
    from pathlib import Path

    from prefzoo.spec import text_of

    page = (Path(__file__).resolve().parents[2] / "docs" / "properties.md").read_text()
    section = page.split("### Lists and unpaired completions", 1)[1].split("\n## ", 1)[0]
    rows = {}
    for line in section.splitlines():
        if line.startswith("| `"):
            name, guarantee = (cell.strip() for cell in line.strip("|").split(" | ", 1))
            rows[name.strip("`")] = text_of(guarantee.replace("\\|", "|"))
    kit = {p.name: p.guarantee for p in (*LIST_PROPERTIES, *UNPAIRED_PROPERTIES)}
    assert rows == kit


def test_batch_decoupled_runs_in_float64_so_a_coupling_below_float32_rounding_is_still_found():
    """A float32 batch is checked in float64: a per-example loss plus 1e-9 × its micro-batch's mean log π (far
    below float32's resolution at a loss near 1, so float32 would round the coupling away) fails."""
    spec = _toy(1.0)
    coupled = dataclasses.replace(spec, fn=lambda b, p, c: dataclasses.replace(
        out := spec.fn(b, p, c), losses=out.losses + 1e-9 * b.policy_logps.mean()))  # fmt: skip
    t = lambda *v: torch.tensor(v, dtype=torch.float32)  # noqa: E731
    b = prefzoo.UnpairedBatch(policy_logps=t(-1.0, -2.0, -3.0, -4.0), ref_logps=t(-1.5, -1.0, -2.5, -4.5),
                              labels=torch.tensor([True, False, True, False]))
    with pytest.raises(PropertyFailure, match=r"^toy-unpaired: per-example loss in micro-batches \[2, 2\] differs"):
        check_shape_decoupled(prefzoo.Loss(coupled, _Beta()), b)
    check_shape_decoupled(prefzoo.Loss(spec, _Beta()), b)  # the sound loss passes
