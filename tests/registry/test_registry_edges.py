"""The registry's less travelled paths: membership, an entry point name seen twice, a kind declared after the plugin
manager was built, a hook that returns one spec instead of a list."""

from __future__ import annotations

import types

import pytest

import prefzoo
from prefzoo import registry
from tests.registry.test_registry import plugin_with, spec
from tests.support import FakeEP, install_entry_points


def test_membership_is_by_registered_name():
    reg = registry.build_registry(autoload=False)
    assert "dpo" in reg and "mmpo" in reg and "no-such-loss" not in reg and 3 not in reg


def test_an_entry_point_name_seen_twice_is_loaded_once(monkeypatch):
    second = FakeEP("good", "other_mod", exc=ImportError("the second 'good' must not be loaded"))
    install_entry_points(monkeypatch, [FakeEP("good", "good_mod", obj=plugin_with("good-loss")), second])
    monkeypatch.delenv(registry.DISABLE_AUTOLOAD_ENV, raising=False)
    reg = registry.build_registry()
    assert reg.specs["good-loss"].plugin == "good" and reg.failed == []


def test_a_kind_declared_after_the_host_was_built_gets_its_builtins():
    host = registry.PluginHost([registry.LOSSES], autoload=False)
    assert not set(registry.MODIFIERS.builtin_modules) <= host.builtins
    mods = host.registry(registry.MODIFIERS)
    assert {"wpo", "ld-dpo", "tr-dpo"} <= set(mods.names()) and all(mods.get(n).builtin for n in mods.names())
    assert set(registry.MODIFIERS.builtin_modules) <= host.builtins
    assert host.registry(registry.MODIFIERS) is mods  # built once


def test_a_hook_returning_one_spec_instead_of_a_list_is_reported_by_name():
    mod = types.SimpleNamespace()

    @prefzoo.hookimpl
    def prefzoo_register_losses():
        return spec("lonely")

    mod.prefzoo_register_losses = prefzoo_register_losses
    with pytest.warns(UserWarning) as w:
        reg = registry.build_registry(extra_plugins=[("single", mod)], autoload=False)
    msg = "returned LossSpec, expected a list of LossSpec"
    assert [(f.plugin, f.error) for f in reg.failed] == [("single", msg)] and "lonely" not in reg
    assert [str(x.message) for x in w] == [f"prefzoo plugin 'single': prefzoo_register_losses {msg}"]
