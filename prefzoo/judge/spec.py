"""What a judge is (:class:`Judge`) and what registers one (:class:`JudgeSpec`): below the judge registry, so the
built-in judges declare themselves without importing the registry that loads them."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable

__all__ = ["Judge", "JudgeSpec"]


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
    factory: Callable[..., Judge]  # keyword arguments come from get_judge(name, **kw) / --judge-param k=v
    description: str = ""
    options: dict[str, str] = field(default_factory=dict)  # keyword -> one-line doc, for --help and docs
    # it grades the embedded default task exactly, so the task's own evaluation (win-rate, retention, skill
    # scores of both models) is what `prefzoo eval` reports on the default task's held-out prompts
    grades_default_task: bool = False
    plugin: str = ""  # filled in by the registry
    builtin: bool = False  # filled in by the registry: registered by a module shipped with prefzoo
