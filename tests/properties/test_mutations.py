"""The suite can fail: five deliberate bugs, each registered as a loss, each caught by a stated property.

The mutants live in tests/properties/mutants.py and are registered through
``build_registry(extra_plugins=...)``; the shipped loss modules are not modified.
"""

from __future__ import annotations

import pytest
import torch

import prefzoo
from prefzoo.testing import check_loss
from prefzoo.testing.properties import check_matches_reference
from prefzoo.testing.reference import REFERENCES, to_float64
from tests.properties.mutants import MUTANTS, mutant_registry


@pytest.fixture
def mutants():
    prefzoo.reset_registry(mutant_registry())
    yield
    prefzoo.reset_registry()


@pytest.mark.parametrize("name", sorted(MUTANTS))
def test_conformance_kit_catches_mutant(mutants, name):
    original, prop = MUTANTS[name]
    kw = {}
    if prop == "reference":  # a plugin author passes the paper's formula; here, that of the loss it copies
        fn, _ = REFERENCES[original]
        kw["reference"] = lambda b, p: fn(to_float64(b), p)
    report = check_loss(name, properties=[prop], max_examples=200, max_batch=8, **kw)
    assert not report.passed, report.table()
    (res,) = report.results
    assert res.status in ("failed", "error") and res.falsifying_example, res
    # and the unmutated original passes the same property
    ok = check_loss(original, properties=[prop], max_examples=50, max_batch=16, **kw)
    assert ok.passed, ok.failures_text()


@pytest.mark.slow
def test_full_kit_on_every_mutant_reports_failures(mutants):
    """Running the whole kit (no property selected) fails every mutant, through the property stated for it."""
    for name, (original, prop) in MUTANTS.items():
        fn, _ = REFERENCES[original]
        report = check_loss(name, max_examples=20, max_batch=8, reference=lambda b, p, fn=fn: fn(to_float64(b), p))
        failing = {r.name for r in report.failures()}
        assert prop in failing, f"{name}: expected {prop!r} among the failures\n{report.table()}"


def test_identity_property_catches_flipped_aux(mutants):
    """The MMPO identity (loss = −s_w) also catches the flipped auxiliary sign directly."""
    spec = prefzoo.loss_spec("mutant-flipped-aux")
    b = prefzoo.PreferenceBatch(torch.tensor([-3.0, -1.0], dtype=torch.float64),
                                torch.tensor([-2.0, -4.0], dtype=torch.float64),
                                torch.tensor([-5.0, -1.0], dtype=torch.float64),
                                torch.tensor([-3.0, -2.0], dtype=torch.float64))
    out = prefzoo.Loss(spec, spec.params())(b)
    assert not torch.allclose(out.losses, -out.chosen_rewards)
    good = prefzoo.get_loss("mmpo")(b)
    torch.testing.assert_close(good.losses, -good.chosen_rewards)


def test_reference_property_catches_missing_length_norm(mutants):
    spec = prefzoo.loss_spec("mutant-no-length-norm")
    b = prefzoo.PreferenceBatch(torch.tensor([-30.0], dtype=torch.float64), torch.tensor([-20.0], dtype=torch.float64),
                                torch.tensor([-10.0], dtype=torch.float64), torch.tensor([-12.0], dtype=torch.float64),
                                torch.tensor([10]), torch.tensor([4]))
    fn, _ = REFERENCES["mmpo-length-norm"]
    with pytest.raises(AssertionError, match=r"^mutant-no-length-norm: loss vs float64 reference formula at "):
        check_matches_reference(prefzoo.Loss(spec, spec.params()), b, lambda bb, p: fn(to_float64(bb), p))
