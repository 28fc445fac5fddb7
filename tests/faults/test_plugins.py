"""Broken plugins are named (errors or warnings), `prefzoo losses` keeps working, the conformance kit flags them."""

from __future__ import annotations

import types
import warnings

import pytest
import torch

import prefzoo
from prefzoo import registry
from prefzoo.losses.dpo import FDPOParams, dpo_loss
from prefzoo.spec import LossOutputError
from prefzoo.types import LossOutput, PreferenceBatch
from tests.support import FakeEP, install_entry_points


def _plugin(register):
    mod = types.SimpleNamespace()
    mod.prefzoo_register_losses = prefzoo.hookimpl(register)
    return mod


def _spec(name, fn=dpo_loss, **kw):
    return prefzoo.LossSpec(
        name=name,
        fn=fn,
        params_cls=kw.pop("params_cls", FDPOParams),
        family="test",
        formula="f",
        paper="p",
        scores="s",
        needs=frozenset({prefzoo.Need.REFERENCE}),
        **kw,
    )


def _wrong_shape_loss(batch, params, ctx):
    b = batch.batch_size
    return LossOutput(losses=torch.zeros(b + 1), chosen_rewards=torch.zeros(b), rejected_rewards=torch.zeros(b))


def _bad_spec_plugin():
    return [_spec("bad-spec", params_cls=dict)]  # LossSpec refuses: params_cls is not a LossParams dataclass


PLUGINS = [
    FakeEP("good", "good_mod", obj=_plugin(lambda: [_spec("good-loss")])),
    FakeEP("crashy", "crashy_mod", exc=ZeroDivisionError("division by zero at import")),
    FakeEP("malformed", "malformed_mod", obj=_plugin(_bad_spec_plugin)),
    FakeEP("not-a-list", "nal_mod", obj=_plugin(lambda: _spec("lonely-loss"))),  # a spec, not a list of specs
    FakeEP("shapes", "shapes_mod", obj=_plugin(lambda: [_spec("wrong-shape", fn=_wrong_shape_loss)])),
]


@pytest.fixture
def broken_plugins(monkeypatch):
    install_entry_points(monkeypatch, PLUGINS)
    monkeypatch.delenv(registry.DISABLE_AUTOLOAD_ENV, raising=False)
    registry.reset_registry()
    yield
    registry.reset_registry()


def test_each_broken_plugin_is_named_and_the_rest_loads(broken_plugins):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        reg = registry.build_registry()
    failed = {f.plugin: f.error for f in reg.failed}
    assert "ZeroDivisionError" in failed["crashy"]
    assert "params_cls" in failed["malformed"]
    assert "not-a-list" in failed
    messages = " | ".join(str(w.message) for w in caught)
    for name in ("crashy", "malformed", "not-a-list"):
        assert f"'{name}'" in messages, messages
    assert {"good-loss", "wrong-shape", "mmpo", "dpo"} <= set(reg.specs)


def test_prefzoo_losses_still_works_and_lists_the_failures(broken_plugins, capsys):
    from prefzoo.cli.main import main

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert main(["losses"]) == 0
    out = capsys.readouterr().out
    assert "mmpo" in out and "good-loss" in out
    assert "plugin 'crashy' failed to load" in out


def _batch(b=3):
    g = torch.Generator().manual_seed(0)
    return PreferenceBatch(
        policy_chosen_logps=-torch.rand(b, generator=g) - 1,
        policy_rejected_logps=-torch.rand(b, generator=g) - 1,
        ref_chosen_logps=-torch.rand(b, generator=g) - 1,
        ref_rejected_logps=-torch.rand(b, generator=g) - 1,
    )


def test_wrong_shapes_are_an_error_naming_the_plugin(broken_plugins):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        loss = prefzoo.get_loss("wrong-shape")
    with pytest.raises(LossOutputError, match=r"'wrong-shape'.*'shapes'.*losses of shape \(4,\); expected \(3,\)"):
        loss(_batch())


def test_conformance_kit_and_prefzoo_check_flag_the_wrong_shape_loss(broken_plugins, capsys):
    from prefzoo.cli.main import main
    from prefzoo.testing import check_loss

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        report = check_loss("wrong-shape", max_examples=5, dtypes=["float64"])
        assert not report.passed and report.failures()
        assert "shape" in report.failures()[0].message
        good = check_loss("good-loss", max_examples=5, dtypes=["float64"])
        rc = main(["check", "wrong-shape", "--max-examples", "5", "--dtypes", "float64"])
    assert good.passed, good.failures_text()
    assert rc != 0
    assert "wrong-shape" in capsys.readouterr().out
