"""The conformance kit: passes a sound loss, fails a broken one with a readable report and a falsifying example."""

from __future__ import annotations

import dataclasses
import re
import time

import pytest
import torch

import prefzoo
from prefzoo.testing import check_loss, conformance_tests
from prefzoo.types import LossOutput


def _dpo_spec(fn, **kw):
    return dataclasses.replace(prefzoo.loss_spec("dpo"), name="broken", fn=fn, plugin="tests", **kw)


def test_sound_loss_passes():
    t0 = time.perf_counter()
    report = check_loss("dpo", max_examples=10)
    elapsed = time.perf_counter() - t0
    assert report.passed, report.failures_text()
    names = [r.name for r in report.results]
    assert {"finite", "permutation", "monotone", "shift-invariant", "sharded-gather", "reference"} <= set(names)
    assert "PASSED" in report.table()
    times = [r.seconds for r in report.results]  # each property's own time: the run's elapsed time shared out
    assert all(t >= 0 for t in times) and 0 < sum(times) <= elapsed, times


def test_broken_loss_fails_with_a_readable_report():
    def sign_flipped(batch, p, ctx):  # rewards the rejected response: not monotone
        out = prefzoo.loss_spec("dpo").fn(batch, p, ctx)
        return LossOutput(-out.losses, out.chosen_rewards, out.rejected_rewards)

    report = check_loss(_dpo_spec(sign_flipped), max_examples=20, properties=["monotone", "finite"])
    assert not report.passed
    (mono,) = [r for r in report.results if r.name == "monotone"]
    assert mono.status == "failed" and "∂L/∂log π(y_w)" in mono.message
    assert "policy_chosen_logps=" in mono.falsifying_example and "params=" in mono.falsifying_example
    text = report.table() + report.failures_text()
    assert "FAILED" in text and "monotone" in text


def test_loss_that_raises_is_reported_as_error():
    def raises(batch, p, ctx):
        raise RuntimeError("boom")

    report = check_loss(_dpo_spec(raises), max_examples=5, properties=["shape"])
    assert report.results[0].status == "error" and "boom" in report.results[0].message


def _dpo(batch, p, ctx):
    return prefzoo.loss_spec("dpo").fn(batch, p, ctx)


def _with(out: LossOutput, losses=None, chosen=None) -> LossOutput:
    return LossOutput(
        out.losses if losses is None else losses, out.chosen_rewards if chosen is None else chosen, out.rejected_rewards
    )


def _logratio_w(batch):
    return batch.policy_chosen_logps - batch.ref_chosen_logps.detach()


def shape_broken(batch, p, ctx):
    """chosen_rewards as int64 (truncated scores): the right shape, not a float."""
    out = _dpo(batch, p, ctx)
    return _with(out, chosen=out.chosen_rewards.trunc().long())


def detached_broken(batch, p, ctx):
    """chosen_rewards still attached to the graph."""
    out = _dpo(batch, p, ctx)
    return _with(out, chosen=_logratio_w(batch) * p.beta)


def permutation_broken(batch, p, ctx):
    """Adds a term from the FIRST pair of the gathered batch (declared batch-coupled, gathered, shift-invariant)."""
    out = _dpo(batch, p, ctx)
    first = ctx.gather(_logratio_w(batch).detach() - (batch.policy_rejected_logps - batch.ref_rejected_logps).detach())
    return _with(out, losses=out.losses + 0.1 * torch.tanh(first[0]))


def low_precision_broken(batch, p, ctx):
    """(L + 1e4) − 1e4: exact enough in float64, loses ~1e-3 absolute in float32."""
    out = _dpo(batch, p, ctx)
    return _with(out, losses=(out.losses + 1e4) - 1e4)


def reference_free_broken(batch, p, ctx):
    """simpo, but it reads the reference log-probs when they are given."""
    out = prefzoo.loss_spec("simpo").fn(batch, p, ctx)
    if batch.ref_chosen_logps is not None:
        return _with(out, losses=out.losses + 1e-3 * torch.tanh(batch.ref_chosen_logps - batch.ref_rejected_logps))
    return out


def monotone_broken(batch, p, ctx):
    """+0.01·(log π(y_w) − log π_ref(y_w))²: ∂L/∂log π(y_w) > 0 once the chosen log-ratio is large."""
    out = _dpo(batch, p, ctx)
    return _with(out, losses=out.losses + 0.01 * _logratio_w(batch) ** 2)


def shift_broken(batch, p, ctx):
    """−1e-3·log π(y_w): still monotone, but depends on the log-prob itself, not the ratio."""
    out = _dpo(batch, p, ctx)
    return _with(out, losses=out.losses - 1e-3 * batch.policy_chosen_logps)


def gather_broken(batch, p, ctx):
    """Declared batch-coupled, uses the batch mean of the chosen log-ratio without the gather hook."""
    out = _dpo(batch, p, ctx)
    return _with(out, losses=out.losses + 0.01 * torch.tanh(_logratio_w(batch).detach().mean()))


def decoupled_broken(batch, p, ctx):
    """Uses the gathered mean (correct under sharding) but declares batch_coupled=False."""
    out = _dpo(batch, p, ctx)
    return _with(out, losses=out.losses + 0.01 * torch.tanh(ctx.gather(_logratio_w(batch).detach()).mean()))


def finite_broken(batch, p, ctx):
    """+0·sqrt(|(1 + 1e-10·(log π(y_w) − 1)) − 1|): value unchanged; in float32 the root's argument rounds to 0 and
    the gradient is 0·∞ = NaN (float64 keeps it finite)."""
    out = _dpo(batch, p, ctx)
    x = ((1 + 1e-10 * (batch.policy_chosen_logps - 1)) - 1).abs()
    return _with(out, losses=out.losses + 0 * torch.sqrt(x))


# property -> (broken loss, the spec it copies, spec changes): each is caught by its property and by no other
BROKEN = {
    "finite": (finite_broken, "dpo", {}),
    "shape": (shape_broken, "dpo", {}),
    "detached-rewards": (detached_broken, "dpo", {}),
    "permutation": (permutation_broken, "dpo", {"batch_coupled": True}),
    "low-precision": (low_precision_broken, "dpo", {}),
    "reference-free": (reference_free_broken, "simpo", {}),
    "monotone": (monotone_broken, "dpo", {}),
    "shift-invariant": (shift_broken, "dpo", {}),
    "sharded-gather": (gather_broken, "dpo", {"batch_coupled": True}),
    "batch-decoupled": (decoupled_broken, "dpo", {}),
}


# property -> the start of its failure message on that broken loss: the kit names the loss, what broke and where
MESSAGE = {
    "finite": r"^broken-finite: ∂ΣL/∂policy_chosen_logps\[\d+\] = nan is not finite at example \d+ \(policy_",
    "shape": r"^broken-shape: chosen_rewards has shape \(\d+,\) and dtype torch.int64; expected \(\d+,\) float",
    "detached-rewards": r"^broken-detached-rewards: chosen_rewards requires grad; return it .detach\(\)ed",
    "permutation": r"^broken-permutation: losses after permutation \[[\d, ]+\] at example \d+ \(.*\): got ",
    "low-precision": r"^broken-low-precision: torch.float32 loss vs float64 on the same inputs at example \d+ \(",
    "reference-free": r"^broken-reference-free: losses changed when reference log-probs were supplied at example",
    "monotone": r"^broken-monotone: ∂L/∂log π\(y_w\) = \S+ > 0 at example \d+ \(.*\) with FDPOParams\(beta=",
    "shift-invariant": r"^broken-shift-invariant: loss changed when c was added to policy and reference log-probs",
    "sharded-gather": r"^broken-sharded-gather: per-example loss sharded as \[[\d, ]+\] with the gather hook at",
    "batch-decoupled": r"^broken-batch-decoupled: per-example loss in micro-batches \[[\d, ]+\] differs from the full",
}


def test_every_generic_property_has_a_broken_loss():
    from prefzoo.testing import GENERIC_PROPERTIES

    assert sorted(BROKEN) == sorted(p.name for p in GENERIC_PROPERTIES)


@pytest.mark.parametrize("prop", sorted(BROKEN))
def test_each_property_alone_catches_its_broken_loss(prop):
    fn, base, changes = BROKEN[prop]
    spec = dataclasses.replace(prefzoo.loss_spec(base), name=f"broken-{prop}", fn=fn, plugin="tests", **changes)
    report = check_loss(spec, max_examples=25, max_batch=8, dtypes=["float64", "float32"], derandomize=True)
    statuses = {r.name: r.status for r in report.results}
    assert statuses[prop] == "failed", report.table() + report.failures_text()
    others = {k: v for k, v in statuses.items() if k not in (prop, "reference")}
    assert set(others.values()) <= {"passed", "n/a"}, report.table() + report.failures_text()
    res = next(r for r in report.results if r.name == prop)
    assert res.falsifying_example and re.search(MESSAGE[prop], res.message), res.message


def test_shape_reports_a_wrong_shape_as_failed():
    def two_per_pair(batch, p, ctx):
        out = _dpo(batch, p, ctx)
        return _with(out, losses=torch.cat((out.losses, out.losses)))

    report = check_loss(_dpo_spec(two_per_pair), max_examples=5, properties=["shape"])
    (res,) = report.results
    assert res.status == "failed" and "expected (" in res.message, res


def test_bound_loss_keeps_its_params():
    """A bound Loss is checked with ITS params: a loss broken only at label_smoothing = 0.2 fails bound to 0.2 and
    passes bound to the default; the report's falsifying example shows the bound params."""

    def broken_at_02(batch, p, ctx):
        out = prefzoo.loss_spec("cdpo").fn(batch, p, ctx)
        return _with(out, losses=out.losses * (float("nan") if p.label_smoothing == 0.2 else 1.0))

    spec = dataclasses.replace(prefzoo.loss_spec("cdpo"), name="broken-cdpo", fn=broken_at_02, plugin="tests")
    bad = check_loss(prefzoo.Loss(spec, spec.params(label_smoothing=0.2)), max_examples=5, properties=["finite"])
    assert bad.results[0].status == "failed" and "label_smoothing=0.2" in bad.results[0].falsifying_example
    good = check_loss(prefzoo.Loss(spec, spec.params()), max_examples=5, properties=["finite"])
    assert good.passed and good.loss == "broken-cdpo"


def test_a_bound_loss_gets_the_properties_its_params_declare():
    """aot declares monotone only without label smoothing: bound to 0.2 the monotone property does not apply (n/a),
    bound to the default it runs and passes."""
    smoothed = check_loss(prefzoo.get_loss("aot", label_smoothing=0.2), max_examples=5, properties=["monotone"])
    plain = check_loss(prefzoo.get_loss("aot"), max_examples=5, properties=["monotone"])
    assert [r.status for r in smoothed.results] == ["n/a"] and [r.status for r in plain.results] == ["passed"]


def test_unknown_property_is_named():
    with pytest.raises(ValueError, match="unknown property 'nope'"):
        check_loss("dpo", properties=["nope"])


def test_dtypes_env_is_validated(monkeypatch):
    from prefzoo.testing import dtypes_from_env

    monkeypatch.setenv("PREFZOO_TEST_DTYPES", "float32,bfloat16")
    assert dtypes_from_env() == ("float32", "bfloat16")
    monkeypatch.setenv("PREFZOO_TEST_DTYPES", "float8")
    with pytest.raises(ValueError, match="PREFZOO_TEST_DTYPES"):
        dtypes_from_env()


# the pytest entry point a plugin author uses: one test per property
test_sft_conformance = conformance_tests("sft", max_examples=5)


def test_grads_helper_reads_policy_gradients():
    from prefzoo.testing import cast_batch, grads

    b = cast_batch(
        prefzoo.PreferenceBatch(torch.tensor([-1.0]), torch.tensor([-2.0]), torch.tensor([-1.0]), torch.tensor([-1.0]))
    )
    _, g = grads(prefzoo.get_loss("dpo"), b)
    assert float(g["policy_chosen_logps"]) < 0 < float(g["policy_rejected_logps"])


def test_sharded_gather_checks_the_gradients_and_names_the_loss():
    """+ (r_w − stopgrad r_w)·0.01·tanh(local mean of r_w): the values are DPO's on any shards, the
    gradient depends on the shard's mean (no gather). Only the gradient comparison sees it, and its message names
    the loss and the field."""

    def grad_only(batch, p, ctx):
        out = _dpo(batch, p, ctx)
        r = _logratio_w(batch)
        return _with(out, losses=out.losses + (r - r.detach()) * 0.01 * torch.tanh(r.detach().mean()))

    report = check_loss(
        _dpo_spec(grad_only),
        max_examples=25,
        max_batch=8,
        properties=["sharded-gather"],
        dtypes=["float64"],
        derandomize=True,
    )
    (res,) = report.results
    assert res.status == "failed", report.table()
    want = r"^broken: ∂ΣL/∂policy_chosen_logps sharded as \[[\d, ]+\] at index \d+: got "
    assert re.search(want, res.message), res.message


def test_gloo_gather_without_a_process_group_is_the_identity():
    from prefzoo.testing import gloo_gather

    t = torch.tensor([1.0, -2.0, 3.0])
    assert gloo_gather(t) is t


def test_gloo_gather_in_a_process_group_returns_a_detached_copy_in_rank_order():
    """In a (one-rank, in-process) gloo group the gather runs: a detached copy, never the input itself (the ranks'
    order and uneven shards are tested on 2 and 4 processes in tests/distributed/test_gather.py)."""
    import torch.distributed as dist

    from prefzoo.testing import gloo_gather
    from tests.support import free_port

    if dist.is_initialized():
        pytest.skip("a process group is already open in this pytest process")
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{free_port()}", rank=0, world_size=1)
    try:
        t = torch.tensor([[1.0, -2.0], [3.0, 4.0], [5.0, 0.5]], requires_grad=True)
        out = gloo_gather(t.T)  # a non-contiguous view
        assert out is not t and not out.requires_grad and out.is_contiguous()
        assert torch.equal(out, t.detach().T)
        for x in (t.detach(), torch.arange(5.0)):  # (3, 2) and (5,): each shard's rows pad into the buffer
            assert torch.equal(gloo_gather(x), x)
        for x in (torch.tensor([1 / 3, -2 / 7], dtype=torch.float64), torch.tensor([2**40 + 1, -3])):
            out = gloo_gather(x)  # the buffer keeps the dtype: float64 digits and int64 values survive
            assert out.dtype == x.dtype and torch.equal(out, x)
    finally:
        dist.destroy_process_group()


def test_the_report_table_is_fixed_width_with_the_tally():
    from prefzoo.testing.conformance import ConformanceReport, PropertyResult

    report = ConformanceReport("toy", "me", [
        PropertyResult("shape", "L has shape (B,)", "passed", examples=30, seconds=1.25),
        PropertyResult("a-much-longer-name", "scores carry the gradient", "failed", examples=7, seconds=0.5),
        PropertyResult("monotone", "declared monotone", "n/a"),
    ])  # fmt: skip
    assert report.table().splitlines() == [
        "conformance of loss 'toy' (plugin me)",
        "property            status   examples    time  guarantee",
        f"{'-' * 18}  {'-' * 7}  {'-' * 8}  {'-' * 6}  {'-' * 40}",
        "shape               PASSED         30    1.2s  L has shape (B,)",
        "a-much-longer-name  FAILED          7    0.5s  scores carry the gradient",
        "monotone            N/A             0    0.0s  declared monotone",
        "FAILED: 1 passed, 1 failed, 1 not applicable",
    ]
    passing = ConformanceReport("toy", "me", [PropertyResult("shape", "L has shape (B,)", "passed", examples=3)])
    assert passing.table().splitlines()[-1] == "PASSED: 1 passed"  # no "0 failed", no "0 not applicable"
    passing.results += [PropertyResult("list-shape", "one loss per group", "n/a"),
                        PropertyResult("unpaired-shape", "one loss per completion", "n/a")]
    assert passing.table().splitlines()[-1] == "PASSED: 1 passed, 2 not applicable"
    errored = ConformanceReport("toy", "me", [PropertyResult("finite", "finite", "error")])
    assert errored.table().splitlines()[-1] == "FAILED: 0 passed, 1 failed"  # a property whose loss raised failed


def test_a_falsifying_batch_is_described_in_full_and_a_long_field_says_how_many_values_it_cut():
    """describe_batch: every tensor field with its values in full precision; a field longer than ``limit`` shows
    its first ``limit`` values and the count, a shorter one nothing more."""
    from prefzoo.testing.conformance import describe_batch

    t = lambda *v: torch.tensor(v, dtype=torch.float64)  # noqa: E731
    b = prefzoo.PreferenceBatch(t(-1.0, -0.1), t(-2.0, -3.0), None, None, torch.tensor([2, 3]), torch.tensor([4, 5]))
    text = describe_batch(b, "P", limit=2)
    assert text == ("params='P'; PreferenceBatch; B=2; dtype=torch.float64; policy_chosen_logps=[-1.0, -0.1]; "
                    "policy_rejected_logps=[-2.0, -3.0]; chosen_lengths=[2, 3]; rejected_lengths=[4, 5]")  # fmt: skip
    assert describe_batch(b, "P", limit=1).split("; ")[4] == "policy_chosen_logps=[-1.0], ... (2 values)"
