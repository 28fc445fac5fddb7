"""The judge registry: JudgeSpec, get_judge(), list_judges(); judges are plugins through ``prefzoo_register_judges``.

A judge compares two completions of the same prompt.  It is a callable
``judge(prompts, completions_1, completions_2) -> list[float]`` returning, per
prompt, 1.0 when completion 1 is better, 0.0 when completion 2 is, and 0.5 for
a tie (values in between are allowed: a probability that 1 beats 2).  Built-in
judges (``oracle``, ``reward-model``) register through the same hook as
third-party ones, e.g. an LLM-as-judge plugin::

    import prefzoo
    from prefzoo.judge import JudgeSpec

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

from collections.abc import Sequence
from typing import Any

from prefzoo.judge.spec import Judge, JudgeSpec
from prefzoo.registry import Kind, Registry, build, declare_kind, registry_of, reset_registry
from prefzoo.spec import parse_assignments, read_literal

__all__ = [
    "BUILTIN_JUDGE_MODULES",
    "DEFAULT_JUDGE",
    "JUDGES",
    "Judge",
    "JudgeSpec",
    "UnknownJudgeError",
    "build_judge_registry",
    "get_judge",
    "get_judge_registry",
    "judge_spec",
    "list_judges",
    "parse_judge_params",
    "reset_judge_registry",
]

BUILTIN_JUDGE_MODULES = ("prefzoo.judge.builtin",)
DEFAULT_JUDGE = "oracle"  # the judge of --win-rate when none is named


class UnknownJudgeError(KeyError):
    """A judge name that no plugin registered."""

    def __str__(self) -> str:
        return str(self.args[0])


JUDGES: Kind[JudgeSpec] = Kind(
    noun="judge",
    hook="prefzoo_register_judges",
    spec_type=JudgeSpec,
    builtin_modules=BUILTIN_JUDGE_MODULES,
    unknown_error=UnknownJudgeError,
    listing="`prefzoo eval --judge list` lists them",
)
declare_kind(JUDGES)


def build_judge_registry(
    extra_plugins: list[tuple[str, Any]] | None = None, autoload: bool | None = None
) -> Registry[JudgeSpec]:
    """A fresh judge registry on its own plugin manager (built-ins, entry points, extras): for tests."""
    return build(JUDGES, extra_plugins, autoload)


def get_judge_registry() -> Registry[JudgeSpec]:
    """The process's judge registry (from the same plugin manager as the losses)."""
    return registry_of(JUDGES)


def reset_judge_registry(registry: Registry[JudgeSpec] | None = None) -> None:
    """Install ``registry`` as the judge registry, or (no argument) forget every registry: for tests."""
    reset_registry(registry)


def list_judges() -> list[str]:
    """The registered judge names, sorted."""
    return get_judge_registry().names()


def judge_spec(name: str) -> JudgeSpec:
    return get_judge_registry().get(name)


def parse_judge_params(pairs: Sequence[str], flag: str = "--judge-param") -> dict[str, Any]:
    """Judge options from ``KEY=VALUE`` strings: JSON literals (``3``, ``true``, ``[" A", " B"]``) or plain strings."""
    return {k: read_literal(v) for k, v in parse_assignments(pairs, flag, example="model_path=./rm").items()}


def get_judge(name: str, **kwargs: Any) -> Judge:
    """A registered judge built with ``kwargs`` (e.g. ``get_judge("reward-model", model_path="./rm")``)."""
    spec = judge_spec(name)
    try:
        return spec.factory(**kwargs)
    except TypeError as e:
        known = ", ".join(spec.options) or "none"
        raise ValueError(f"judge {name!r}: bad options {sorted(kwargs)} ({e}); options it takes: {known}") from None
