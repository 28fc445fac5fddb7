"""The judge registry: JudgeSpec, get_judge(), list_judges(); judges are plugins through ``prefzoo_register_judges``.

A judge compares two completions of the same prompt.  It is a callable
``judge(prompts, completions_1, completions_2) -> list[float]`` returning, per
prompt, 1.0 when completion 1 is better, 0.0 when completion 2 is, and 0.5 for
a tie (values in between are allowed: a probability that 1 beats 2).  Built-in
judges (``oracle``, ``reward-model``) register through the same hook as
third-party ones, e.g. an LLM-as-judge plugin::

    import prefzoo
    from prefzoo.eval import JudgeSpec

    class MyLLMJudge:
        name = "my-llm"
        def __init__(self, model_path: str): ...
        def __call__(self, prompts, completions_1, completions_2): ...  # -> list[float]

    @prefzoo.hookimpl
    def prefzoo_register_judges():
        return [JudgeSpec(name="my-llm", factory=MyLLMJudge, description="...")]

and ``[project.entry-points.prefzoo] my_judges = "my_package.judges"``.
"""

from __future__ import annotations

import difflib
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

import pluggy

from prefzoo.registry import PluginLoadError, collect_specs, plugin_manager

__all__ = [
    "BUILTIN_JUDGE_MODULES",
    "Judge",
    "JudgeRegistry",
    "JudgeSpec",
    "UnknownJudgeError",
    "build_judge_registry",
    "get_judge",
    "judge_spec",
    "list_judges",
    "reset_judge_registry",
]

BUILTIN_JUDGE_MODULES = ("prefzoo.eval.builtin_judges",)


@runtime_checkable
class Judge(Protocol):
    """``judge(prompts, completions_1, completions_2) -> list[float]`` (1.0: first better, 0.5 tie, 0.0: second)."""

    def __call__(
        self, prompts: Sequence[str], completions_1: Sequence[str], completions_2: Sequence[str]
    ) -> list[float]: ...


@dataclass(frozen=True)
class JudgeSpec:
    """A registered judge: ``factory(**kwargs)`` returns a :class:`Judge`."""

    name: str
    factory: Callable[..., Judge]  # keyword arguments come from get_judge(name, **kw) / --judge-arg k=v
    description: str = ""
    options: dict[str, str] = field(default_factory=dict)  # keyword -> one-line doc, for --help and docs
    plugin: str = ""  # filled in by the registry


class UnknownJudgeError(KeyError):
    """A judge name that no plugin registered."""

    def __str__(self) -> str:
        return str(self.args[0])


@dataclass
class JudgeRegistry:
    pm: pluggy.PluginManager
    judges: dict[str, JudgeSpec] = field(default_factory=dict)
    failed: list[PluginLoadError] = field(default_factory=list)

    def names(self) -> list[str]:
        return sorted(self.judges)


def build_judge_registry(
    extra_plugins: list[tuple[str, Any]] | None = None, autoload: bool | None = None
) -> JudgeRegistry:
    """A fresh plugin manager (same hookspecs and entry-point group as the loss registry) holding the judges."""
    failed: list[PluginLoadError] = []
    pm = plugin_manager(BUILTIN_JUDGE_MODULES, extra_plugins, autoload, failed)
    judges = collect_specs(pm, "prefzoo_register_judges", JudgeSpec, "judge", failed)
    return JudgeRegistry(pm=pm, judges=judges, failed=failed)


_lock = threading.Lock()
_registry: JudgeRegistry | None = None


def get_judge_registry() -> JudgeRegistry:
    global _registry
    with _lock:
        if _registry is None:
            _registry = build_judge_registry()
        return _registry


def reset_judge_registry(registry: JudgeRegistry | None = None) -> None:
    """Forget the cached judge registry (or install ``registry``): for tests and plugin authors."""
    global _registry
    with _lock:
        _registry = registry


def list_judges() -> list[str]:
    """The registered judge names, sorted."""
    return get_judge_registry().names()


def judge_spec(name: str) -> JudgeSpec:
    reg = get_judge_registry()
    try:
        return reg.judges[name]
    except KeyError:
        close = difflib.get_close_matches(name, reg.names(), n=4, cutoff=0.5)
        hint = f"; did you mean {', '.join(repr(c) for c in close)}?" if close else ""
        raise UnknownJudgeError(f"unknown judge {name!r}{hint} (registered: {', '.join(reg.names())})") from None


def get_judge(name: str, **kwargs: Any) -> Judge:
    """A registered judge built with ``kwargs`` (e.g. ``get_judge("reward-model", model_path="./rm")``)."""
    spec = judge_spec(name)
    try:
        return spec.factory(**kwargs)
    except TypeError as e:
        known = ", ".join(spec.options) or "none"
        raise ValueError(f"judge {name!r}: bad options {sorted(kwargs)} ({e}); options it takes: {known}") from None
