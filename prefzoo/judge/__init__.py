"""Judges, generation engines, generation and scoring: what online training and evaluation both use.

- :mod:`~prefzoo.judge.registry`: the judge registry (:class:`JudgeSpec`, :func:`get_judge`); judges are plugins
  through the ``prefzoo_register_judges`` hook, the built-in ones (:mod:`~prefzoo.judge.builtin`) too;
- :mod:`~prefzoo.judge.generation`: batched, deterministic generation from a causal LM;
- :mod:`~prefzoo.judge.engines`: n sampled completions per prompt (transformers, or vLLM on a GPU);
- :mod:`~prefzoo.judge.scoring`: a judge's scores for n samples of each prompt.

Importing this package imports nothing: each name loads its module on first use (PEP 562).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from prefzoo._lazy import lazy_names

if TYPE_CHECKING:  # the same names for type checkers and IDEs; at run time __getattr__ loads them
    from prefzoo.judge.engines import ENGINES, GenerationEngine, Samples, SamplingParams, make_engine
    from prefzoo.judge.generation import generate, prompt_budget
    from prefzoo.judge.registry import (
        DEFAULT_JUDGE,
        JUDGES,
        Judge,
        JudgeSpec,
        UnknownJudgeError,
        get_judge,
        judge_spec,
        list_judges,
        parse_judge_params,
        reset_judge_registry,
    )
    from prefzoo.judge.scoring import JudgeFailure, ScoredGroups, score_groups

# module -> the public names it defines: the TYPE_CHECKING imports above (tests/test_package.py keeps them in step)
_MODULES: dict[str, tuple[str, ...]] = {
    "prefzoo.judge.engines": ("ENGINES", "GenerationEngine", "make_engine", "Samples", "SamplingParams"),
    "prefzoo.judge.generation": ("generate", "prompt_budget"),
    "prefzoo.judge.registry": ("DEFAULT_JUDGE", "JUDGES", "get_judge", "Judge", "judge_spec", "JudgeSpec",
                               "list_judges", "parse_judge_params", "reset_judge_registry", "UnknownJudgeError"),
    "prefzoo.judge.scoring": ("JudgeFailure", "score_groups", "ScoredGroups"),
}  # fmt: skip




__all__ = [
    "DEFAULT_JUDGE",
    "ENGINES",
    "JUDGES",
    "GenerationEngine",
    "Judge",
    "JudgeFailure",
    "JudgeSpec",
    "Samples",
    "SamplingParams",
    "ScoredGroups",
    "UnknownJudgeError",
    "generate",
    "get_judge",
    "judge_spec",
    "list_judges",
    "make_engine",
    "parse_judge_params",
    "prompt_budget",
    "reset_judge_registry",
    "score_groups",
]

_LAZY, __getattr__, __dir__ = lazy_names(globals(), _MODULES)
