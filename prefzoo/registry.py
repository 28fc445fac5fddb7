"""The plugin manager and the loss registry: get_loss(), list_losses(), loss_spec()."""

from __future__ import annotations

import difflib
import importlib
import importlib.metadata
import os
import threading
import warnings
from dataclasses import dataclass, field, replace
from typing import Any

import pluggy

from prefzoo import hookspecs
from prefzoo.spec import Loss, LossParamError, LossSpec

__all__ = [
    "BUILTIN_MODULES",
    "DISABLE_AUTOLOAD_ENV",
    "PluginLoadError",
    "Registry",
    "RegistryError",
    "UnknownLossError",
    "get_loss",
    "get_registry",
    "list_losses",
    "loss_spec",
    "reset_registry",
]

DISABLE_AUTOLOAD_ENV = "PREFZOO_DISABLE_PLUGIN_AUTOLOAD"
ENTRY_POINT_GROUP = "prefzoo"
BUILTIN_MODULES = (
    "prefzoo.losses.mmpo",
    "prefzoo.losses.dpo",
    "prefzoo.losses.simpo",
    "prefzoo.losses.orpo",
    "prefzoo.losses.combine",
)


class RegistryError(RuntimeError):
    """Two plugins claim one loss name, or a plugin registered something malformed."""


class UnknownLossError(KeyError):
    """A loss name that no plugin registered."""

    def __str__(self) -> str:  # KeyError would quote the message
        return str(self.args[0])


@dataclass(frozen=True)
class PluginLoadError:
    """A plugin that could not be loaded: reported by name, the rest keeps working."""

    plugin: str
    error: str


@dataclass
class Registry:
    pm: pluggy.PluginManager
    losses: dict[str, LossSpec] = field(default_factory=dict)
    failed: list[PluginLoadError] = field(default_factory=list)

    def names(self) -> list[str]:
        return sorted(self.losses)


def _plugin_name(pm: pluggy.PluginManager, impl: Any) -> str:
    return pm.get_name(impl.plugin) or repr(impl.plugin)


def _load_entry_points(pm: pluggy.PluginManager, failed: list[PluginLoadError]) -> None:
    for ep in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP):
        if pm.get_plugin(ep.name) is not None or pm.is_blocked(ep.name):
            continue
        try:
            plugin = ep.load()
            pm.register(plugin, name=ep.name)
        except Exception as e:  # a broken plugin must not take the CLI down
            failed.append(PluginLoadError(ep.name, f"{type(e).__name__}: {e}"))
            warnings.warn(f"prefzoo plugin {ep.name!r} ({ep.value}) failed to load: {e}", stacklevel=2)


def plugin_manager(
    builtin_modules: tuple[str, ...],
    extra_plugins: list[tuple[str, Any]] | None,
    autoload: bool | None,
    failed: list[PluginLoadError],
) -> pluggy.PluginManager:
    """A fresh plugin manager: hookspecs, built-in modules, entry points (unless disabled), extras; checked."""
    pm = pluggy.PluginManager("prefzoo")
    pm.add_hookspecs(hookspecs)
    for mod in builtin_modules:
        pm.register(importlib.import_module(mod), name=mod)
    if autoload is None:
        autoload = not os.environ.get(DISABLE_AUTOLOAD_ENV)
    if autoload:
        _load_entry_points(pm, failed)
    for name, plugin in extra_plugins or []:
        pm.register(plugin, name=name)
    pm.check_pending()
    return pm


def collect_specs(
    pm: pluggy.PluginManager, hook: str, spec_type: type[Any], kind: str, failed: list[PluginLoadError]
) -> dict[str, Any]:
    """name -> spec from every implementation of ``hook``, each stamped with its plugin's name.

    A hook that raises, returns something other than a list, or lists something other than ``spec_type`` is
    reported by plugin name and skipped; two plugins claiming one name is a RegistryError naming both.
    """
    out: dict[str, Any] = {}
    for impl in getattr(pm.hook, hook).get_hookimpls():
        pname = _plugin_name(pm, impl)
        try:
            specs: Any = impl.function()
        except Exception as e:
            failed.append(PluginLoadError(pname, f"{hook} raised {type(e).__name__}: {e}"))
            warnings.warn(f"prefzoo plugin {pname!r}: {hook} raised {e}", stacklevel=3)
            continue
        if specs is not None and not isinstance(specs, list | tuple):  # e.g. one spec instead of a list
            failed.append(
                PluginLoadError(pname, f"returned {type(specs).__name__}, expected a list of {spec_type.__name__}")
            )
            warnings.warn(
                f"prefzoo plugin {pname!r}: {hook} returned {type(specs).__name__}, expected a list of "
                f"{spec_type.__name__}",
                stacklevel=3,
            )
            continue
        for spec in specs or []:
            if not isinstance(spec, spec_type):
                failed.append(PluginLoadError(pname, f"registered {spec!r}, which is not a {spec_type.__name__}"))
                warnings.warn(f"prefzoo plugin {pname!r} registered a malformed {kind} spec: {spec!r}", stacklevel=3)
                continue
            if spec.name in out:
                raise RegistryError(
                    f"{kind} name {spec.name!r} is registered by two plugins: {out[spec.name].plugin!r} and "
                    f"{pname!r}; uninstall one or set {DISABLE_AUTOLOAD_ENV}=1 and register explicitly"
                )
            out[spec.name] = replace(spec, plugin=pname)
    return out


def build_registry(extra_plugins: list[tuple[str, Any]] | None = None, autoload: bool | None = None) -> Registry:
    """Build a fresh loss registry: hookspecs, built-ins, entry points, extras."""
    failed: list[PluginLoadError] = []
    pm = plugin_manager(BUILTIN_MODULES, extra_plugins, autoload, failed)
    losses = collect_specs(pm, "prefzoo_register_losses", LossSpec, "loss", failed)
    return Registry(pm=pm, losses=losses, failed=failed)


_lock = threading.Lock()
_registry: Registry | None = None


def get_registry() -> Registry:
    global _registry
    with _lock:
        if _registry is None:
            _registry = build_registry()
        return _registry


def reset_registry(registry: Registry | None = None) -> None:
    """Forget the cached registry (or install ``registry``): for tests and plugin authors."""
    global _registry
    with _lock:
        _registry = registry


def list_losses() -> list[str]:
    """The registered loss names, sorted."""
    return get_registry().names()


def loss_spec(name: str) -> LossSpec:
    """The LossSpec of a registered loss: params class, formula, paper, needs."""
    reg = get_registry()
    try:
        return reg.losses[name]
    except KeyError:
        close = difflib.get_close_matches(name, reg.names(), n=4, cutoff=0.5)
        hint = f"; did you mean {', '.join(repr(c) for c in close)}?" if close else ""
        raise UnknownLossError(
            f"unknown loss {name!r}{hint} (registered: {', '.join(reg.names())}; `prefzoo losses` lists them)"
        ) from None


def get_loss(name: str, **params: Any) -> Loss:
    """A registered loss bound to validated params, or a weighted combination.

    ``name`` is a registered name (``"mmpo"``) or a weighted sum such as
    ``"0.8*dpo + 0.2*bco-pair + 1.0*sft"``; in a sum, ``dpo.beta=...`` sets a
    parameter of one term and a bare ``beta=...`` sets it on every term that has it.
    """
    if "+" in name or "*" in name:
        from prefzoo.losses.combine import combine_from_string

        return combine_from_string(name, params)
    spec = loss_spec(name)
    return Loss(spec, spec.params(**params))


def parse_loss_params(name: str, pairs: list[str]) -> dict[str, Any]:
    """Parse CLI ``k=v`` strings into typed params for loss ``name`` (also combinations)."""
    out: dict[str, Any] = {}
    for pair in pairs:
        if "=" not in pair:
            raise LossParamError(f"--loss-param {pair!r}: expected KEY=VALUE, e.g. beta=0.1")
        key, text = pair.split("=", 1)
        key = key.strip()
        if "+" in name or "*" in name:
            from prefzoo.losses.combine import parse_terms

            terms = parse_terms(name)
            target, _, pname = key.rpartition(".")
            specs = [loss_spec(t) for _, t in terms if not target or t == target]
            holders = [s for s in specs if pname in {f for f in s.params_cls.__dataclass_fields__}]
            if not holders:
                raise LossParamError(f"no term of {name!r} has a parameter {pname!r}")
            out[key] = holders[0].parse_param(pname, text)
        else:
            out[key] = loss_spec(name).parse_param(key, text)
    return out
