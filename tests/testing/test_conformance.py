"""The conformance kit: passes a sound loss, fails a broken one with a readable report and a falsifying example."""

from __future__ import annotations

import dataclasses

import pytest
import torch

import prefzoo
from prefzoo.testing import check_loss, conformance_tests
from prefzoo.types import LossOutput


def _dpo_spec(fn, **kw):
    return dataclasses.replace(prefzoo.loss_spec("dpo"), name="broken", fn=fn, plugin="tests", **kw)


def test_sound_loss_passes():
    report = check_loss("dpo", max_examples=10)
    assert report.passed, report.failures_text()
    names = [r.name for r in report.results]
    assert {"finite", "permutation", "monotone", "shift-invariant", "sharded-gather", "reference"} <= set(names)
    assert "PASSED" in report.table()


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


def test_undeclared_coupling_is_caught():
    def coupled(batch, p, ctx):  # uses the batch mean but declares batch_coupled=False
        out = prefzoo.loss_spec("dpo").fn(batch, p, ctx)
        return LossOutput(out.losses - out.losses.mean().detach(), out.chosen_rewards, out.rejected_rewards)

    report = check_loss(_dpo_spec(coupled), max_examples=30, properties=["batch-decoupled"])
    assert not report.passed


def test_bound_loss_keeps_its_params():
    loss = prefzoo.get_loss("cdpo", label_smoothing=0.2)
    report = check_loss(loss, max_examples=5, properties=["finite"])
    assert report.passed and report.loss == "cdpo"


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

    b = cast_batch(prefzoo.PreferenceBatch(torch.tensor([-1.0]), torch.tensor([-2.0]), torch.tensor([-1.0]),
                                           torch.tensor([-1.0])))
    _, g = grads(prefzoo.get_loss("dpo"), b)
    assert float(g["policy_chosen_logps"]) < 0 < float(g["policy_rejected_logps"])
