"""The default task's oracle evaluation: win-rate against the starting policy, skill scores and retention.

The task itself (model folder, pairs, held-out prompts) is :mod:`prefzoo.data.default`.
"""

from __future__ import annotations

from typing import Any

from prefzoo.data import synthetic
from prefzoo.data.default import DefaultTask
from prefzoo.eval.winrate import judge_completions
from prefzoo.judge import generate, get_judge

__all__ = ["evaluate_policy"]


def evaluate_policy(
    task: DefaultTask, model: Any, tokenizer: Any, baseline_model: Any = None, *, batch_size: int = 100
) -> dict[str, float]:
    """Oracle win-rate of ``model`` against ``baseline_model`` on ``task`` and retention of skill B.

    Decoding is greedy (deterministic) for both models, at most 6 new tokens.
    ``baseline_model=None`` means the starting policy from ``task.model_dir`` (its completions are
    computed once per task).  Returns ``win_rate`` ((wins + ½ ties) / n), ``wins``, ``ties``, ``losses``,
    ``n``, ``lc_win_rate`` (length-controlled), ``retention`` (greedy exact-match
    accuracy on reversal prompts unseen in the warm-up), ``addition_accuracy``
    and ``addition_mae`` (mean |answer − truth| over well-formed answers) of
    ``model``, ``malformed`` (share of unparseable answers), and the same three
    skill numbers for the baseline, prefixed ``baseline_``.
    """
    if baseline_model is None:  # the starting policy: greedy, so its completions are computed once per task
        key = (tuple(task.heldout_prompts), tuple(task.retention_prompts))
        if key not in task._start_cache:
            task._start_cache[key] = _completions(task, task.load_model(), tokenizer, batch_size)
        base_add, base_rev = task._start_cache[key]
    else:
        base_add, base_rev = _completions(task, baseline_model, tokenizer, batch_size)
    pol_add, pol_rev = _completions(task, model, tokenizer, batch_size)
    res = judge_completions(task.heldout_prompts, pol_add, base_add, get_judge("oracle"), tokenizer)
    out = {k: float(v) for k, v in res.summary().items()}
    out.update(_skill_scores(pol_add, task.heldout_prompts))
    out["retention"] = _retention(task, pol_rev)
    out["baseline_retention"] = _retention(task, base_rev)
    out.update({f"baseline_{k}": v for k, v in _skill_scores(base_add, task.heldout_prompts).items()})
    return out


def _completions(task: DefaultTask, model: Any, tokenizer: Any, batch_size: int) -> tuple[list[str], list[str]]:
    """Greedy completions of the held-out addition prompts (≤ 6 tokens) and the reversal prompts (≤ 7)."""
    add = generate(model, tokenizer, task.heldout_prompts, max_new_tokens=6, batch_size=batch_size)
    rev = generate(model, tokenizer, task.retention_prompts, max_new_tokens=7, batch_size=batch_size)
    return add, rev


def _retention(task: DefaultTask, completions: list[str]) -> float:
    hits = sum(c.strip() == t for c, t in zip(completions, task.retention_targets, strict=True))
    return hits / len(completions)


def _skill_scores(completions: list[str], prompts: list[str]) -> dict[str, float]:
    dists = [synthetic.distance(p, c) for p, c in zip(prompts, completions, strict=True)]
    finite = [d for d in dists if d != float("inf")]
    return {
        "addition_accuracy": sum(d == 0 for d in dists) / len(dists),
        "addition_mae": sum(finite) / len(finite) if finite else float("inf"),
        "malformed": 1.0 - len(finite) / len(dists),
    }
