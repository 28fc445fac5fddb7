"""The conformance kit catches a broken modifier, registered by a plugin through prefzoo_register_modifiers."""

from __future__ import annotations

import dataclasses
import types

import pytest

import prefzoo
from prefzoo.hookspecs import hookimpl
from prefzoo.modifiers import margins, wpo
from prefzoo.registry import MODIFIERS, build
from prefzoo.testing import check_loss
from prefzoo.types import LossContext, LossOutput


def flipped_wpo(inner, batch, p, spec, lp, ctx):
    """WPO with the sign of the weight flipped: minimizing it pushes the chosen response down."""
    out = wpo.wpo(inner, batch, p, spec, lp, ctx)
    return LossOutput(-out.losses, out.chosen_rewards, out.rejected_rewards, out.metrics)


def local_beta_dpo(inner, batch, p, spec, lp, ctx):
    """β-DPO that ignores the gather hook: β from this process's shard only."""
    return margins.beta_dpo(inner, batch, p, spec, lp, dataclasses.replace(ctx, gather=LossContext().gather))


def _plugin():
    (w,) = wpo.prefzoo_register_modifiers()
    beta = next(s for s in margins.prefzoo_register_modifiers() if s.name == "beta-dpo")

    @hookimpl
    def prefzoo_register_modifiers():
        return [dataclasses.replace(w, name="mutant-flipped-wpo", fn=flipped_wpo),
                dataclasses.replace(beta, name="mutant-local-beta-dpo", fn=local_beta_dpo)]  # fmt: skip

    return types.SimpleNamespace(prefzoo_register_modifiers=prefzoo_register_modifiers)


@pytest.fixture
def mutants():
    prefzoo.reset_registry(build(MODIFIERS, extra_plugins=[("mutants", _plugin())], autoload=False))
    yield
    prefzoo.reset_registry()


@pytest.mark.parametrize(("mutant", "original", "prop"), [
    ("mutant-flipped-wpo", "wpo", "monotone"),
    ("mutant-local-beta-dpo", "beta-dpo", "sharded-gather"),
])  # fmt: skip
def test_kit_catches_broken_modifier(mutants, mutant, original, prop):
    report = check_loss(prefzoo.modify("dpo", mutant).spec, properties=[prop], max_examples=100, max_batch=8)
    assert not report.passed, report.table()
    assert report.results[0].falsifying_example
    ok = check_loss(prefzoo.modify("dpo", original).spec, properties=[prop], max_examples=30, max_batch=8)
    assert ok.passed, ok.failures_text()
