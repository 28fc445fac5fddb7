"""The conformance kit's own paths, each with a loss or a setting that only that path handles: examples counted and
settings honoured, a user reference compared per example, stateful losses from a fresh state, errors raised before
any example, the failure text, and the report's defaults (found by a complete mutmut run of conformance.py)."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from hypothesis import settings

import prefzoo
from prefzoo.testing import check_loss, conformance
from prefzoo.testing.conformance import ConformanceReport, FreshStateLoss, PropertyResult, describe_batch


def _spec(name: str = "dpo", **kw):
    return dataclasses.replace(prefzoo.loss_spec(name), name=f"probe-{name}", plugin="tests", **kw)


def test_examples_are_counted_and_max_examples_is_honoured():
    """A passing property runs exactly ``max_examples`` examples; without it, the active Hypothesis profile's."""
    (res,) = check_loss("dpo", max_examples=3, properties=["finite"], derandomize=True).results
    assert (res.status, res.examples, res.falsifying_example) == ("passed", 3, "")
    previous = settings.get_current_profile_name()
    settings.register_profile("prefzoo-four-examples", settings.get_profile(previous), max_examples=4)
    settings.load_profile("prefzoo-four-examples")
    try:
        (res,) = check_loss("dpo", properties=["finite"], derandomize=True).results
    finally:
        settings.load_profile(previous)
    assert res.examples == 4


def test_derandomize_and_the_batch_size_limit_reach_hypothesis(monkeypatch):
    """``derandomize`` given is the one used (not the profile's), and batches are drawn up to ``max_batch`` (64)."""
    seen: dict[str, object] = {}
    real_settings, real_batches = conformance.settings, conformance.batches_for

    def spy_settings(*a, **kw):
        seen["derandomize"] = kw.get("derandomize")
        return real_settings(*a, **kw)

    def spy_batches(*a, **kw):
        seen["max_size"] = kw.get("max_size")
        return real_batches(*a, **kw)

    monkeypatch.setattr(conformance, "settings", spy_settings)
    monkeypatch.setattr(conformance, "batches_for", spy_batches)
    check_loss("dpo", max_examples=1, properties=["finite"], derandomize=False)
    assert seen == {"derandomize": False, "max_size": 64}
    check_loss("dpo", max_examples=1, properties=["finite"], max_batch=3, derandomize=True)
    assert seen == {"derandomize": True, "max_size": 3}


def test_a_user_reference_is_compared_per_example_and_named_in_the_report():
    """A reference given by the user is compared example by example: one whose values are the loss's own, shifted by
    one example (the same batch mean), fails; the loss's own values pass.  The property's guarantee and the report's
    plugin are the documented ones."""
    from prefzoo.testing.reference import REFERENCES, to_float64

    fn, _ = REFERENCES["dpo"]
    own = check_loss("dpo", max_examples=5, properties=["reference"], reference=lambda b, p: fn(to_float64(b), p))
    rolled = check_loss("dpo", max_examples=20, properties=["reference"],
                        reference=lambda b, p: fn(to_float64(b), p).roll(1))  # fmt: skip
    assert own.passed and own.plugin == prefzoo.loss_spec("dpo").plugin and own.loss == "dpo"
    assert own.results[0].guarantee == "losses equal a float64 reference formula of the paper"
    assert rolled.results[0].status == "failed"


@pytest.mark.parametrize("mean_only", [True, False])
def test_a_builtin_reference_declared_mean_only_is_compared_on_the_mean(mean_only, monkeypatch):
    """REFERENCES' flag reaches the check: values rolled by one example keep the mean, so they pass a mean-only
    reference and fail a per-example one."""
    from prefzoo.testing import reference

    fn, _ = reference.REFERENCES["dpo"]
    monkeypatch.setitem(reference.REFERENCES, "dpo", (lambda b, p: fn(b, p).roll(1), mean_only))
    (res,) = check_loss("dpo", max_examples=20, properties=["reference"], derandomize=True).results
    assert res.status == ("passed" if mean_only else "failed"), res


def test_a_stateful_loss_is_checked_from_its_initial_state_with_the_callers_gather_and_update_flag():
    """bco keeps a running reward mean.  The kit binds it as FreshStateLoss: every call starts from the initial
    state, so two calls agree; the gather hook and ``update_state`` reach the loss."""
    from prefzoo.testing import run_sharded
    from prefzoo.testing.conformance import _bind

    spec = prefzoo.loss_spec("bco")
    params = spec.params()
    assert spec.stateful and type(_bind(spec, params)) is FreshStateLoss
    assert type(_bind(prefzoo.loss_spec("dpo"), prefzoo.loss_spec("dpo").params())) is prefzoo.Loss
    fresh = _bind(spec, params)
    assert fresh.spec is spec and fresh.params is params
    g = torch.Generator().manual_seed(0)
    n = 6
    batch = prefzoo.UnpairedBatch(
        policy_logps=-torch.rand(n, generator=g, dtype=torch.float64) * 20,
        ref_logps=-torch.rand(n, generator=g, dtype=torch.float64) * 20,
        labels=torch.tensor([True, False, True, True, False, False]),
    )
    other = batch.replace(policy_logps=batch.policy_logps + 5.0)  # another batch moves the running mean
    first, _, second = fresh(batch), fresh(other), fresh(batch)
    plain = prefzoo.Loss(spec, params)
    plain(other)
    assert torch.equal(first.losses, second.losses) and not torch.allclose(plain(batch).losses, first.losses)
    initial = prefzoo.Loss(spec, params).state
    kept = fresh(batch, update_state=False).state
    assert all(torch.equal(kept[k], initial[k]) for k in initial)
    assert not all(torch.equal(first.state[k], initial[k]) for k in initial)  # grad on: the state advanced
    whole = fresh(batch).losses
    sharded = torch.cat([o.losses for o in run_sharded(fresh, batch, [1, 2, 3])])  # the running mean over all ranks
    alone = torch.cat([fresh(p).losses for p in prefzoo.testing.shard_batch(batch, [1, 2, 3])])
    torch.testing.assert_close(sharded, whole, rtol=1e-12, atol=1e-12)
    assert not torch.allclose(alone, whole)
    assert check_loss("bco", max_examples=3, dtypes=("float64",), properties=["unpaired-sharded-gather"]).passed


def test_an_error_before_any_example_is_reported_with_its_own_type_and_message():
    """A batch strategy that raises while drawing (no example ran, nothing recorded) is an error naming that
    exception, with no falsifying example."""

    def raise_in_strategy(*a, **kw):
        from hypothesis import strategies as st

        def bad(_):
            raise LookupError("no batch today")

        return st.just(0).map(bad)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(conformance, "batches_for", raise_in_strategy)
        (res,) = check_loss("dpo", max_examples=2, properties=["finite"]).results
    assert (res.status, res.message, res.falsifying_example) == ("error", "LookupError: no batch today", "")


def test_a_loss_that_fails_only_once_is_reported_through_its_own_error():
    """A failure Hypothesis cannot reproduce (flaky) ends as an error; the message is the loss's own first
    failure, not Hypothesis's wrapper."""
    calls = [0]

    def once(batch, p, ctx):
        calls[0] += 1
        out = prefzoo.loss_spec("dpo").fn(batch, p, ctx)
        if calls[0] == 1:
            raise ValueError("only the first call fails")
        return out

    (res,) = check_loss(_spec(fn=once), max_examples=5, properties=["shape"], derandomize=True).results
    assert res.status == "error" and res.message == "ValueError: only the first call fails", res
    assert res.falsifying_example.startswith("params=")


def test_failures_text_lists_each_failure_on_its_own_lines():
    report = ConformanceReport("toy", "me", [
        PropertyResult("shape", "g1", "failed", message="m1", falsifying_example="e1"),
        PropertyResult("finite", "g2", "passed"),
        PropertyResult("monotone", "g3", "error", message="m3", falsifying_example="e3"),
    ])  # fmt: skip
    assert report.failures_text() == (
        "--- shape (failed): m1\n    falsifying example: e1\n--- monotone (error): m3\n    falsifying example: e3"
    )


def test_the_table_is_at_least_as_wide_as_its_header_for_short_names():
    report = ConformanceReport("toy", "me", [PropertyResult("sh", "g", "passed", examples=1)])
    assert report.table().splitlines()[1:4] == [
        "property  status   examples    time  guarantee",
        f"{'-' * 8}  {'-' * 7}  {'-' * 8}  {'-' * 6}  {'-' * 40}",
        "sh        PASSED          1    0.0s  g",
    ]


def test_describe_batch_shows_eight_values_by_default():
    t = torch.arange(9, dtype=torch.float64) - 20
    b = prefzoo.PreferenceBatch(t, t - 1)
    field = describe_batch(b, None).split("; ")[4]
    assert field == f"policy_chosen_logps={t[:8].tolist()!r}, ... (9 values)"
    assert describe_batch(prefzoo.PreferenceBatch(t[:8], t[:8]), None).split("; ")[4].endswith(f"{t[:8].tolist()!r}")


def test_unknown_names_list_every_known_property_and_dtype(monkeypatch):
    from prefzoo.testing import dtypes_from_env
    from prefzoo.testing.conformance import ALL_PROPERTIES

    with pytest.raises(ValueError) as e:
        check_loss("dpo", properties=["nope"])
    known = ", ".join([p.name for p in ALL_PROPERTIES] + ["reference"])
    assert str(e.value) == f"unknown property 'nope'; known: {known}"
    monkeypatch.setenv("PREFZOO_TEST_DTYPES", "float8")
    with pytest.raises(ValueError) as e:
        dtypes_from_env()
    assert str(e.value) == "PREFZOO_TEST_DTYPES='float8': unknown dtype 'float8'; use float64, float32, bfloat16"


def test_conformance_tests_has_one_test_per_property_and_the_reference():
    from prefzoo.testing.conformance import ALL_PROPERTIES, conformance_tests

    test = conformance_tests("sft")
    (mark,) = [m for m in test.pytestmark if m.name == "parametrize"]
    assert mark.args == ("property_name", [p.name for p in ALL_PROPERTIES] + ["reference"])



def test_a_passing_run_with_rejected_examples_reports_no_falsifying_example():
    """A user reference may reject examples with hypothesis.assume; the rejected calls raise inside the run, yet the
    property passes and its result carries no falsifying example."""
    from hypothesis import assume

    from prefzoo.testing.reference import REFERENCES, to_float64

    fn, _ = REFERENCES["dpo"]

    def picky(b, p):
        assume(b.batch_size > 1)
        return fn(to_float64(b), p)

    (res,) = check_loss("dpo", max_examples=10, properties=["reference"], reference=picky, derandomize=True).results
    assert (res.status, res.falsifying_example) == ("passed", "")
