"""Loading callbacks from specs: ``module:Class[:K=V,...]`` or a name, an entry point of group ``prefzoo.callbacks``.

Each callback is registered where it lives: prefzoo's own (``early-stopping``, ``reference-sync``, ``win-rate``)
are declared in its ``pyproject.toml`` under that group, as a third-party package declares its own, so this module
names no callback module.
"""

from __future__ import annotations

import importlib
from collections.abc import Sequence
from importlib import metadata
from typing import Any

from prefzoo.types import error_summary

__all__ = ["ENTRY_POINT_GROUP", "builtin_callbacks", "load_callback", "load_callbacks"]

ENTRY_POINT_GROUP = "prefzoo.callbacks"
_DISTRIBUTION = "prefzoo"  # the distribution whose entry points of the group are the built-ins


def _entry_points() -> dict[str, Any]:
    return {ep.name: ep for ep in metadata.entry_points(group=ENTRY_POINT_GROUP)}


def _builtin(ep: Any) -> bool:
    dist = getattr(ep, "dist", None)
    return dist is not None and str(dist.name).lower() == _DISTRIBUTION


def builtin_callbacks() -> list[str]:
    """The names of the callbacks prefzoo ships (its own entry points of the group), as installed."""
    return sorted(name for name, ep in _entry_points().items() if _builtin(ep))


def _value(text: str) -> Any:
    """A KEY=VALUE value typed as YAML types it (2 -> int, 0.5 -> float, true -> bool, else the string)."""
    import yaml

    try:
        return yaml.safe_load(text)
    except yaml.YAMLError:
        return text


def _split_spec(spec: str) -> tuple[str, dict[str, Any]]:
    """'module:Class:k=v,k2=v2' or 'name:k=v' -> (target, kwargs)."""
    parts = spec.split(":")
    keep = [p for p in parts if "=" not in p]
    kwargs: dict[str, Any] = {}
    for part in (p for p in parts if "=" in p):
        for item in filter(None, part.split(",")):
            key, sep, value = item.partition("=")
            if not sep or not key.strip():
                raise ValueError(f"bad argument {item!r}: use KEY=VALUE")
            kwargs[key.strip()] = _value(value.strip())
    return ":".join(keep), kwargs


def _resolve(target: str) -> Any:
    """The class (or factory) a 'module:Class' path or an entry-point name points to."""
    if ":" in target:
        module, _, attr = target.partition(":")
        obj: Any = importlib.import_module(module)
        for name in attr.split("."):
            obj = getattr(obj, name)
        return obj
    eps = _entry_points()
    if target in eps:
        return eps[target].load()
    stale = "" if any(map(_builtin, eps.values())) else (
        "; prefzoo's installed metadata declares none of its own callbacks: reinstall it (pip install -e .)"
    )
    raise LookupError(f"no callback named {target!r} (known: {', '.join(sorted(eps))}){stale}; or give module:Class")


def load_callback(spec: Any) -> Any:
    """A callback instance from 'module:Class[:K=V,...]', a name, a mapping {callback: SPEC, K: V}, or an instance."""
    from prefzoo._secrets import redact
    from prefzoo.train.config import ConfigError

    if not isinstance(spec, str | dict):
        return spec  # already a callback object
    if isinstance(spec, dict):
        rest = dict(spec)
        target, kwargs = rest.pop("callback", None), rest
        if not isinstance(target, str):
            raise ConfigError(f"callbacks: {redact(spec)!r} needs a 'callback: module:Class' (or name) key")
    else:
        try:
            target, kwargs = _split_spec(spec)
        except ValueError as e:
            raise ConfigError(f"--callback {redact(spec)!r}: {e}") from None
    try:
        factory = _resolve(target)
        return factory(**kwargs)
    except Exception as e:
        raise ConfigError(
            f"--callback {target!r}: cannot load it ({error_summary(e)}); give an importable module:Class, "
            f"a built-in ({', '.join(builtin_callbacks())}) or an entry point of group {ENTRY_POINT_GROUP!r}"
        ) from None


def load_callbacks(specs: Sequence[Any]) -> list[Any]:
    """Every spec of ``cfg.callbacks`` (or ``train(callbacks=...)``) loaded, in order."""
    return [load_callback(s) for s in specs]
