"""Reading settings from YAML and flags: TRL's names resolved, values coerced to each key's type, unknown keys named."""

from __future__ import annotations

import types
import typing
from pathlib import Path
from typing import Any

from prefzoo.errors import ConfigError, install_hint

__all__ = ["coerce", "load_yaml_config", "resolve_aliases", "unknown_keys_message"]


def unknown_keys_message(unknown: list[str], known: list[str]) -> str:
    """``unknown key 'learnig_rate' (did you mean 'learning_rate'?)``: the closest of prefzoo's keys and TRL's names it
    accepts for each; without any close one, where the keys are listed (not all ~100 of them)."""
    import difflib

    from prefzoo.train.config.aliases import TRL_OPTIONS

    accepted = [*known, *(name for name, opt in TRL_OPTIONS.items() if opt.key is not None)]
    hints = []
    for k in unknown:
        close = difflib.get_close_matches(k, accepted, n=1, cutoff=0.7)
        hints.append(f"{k!r} (did you mean {close[0]!r}?)" if close else repr(k))
    plural = "s" if len(unknown) > 1 else ""
    return f"unknown key{plural} {', '.join(hints)}; `prefzoo train --help` lists every key (flags with _ for -)"


def resolve_aliases(values: dict[str, Any], where: str) -> dict[str, Any]:
    """``values`` with TRL's aliases renamed to prefzoo's keys; a ConfigError names a TRL option that means something
    else here (and what to write instead), or a key given under both names."""
    from prefzoo.train.config.aliases import TRL_OPTIONS

    out: dict[str, Any] = {}
    for name, value in values.items():
        opt = TRL_OPTIONS.get(name)
        if opt is not None and opt.key is None:
            raise ConfigError(f"{where}: {name} is TRL's option; in prefzoo: {opt.instead}")
        key = opt.key if opt is not None and opt.key is not None else name
        if key in out:
            raise ConfigError(f"{where}: {key} is given twice (under prefzoo's and TRL's name {name}); keep one")
        out[key] = value
    return out


_EXPECTED = {int: "an integer", float: "a number", bool: "true or false", tuple: "numbers separated by commas",
             dict: "a mapping of names to values"}  # fmt: skip


def coerce(key: str, value: Any, typ: Any, name: str) -> Any:
    """Coerce a YAML/flag value to the declared type; on failure a ConfigError naming the key as ``name``."""
    if value is None:
        return None
    args = [a for a in typing.get_args(typ) if a is not type(None)]
    if isinstance(value, list) and any(typing.get_origin(a) is list for a in args) and str in args:
        return value[0] if len(value) == 1 and isinstance(value[0], str) else list(value)  # one source: a string
    base = typing.get_origin(typ) or typ
    if base is typing.Union or base is types.UnionType:
        base = typing.get_origin(args[0]) or args[0]
    try:
        if base is bool and isinstance(value, str):
            if value.lower() not in ("true", "false", "1", "0", "yes", "no"):
                raise ValueError(value)
            return value.lower() in ("true", "1", "yes")
        if base in (int, float, str, bool):
            if base is int and isinstance(value, float) and not value.is_integer():
                raise ValueError(value)
            return base(value)
        if base is tuple:
            return tuple(float(v) for v in (value.split(",") if isinstance(value, str) else value))
        if base is list and key in ("callbacks", "modifiers"):  # specs may hold commas and YAML mappings: kept as is
            return [value] if isinstance(value, str | dict) else list(value)
        if base is list:
            return [str(v) for v in (value.split(",") if isinstance(value, str) else value)]
        if base is dict:
            if not isinstance(value, dict):
                raise ValueError(value)
            return dict(value)
    except (TypeError, ValueError):
        what = _EXPECTED.get(base, f"a {getattr(base, '__name__', base)}")
        raise ConfigError(f"{name} {value!r}: expected {what}") from None
    return value


def load_yaml_config(path: str | Path) -> dict[str, Any]:
    """The mapping in a YAML run file (keys are TrainConfig field names; '-' may be written for '_')."""
    p = Path(path)
    if not p.is_file():
        raise ConfigError(f"--config {path}: no such file")
    try:
        import yaml
    except ImportError:
        raise ConfigError(f"--config {path}: reading YAML needs pyyaml; {install_hint('train')}") from None
    try:
        data = yaml.safe_load(p.read_text(encoding="utf-8")) or {}
    except UnicodeDecodeError as e:
        raise ConfigError(
            f"--config {path}: not UTF-8 text (byte 0x{e.object[e.start]:02x} at offset {e.start}); save the file as "
            "UTF-8"
        ) from None
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
        problem = getattr(e, "problem", None) or str(e).splitlines()[0]
        raise ConfigError(f"--config {path}: not valid YAML{where} ({problem}); fix the file there") from None
    if not isinstance(data, dict):
        raise ConfigError(f"--config {path}: expected a mapping of keys to values, got {type(data).__name__}")
    return {str(k).replace("-", "_"): v for k, v in data.items()}
