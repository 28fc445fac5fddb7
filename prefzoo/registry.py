"""The plugin manager and the registries built from it: get_loss(), list_losses(), loss_spec().

One :class:`pluggy.PluginManager` per process holds the built-in plugin modules and the installed
entry points (group ``prefzoo``); each kind of thing plugins register (losses here, judges in
:mod:`prefzoo.judge.registry`, anything added later) is a :class:`Kind`, and its :class:`Registry` is
collected from that one manager the first time it is asked for.
"""

from __future__ import annotations

import difflib
import importlib
import importlib.metadata
import os
import threading
import warnings
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any, Generic, Protocol, TypeVar

import pluggy

from prefzoo import hookspecs
from prefzoo.losses import combine as _combine
from prefzoo.losses.combine import CombinedLoss
from prefzoo.modifiers.compose import ModifiedLoss, parse_modifier
from prefzoo.spec import Loss, LossSpec, ModifierSpec, parse_assignments

__all__ = [
    "BUILTIN_MODULES",
    "DISABLE_AUTOLOAD_ENV",
    "LOSSES",
    "MODIFIERS",
    "Kind",
    "PluginLoadError",
    "Registry",
    "RegistryError",
    "UnknownLossError",
    "build_registry",
    "combine",
    "get_loss",
    "get_registry",
    "list_losses",
    "list_modifiers",
    "loss_spec",
    "modifier_spec",
    "modify",
    "parse_loss_params",
    "registry_of",
    "reset_registry",
]

DISABLE_AUTOLOAD_ENV = "PREFZOO_DISABLE_PLUGIN_AUTOLOAD"
ENTRY_POINT_GROUP = "prefzoo"
BUILTIN_MODULES = (
    "prefzoo.losses.mmpo",
    "prefzoo.losses.dpo",
    "prefzoo.losses.simpo",
    "prefzoo.losses.orpo",
    "prefzoo.losses.unpaired",
    "prefzoo.losses.combine",
    "prefzoo.losses.lists",
)


class RegistryError(RuntimeError):
    """Two plugins claim one name, or a plugin registered something malformed."""


class UnknownLossError(KeyError):
    """A loss name that no plugin registered."""

    def __str__(self) -> str:  # KeyError would quote the message
        return str(self.args[0])


class UnknownModifierError(UnknownLossError):
    """A modifier name that no plugin registered."""


@dataclass(frozen=True)
class PluginLoadError:
    """A plugin that could not be loaded: reported by name, the rest keeps working."""

    plugin: str
    error: str


class RegisteredSpec(Protocol):
    """What a registry needs of a spec: a name, and the two fields it stamps (``plugin``, ``builtin``)."""

    @property
    def name(self) -> str: ...
    @property
    def plugin(self) -> str: ...
    @property
    def builtin(self) -> bool: ...


S = TypeVar("S", bound=RegisteredSpec)


@dataclass(frozen=True, eq=False)
class Kind(Generic[S]):
    """One kind of registered thing: the hook that lists it, its spec class and its built-in plugin modules."""

    noun: str  # "loss", "judge": used in messages
    hook: str  # the hookspec's name, e.g. "prefzoo_register_losses"
    spec_type: type[S]
    builtin_modules: tuple[str, ...]  # modules shipped with prefzoo that implement ``hook``
    unknown_error: type[KeyError]  # raised by Registry.get for a name no plugin registered
    listing: str = ""  # where the user finds the names, appended to the unknown-name message


class Registry(Generic[S]):
    """The specs of one :class:`Kind`, by name, and the plugins that failed to load or register."""

    def __init__(
        self, kind: Kind[S], pm: pluggy.PluginManager, specs: dict[str, S], failed: list[PluginLoadError]
    ) -> None:
        self.kind = kind
        self.pm = pm
        self.specs = specs
        self.failed = failed

    def names(self) -> list[str]:
        return sorted(self.specs)

    def __contains__(self, name: object) -> bool:
        return name in self.specs

    def get(self, name: str) -> S:
        """The spec registered as ``name``; an unknown name is ``kind.unknown_error`` with close matches."""
        try:
            return self.specs[name]
        except KeyError:
            close = difflib.get_close_matches(name, self.names(), n=4, cutoff=0.5)
            hint = f"; did you mean {', '.join(repr(c) for c in close)}?" if close else ""
            listing = f"; {self.kind.listing}" if self.kind.listing else ""
            raise self.kind.unknown_error(
                f"unknown {self.kind.noun} {name!r}{hint} (registered: {', '.join(self.names())}{listing})"
            ) from None


LOSSES: Kind[LossSpec] = Kind(
    noun="loss",
    hook="prefzoo_register_losses",
    spec_type=LossSpec,
    builtin_modules=BUILTIN_MODULES,
    unknown_error=UnknownLossError,
    listing="`prefzoo losses` lists them",
)

MODIFIER_MODULES = (
    "prefzoo.modifiers.wpo",
    "prefzoo.modifiers.logps",
    "prefzoo.modifiers.margins",
    "prefzoo.modifiers.trdpo",
)
MODIFIERS: Kind[ModifierSpec] = Kind(
    noun="modifier",
    hook="prefzoo_register_modifiers",
    spec_type=ModifierSpec,
    builtin_modules=MODIFIER_MODULES,
    unknown_error=UnknownModifierError,
    listing="`prefzoo modifiers` lists them",
)

_kinds: list[Kind[Any]] = [LOSSES, MODIFIERS]  # every kind declared so far (declare_kind adds the others)


def declare_kind(kind: Kind[Any]) -> Kind[Any]:
    """Make ``kind`` known, so that the process's plugin manager registers its built-in modules up front."""
    with _lock:
        if kind not in _kinds:
            _kinds.append(kind)
    return kind


def _plugin_name(pm: pluggy.PluginManager, impl: Any) -> str:
    return pm.get_name(impl.plugin) or repr(impl.plugin)


def _load_entry_points(pm: pluggy.PluginManager, failed: list[PluginLoadError]) -> None:
    for ep in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP):
        if pm.get_plugin(ep.name) is not None or pm.is_blocked(ep.name):
            continue
        try:
            plugin = ep.load()
            pm.register(plugin, name=ep.name)
        except (Exception, SystemExit) as e:  # a broken plugin (even one calling sys.exit) must not take the CLI down
            what = f"sys.exit({e.code!r}) at import" if isinstance(e, SystemExit) else str(e)
            failed.append(PluginLoadError(ep.name, f"{type(e).__name__}: {what}"))
            warnings.warn(
                f"prefzoo plugin {ep.name!r} ({ep.value}) failed to load: {what}; going on without it", stacklevel=2
            )


def _register_builtins(pm: pluggy.PluginManager, modules: Sequence[str]) -> None:
    for mod in modules:
        if pm.get_plugin(mod) is None:
            pm.register(importlib.import_module(mod), name=mod)


class PluginHost:
    """One plugin manager and the registries collected from it, one per :class:`Kind`, built on first use."""

    def __init__(
        self,
        kinds: Sequence[Kind[Any]],
        extra_plugins: list[tuple[str, Any]] | None = None,
        autoload: bool | None = None,
    ) -> None:
        self.pm = pluggy.PluginManager("prefzoo")
        self.pm.add_hookspecs(hookspecs)
        self.builtins: set[str] = set()
        self.load_failed: list[PluginLoadError] = []
        for kind in kinds:
            self._add_builtins(kind)
        if autoload is None:
            autoload = not os.environ.get(DISABLE_AUTOLOAD_ENV)
        if autoload:
            _load_entry_points(self.pm, self.load_failed)
        for name, plugin in extra_plugins or []:
            self.pm.register(plugin, name=name)
        self.pm.check_pending()
        self.registries: dict[Kind[Any], Registry[Any]] = {}

    def _add_builtins(self, kind: Kind[Any]) -> None:
        _register_builtins(self.pm, kind.builtin_modules)
        self.builtins.update(kind.builtin_modules)

    def registry(self, kind: Kind[S]) -> Registry[S]:
        if kind not in self.registries:
            if not set(kind.builtin_modules) <= self.builtins:  # a kind declared after this host was built
                self._add_builtins(kind)
                self.pm.check_pending()
            failed = list(self.load_failed)
            specs = collect_specs(self.pm, kind, self.builtins, failed)
            self.registries[kind] = Registry(kind, self.pm, specs, failed)
        return self.registries[kind]


def collect_specs(
    pm: pluggy.PluginManager, kind: Kind[S], builtins: set[str], failed: list[PluginLoadError]
) -> dict[str, S]:
    """name -> spec from every implementation of ``kind.hook``, each stamped with its plugin and ``builtin``.

    A hook that raises, returns something other than a list, or lists something other than
    ``kind.spec_type`` is reported by plugin name and skipped; two plugins claiming one name is a
    RegistryError naming both.
    """
    out: dict[str, S] = {}
    type_name = kind.spec_type.__name__
    for impl in getattr(pm.hook, kind.hook).get_hookimpls():
        pname = _plugin_name(pm, impl)
        try:
            specs: Any = impl.function()
        except Exception as e:
            failed.append(PluginLoadError(pname, f"{kind.hook} raised {type(e).__name__}: {e}"))
            warnings.warn(f"prefzoo plugin {pname!r}: {kind.hook} raised {e}", stacklevel=3)
            continue
        if specs is not None and not isinstance(specs, list | tuple):  # e.g. one spec instead of a list
            msg = f"returned {type(specs).__name__}, expected a list of {type_name}"
            failed.append(PluginLoadError(pname, msg))
            warnings.warn(f"prefzoo plugin {pname!r}: {kind.hook} {msg}", stacklevel=3)
            continue
        for spec in specs or []:
            if not isinstance(spec, kind.spec_type):
                failed.append(PluginLoadError(pname, f"registered {spec!r}, which is not a {type_name}"))
                warnings.warn(
                    f"prefzoo plugin {pname!r} registered a malformed {kind.noun} spec: {spec!r}", stacklevel=3
                )
                continue
            if spec.name in out:
                raise RegistryError(
                    f"{kind.noun} name {spec.name!r} is registered by two plugins: {out[spec.name].plugin!r} and "
                    f"{pname!r}; uninstall one or set {DISABLE_AUTOLOAD_ENV}=1 and register explicitly"
                )
            out[spec.name] = replace(spec, plugin=pname, builtin=pname in builtins)  # type: ignore[type-var]
    return out


def build(
    kind: Kind[S], extra_plugins: list[tuple[str, Any]] | None = None, autoload: bool | None = None
) -> Registry[S]:
    """A fresh registry of ``kind`` on its own plugin manager (built-ins, entry points, extras): for tests."""
    return PluginHost([kind], extra_plugins, autoload).registry(kind)


def build_registry(
    extra_plugins: list[tuple[str, Any]] | None = None, autoload: bool | None = None
) -> Registry[LossSpec]:
    """A fresh loss registry: hookspecs, built-ins, entry points, extras."""
    return build(LOSSES, extra_plugins, autoload)


_lock = threading.RLock()
_host: PluginHost | None = None
_installed: dict[Kind[Any], Registry[Any]] = {}


def registry_of(kind: Kind[S]) -> Registry[S]:
    """The process's registry of ``kind`` (an installed one, else collected from the one plugin manager)."""
    global _host
    with _lock:
        if kind in _installed:
            return _installed[kind]
        if _host is None:
            _host = PluginHost(list(_kinds))
        return _host.registry(kind)


def get_registry() -> Registry[LossSpec]:
    """The process's loss registry."""
    return registry_of(LOSSES)


def reset_registry(registry: Registry[Any] | None = None) -> None:
    """Install ``registry`` for its kind, or (no argument) forget the plugin manager and every registry.

    For tests and plugin authors; what was built from the old registries (the MPO terms) goes with them.
    """
    global _host
    with _lock:
        if registry is None:
            _host = None
            _installed.clear()
        else:
            _installed[registry.kind] = registry


def list_losses() -> list[str]:
    """The registered loss names, sorted."""
    return get_registry().names()


def loss_spec(name: str) -> LossSpec:
    """The LossSpec of a registered loss: params class, formula, paper, needs."""
    return get_registry().get(name)


def get_loss(name: str, modifiers: Sequence[Any] = (), **params: Any) -> Loss:
    """A registered loss bound to validated params, or a weighted combination, optionally under modifiers.

    ``name`` is a registered name (``"mmpo"``) or a weighted sum such as
    ``"0.8*dpo + 0.2*bco-pair + 1.0*sft"``; in a sum, ``dpo.beta=...`` sets a
    parameter of one term and a bare ``beta=...`` sets it on every term that has it.
    ``modifiers``: e.g. ``["ld-dpo:alpha=0.5", "wpo"]`` (see :func:`modify`).
    """
    if _combine.is_combination(name):
        loss: Loss = _combine.combine_from_string(name, params, loss_spec)
    else:
        spec = loss_spec(name)
        loss = Loss(spec, spec.params(**params))
    return modify(loss, *modifiers) if modifiers else loss


def modifier_spec(name: str) -> ModifierSpec:
    """The ModifierSpec of a registered modifier."""
    return registry_of(MODIFIERS).get(name)


def list_modifiers() -> list[str]:
    """The registered modifier names, sorted."""
    return registry_of(MODIFIERS).names()


def modify(loss: Loss | str, *modifiers: Any) -> ModifiedLoss:
    """``loss`` under ``modifiers``, applied in order (the first sees the batch first): a Loss itself.

    Each modifier is ``"NAME[:KEY=VALUE,...]"``, ``{"modifier": NAME, KEY: VALUE}``, ``(NAME, {KEY: VALUE})`` or a
    bound :class:`Modifier`.  A modifier that does not apply to the loss is a ModifierError naming both and why.
    """
    base = get_loss(loss) if isinstance(loss, str) else loss
    return ModifiedLoss(base, [parse_modifier(m, modifier_spec) for m in modifiers])


def combine(terms: Sequence[tuple[float, str | Loss]], **params: Any) -> CombinedLoss:
    """Registered losses (by name) or bound Loss objects summed with weights: ``combine([(0.8, "dpo"), (0.2, "sft")])``.

    ``params`` holds ``name.key=value`` for one term or a bare ``key=value`` for every term that has it.
    """
    return _combine.combine(terms, loss_spec, **params)


def parse_loss_params(name: str, pairs: Sequence[str] | dict[str, Any], flag: str = "--loss-param") -> dict[str, Any]:
    """Typed params for loss ``name`` (also a combination) from ``KEY=VALUE`` strings or a mapping (YAML).

    Strings are converted to each parameter's type; values that are not strings (YAML numbers, booleans)
    are kept.  An unknown key or an unreadable value is a LossParamError naming the flag and the key.
    """
    values = dict(pairs) if isinstance(pairs, dict) else parse_assignments(pairs, flag, example="beta=0.1")
    if _combine.is_combination(name):
        return _combine.parse_params(name, values, loss_spec)
    spec = loss_spec(name)
    return {key: spec.parse_param(key, text) for key, text in values.items()}
