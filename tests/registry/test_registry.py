"""The pluggy registry: built-ins through the same hook, entry points, duplicates, broken plugins."""

from __future__ import annotations

import types
import warnings

import pluggy
import pytest

import prefzoo
from prefzoo import registry
from prefzoo.losses.dpo import DPOParams, dpo_loss
from tests.support import FakeEP, install_entry_points

EXPECTED = {
    "mmpo",
    "mmpo-no-aux",
    "mmpo-no-norm",
    "mmpo-length-norm",
    "mmpo-entropy",
    "dpo",
    "cdpo",
    "hinge",
    "ipo",
    "robust",
    "exo-pair",
    "nca-pair",
    "bco-pair",
    "sppo-hard",
    "aot",
    "aot-unpaired",
    "apo-zero",
    "apo-down",
    "discopop",
    "sigmoid-norm",
    "sft",
    "rdpo",
    "simpo",
    "cpo",
    "orpo",
    "mpo",
}


def spec(name: str) -> prefzoo.LossSpec:
    return prefzoo.LossSpec(
        name=name,
        fn=dpo_loss,
        params_cls=DPOParams,
        family="test",
        formula="f",
        paper="p",
        scores="s",
        needs=frozenset({prefzoo.Need.REFERENCE}),
    )


def plugin_with(*names: str):
    mod = types.SimpleNamespace()

    @prefzoo.hookimpl
    def prefzoo_register_losses():
        return [spec(n) for n in names]

    mod.prefzoo_register_losses = prefzoo_register_losses
    return mod


def test_builtin_modules_register_every_documented_loss():
    reg = registry.build_registry(autoload=False)
    assert EXPECTED <= set(reg.specs)
    assert all(reg.specs[n].plugin in registry.BUILTIN_MODULES and reg.specs[n].builtin for n in EXPECTED)


def test_builtin_losses_register_through_the_public_hook():
    reg = registry.build_registry(autoload=False)
    impls = {registry._plugin_name(reg.pm, i) for i in reg.pm.hook.prefzoo_register_losses.get_hookimpls()}
    assert set(registry.BUILTIN_MODULES) <= impls


def test_a_third_party_plugin_adds_its_loss_under_its_plugin_name():
    reg = registry.build_registry(extra_plugins=[("acme", plugin_with("acme-loss"))], autoload=False)
    assert reg.specs["acme-loss"].plugin == "acme"


def test_a_duplicate_loss_name_is_an_error_naming_both_plugins():
    with pytest.raises(
        registry.RegistryError, match=r"'dpo' is registered by two plugins: 'prefzoo.losses.dpo' and 'evil'"
    ):
        registry.build_registry(extra_plugins=[("evil", plugin_with("dpo"))], autoload=False)


def test_a_plugin_raising_in_its_hook_is_reported_and_the_rest_load():
    mod = types.SimpleNamespace()

    @prefzoo.hookimpl
    def prefzoo_register_losses():
        raise RuntimeError("boom")

    mod.prefzoo_register_losses = prefzoo_register_losses
    with pytest.warns(UserWarning, match="'broken'.*boom"):
        reg = registry.build_registry(extra_plugins=[("broken", mod)], autoload=False)
    assert reg.failed[0].plugin == "broken" and "boom" in reg.failed[0].error
    assert EXPECTED <= set(reg.specs)


def test_a_plugin_returning_a_non_spec_is_reported_by_name():
    mod = types.SimpleNamespace()

    @prefzoo.hookimpl
    def prefzoo_register_losses():
        return ["not a spec"]

    mod.prefzoo_register_losses = prefzoo_register_losses
    with pytest.warns(UserWarning, match="malformed"):
        reg = registry.build_registry(extra_plugins=[("sloppy", mod)], autoload=False)
    assert reg.failed and reg.failed[0].plugin == "sloppy"


def test_a_misspelt_hook_is_rejected_as_a_pluggy_validation_error():
    mod = types.SimpleNamespace()

    @prefzoo.hookimpl
    def prefzoo_register_lossez():
        return []

    mod.prefzoo_register_lossez = prefzoo_register_lossez
    with pytest.raises(pluggy.PluginValidationError, match="unknown hook 'prefzoo_register_lossez'"):
        registry.build_registry(extra_plugins=[("typo", mod)], autoload=False)


def test_entry_points_load_and_a_failing_import_is_reported_by_name(monkeypatch):
    eps = [
        FakeEP("good", "good_mod", obj=plugin_with("good-loss")),
        FakeEP("bad", "bad_mod", exc=ImportError("No module named 'bad_mod'")),
    ]
    install_entry_points(monkeypatch, eps)
    monkeypatch.delenv(registry.DISABLE_AUTOLOAD_ENV, raising=False)
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        reg = registry.build_registry()
    assert "good-loss" in reg.specs and reg.specs["good-loss"].plugin == "good"
    assert [(f.plugin, f.error) for f in reg.failed] == [("bad", "ImportError: No module named 'bad_mod'")]
    assert any("'bad'" in str(x.message) and "bad_mod" in str(x.message) for x in w)


def test_the_env_var_disables_entry_point_autoloading(monkeypatch):
    eps = [FakeEP("good", "good_mod", obj=plugin_with("good-loss"))]
    install_entry_points(monkeypatch, eps)
    monkeypatch.setenv(registry.DISABLE_AUTOLOAD_ENV, "1")
    assert "good-loss" not in registry.build_registry().specs


def test_broken_plugin_does_not_take_the_cli_down(monkeypatch, capsys):
    from prefzoo.cli.main import main

    eps = [FakeEP("bad", "bad_mod", exc=ImportError("No module named 'bad_mod'"))]
    install_entry_points(monkeypatch, eps)
    monkeypatch.delenv(registry.DISABLE_AUTOLOAD_ENV, raising=False)
    registry.reset_registry()
    try:
        with pytest.warns(UserWarning):
            assert main(["losses"]) == 0
        out = capsys.readouterr().out
        assert "mmpo" in out and "warning: plugin 'bad' failed to load: ImportError: No module named 'bad_mod'" in out
    finally:
        registry.reset_registry()


def test_every_builtin_spec_documents_formula_paper_scores_and_params():
    for name in EXPECTED:
        s = prefzoo.loss_spec(name)
        assert s.formula and s.paper and s.scores and s.description, name
        infos = prefzoo.param_infos(s.params_cls)
        assert all(i.doc for i in infos), name
        s.params_cls()  # defaults are valid


def test_losses_and_judges_come_from_one_plugin_manager_per_process():
    from prefzoo.judge.registry import get_judge_registry

    registry.reset_registry()
    try:
        losses, judges = registry.get_registry(), get_judge_registry()
        assert losses.pm is judges.pm
        assert registry.registry_of(registry.LOSSES) is losses  # built once, then cached
        registry.reset_registry()
        assert registry.get_registry().pm is not losses.pm  # reset drops the manager and every registry with it
        assert get_judge_registry().pm is registry.get_registry().pm
    finally:
        registry.reset_registry()


def test_builtin_is_stamped_by_the_registry_not_read_from_the_module_name():
    claims = spec("acme-loss")
    object.__setattr__(claims, "builtin", True)  # a plugin cannot declare itself built in
    mod = types.SimpleNamespace(prefzoo_register_losses=prefzoo.hookimpl(lambda: [claims]))
    reg = registry.build_registry(extra_plugins=[("prefzoo.losses.acme", mod)], autoload=False)
    assert not reg.specs["acme-loss"].builtin  # named like a built-in module, still a plugin
    assert all(reg.specs[n].builtin for n in EXPECTED)
    combo = prefzoo.get_loss("dpo + sft")
    assert combo.spec.builtin


@pytest.mark.parametrize(
    ("field", "value", "match"),
    [
        ("params_cls", dict, r"^modifier 'ld-dpo': params_cls must be a LossParams dataclass$"),
        ("fn", None, r"^modifier 'ld-dpo': fn is not callable$"),
        ("applies", "every loss", r"^modifier 'ld-dpo': applies must be a prefzoo.Applicability$"),
        (
            "needs",
            frozenset({"token_logps"}),
            r"^modifier 'ld-dpo': needs must hold prefzoo.Need values, got 'token_logps'$",
        ),
        ("reference_needs", frozenset({1}), r"^modifier 'ld-dpo': needs must hold prefzoo.Need values, got 1$"),
    ],
)
def test_a_malformed_modifier_spec_is_a_type_error_naming_the_modifier_and_the_field(field, value, match):
    import dataclasses

    spec = prefzoo.modifier_spec("ld-dpo")
    with pytest.raises(TypeError, match=match):
        dataclasses.replace(spec, **{field: value})
