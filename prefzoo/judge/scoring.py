"""Scores for n samples of each prompt from any registered judge (the "judge" step of on-policy training).

A judge of the registry compares two completions (:mod:`prefzoo.judge.registry`).  A judge that can also score one
completion (a ``scores(prompts, completions) -> list[float]`` method, as the reward-model judge has) is asked for
those scores directly.  Any other judge is asked every pair of a prompt's samples, and sample i's score is its mean
preference against the others (a round-robin Borda score in [0, 1]: 1 = it beats every other sample).  Either way
higher is better, which is what :class:`prefzoo.GroupBatch` ``scores`` mean.

Failures never crash a run silently or loudly: when a batched call raises, each prompt is asked on its own, and a
prompt whose call raises or gives a non-finite score or a verdict outside [0, 1] becomes a counted skip (its reason
kept).  More skips than ``max_skip_fraction`` of the prompts is a one-line error naming the judge and the first reason.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from prefzoo.types import error_summary

__all__ = ["JudgeFailure", "ScoredGroups", "score_groups"]


class JudgeFailure(RuntimeError):
    """The judge failed on more prompts than allowed."""


@dataclass
class ScoredGroups:
    """``scores[i]``: one score per sample of prompt i (higher is better), or None when prompt i was skipped."""

    scores: list[list[float] | None]
    reasons: dict[int, str] = field(default_factory=dict)  # skipped prompt -> why
    judge_calls: int = 0

    @property
    def skipped(self) -> int:
        return sum(s is None for s in self.scores)

    @property
    def all_tied(self) -> int:
        """Prompts whose samples all score the same: no learning signal in them."""
        return sum(s is not None and max(s) == min(s) for s in self.scores)


def _check(values: Sequence[Any], expected: int, pairwise: bool) -> list[float]:
    out = [float(v) for v in values]
    if len(out) != expected:
        raise ValueError(f"returned {len(out)} values for {expected}")
    for v in out:
        if not math.isfinite(v):
            raise ValueError(f"returned a non-finite score {v}")
        if pairwise and not 0.0 <= v <= 1.0:
            raise ValueError(f"returned the verdict {v}, outside [0, 1]")
    return out


def _batched(judge: Any, prompts: Sequence[str], groups: Sequence[Sequence[str]]) -> list[list[float]]:
    """Scores of every prompt's samples from one judge call (raises when anything in its answer is wrong)."""
    if callable(getattr(judge, "scores", None)):
        flat_p = [p for p, g in zip(prompts, groups, strict=True) for _ in g]
        flat = _check(judge.scores(flat_p, [s for g in groups for s in g]), len(flat_p), pairwise=False)
        out, k = [], 0
        for g in groups:
            out.append(flat[k : k + len(g)])
            k += len(g)
        return out
    index = [(i, a, b) for i, g in enumerate(groups) for a, b in itertools.combinations(range(len(g)), 2)]
    if not index:
        return [[0.5] * len(g) for g in groups]
    verdicts = _check(
        judge([prompts[i] for i, _, _ in index], [groups[i][a] for i, a, _ in index],
              [groups[i][b] for i, _, b in index]),
        len(index), pairwise=True,
    )  # fmt: skip
    wins = [[0.0] * len(g) for g in groups]
    for (i, a, b), v in zip(index, verdicts, strict=True):
        wins[i][a] += v
        wins[i][b] += 1.0 - v
    return [[w / (len(g) - 1) if len(g) > 1 else 0.5 for w in row] for row, g in zip(wins, groups, strict=True)]


def score_groups(
    judge: Any, prompts: Sequence[str], groups: Sequence[Sequence[str]], *, max_skip_fraction: float = 0.5
) -> ScoredGroups:
    """Scores for ``groups[i]`` (the samples of ``prompts[i]``) from ``judge``; see the module docstring."""
    if len(prompts) != len(groups):
        raise ValueError(f"score_groups: {len(prompts)} prompts but {len(groups)} groups of samples")
    name = getattr(judge, "name", type(judge).__name__)
    try:
        return ScoredGroups(list(_batched(judge, prompts, groups)), judge_calls=1)
    except Exception:  # find the prompts that fail, one call each
        pass
    scores: list[list[float] | None] = []
    reasons: dict[int, str] = {}
    for i, (p, g) in enumerate(zip(prompts, groups, strict=True)):
        try:
            scores.append(_batched(judge, [p], [g])[0])
        except Exception as e:  # a failing judge makes the prompt a counted skip
            scores.append(None)
            reasons[i] = error_summary(e, 200)
    out = ScoredGroups(scores, reasons, judge_calls=1 + len(prompts))
    if prompts and out.skipped > max_skip_fraction * len(prompts):
        first = next(iter(reasons.values()))
        raise JudgeFailure(
            f"judge {name!r} failed on {out.skipped} of {len(prompts)} prompts (more than max_skip_fraction="
            f"{max_skip_fraction}); first failure: {first}. Fix the judge or raise --judge-max-skip"
        )
    return out
