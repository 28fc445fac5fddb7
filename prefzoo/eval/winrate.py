"""Win-rate of a policy against a baseline on a prompt set: generate from both, judge, and a length-controlled rate.

The length-controlled win-rate follows AlpacaEval 2 (Dubois et al. 2024,
"Length-Controlled AlpacaEval", arXiv:2404.04475): fit a logistic regression of
the judge's preference on the (normalised) length difference and report the
predicted win-rate at zero length difference.  Simplified here: AlpacaEval's GLM
also has a per-instruction difficulty term and a model-identity term fitted
across many models; we fit only ``logit P(policy wins) = θ₀ + θ₁·tanh(Δlen / sd(Δlen))``
on this one comparison (ties as 0.5 soft labels, a weak L2 penalty so that
all-win or all-loss data stay finite), and report ``σ(θ₀)``.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

__all__ = ["WinRateResult", "judge_completions", "length_controlled_win_rate", "win_rate"]

log = logging.getLogger(__name__)


@dataclass
class WinRateResult:
    """Per-prompt preferences (1: policy better, 0.5 tie, 0: baseline better) and the completions behind them."""

    prompts: list[str]
    policy_completions: list[str]
    baseline_completions: list[str]
    preferences: list[float]
    policy_lengths: list[int]  # completion tokens
    baseline_lengths: list[int]
    prompts_truncated: int = 0  # prompts cut (keeping their end) to fit the context beside max_new_tokens
    skipped: int = 0  # prompts left out: the judge did not answer within its timeout

    def summary(self) -> dict[str, float]:
        n = len(self.preferences)
        if n == 0:
            nan = float("nan")
            return {"win_rate": nan, "wins": 0, "ties": 0, "losses": 0, "n": 0, "lc_win_rate": nan,
                    "mean_policy_length": nan, "mean_baseline_length": nan, "prompts_truncated": self.prompts_truncated,
                    "skipped": self.skipped}  # fmt: skip
        wins = sum(p > 0.5 for p in self.preferences)
        losses = sum(p < 0.5 for p in self.preferences)
        return {
            "win_rate": sum(self.preferences) / n,  # (wins + ½ ties) / n, as AlpacaEval counts ties
            "wins": wins,
            "ties": n - wins - losses,
            "losses": losses,
            "n": n,
            "lc_win_rate": length_controlled_win_rate(self.preferences, self.policy_lengths, self.baseline_lengths),
            "mean_policy_length": sum(self.policy_lengths) / n,
            "mean_baseline_length": sum(self.baseline_lengths) / n,
            "prompts_truncated": self.prompts_truncated,
            "skipped": self.skipped,
        }


def length_controlled_win_rate(
    preferences: Sequence[float], policy_lengths: Sequence[int], baseline_lengths: Sequence[int], l2: float = 1e-4
) -> float:
    """σ(θ₀) of the logistic fit ``P(win) = σ(θ₀ + θ₁·tanh(Δlen/sd))`` (Newton's method, soft labels, L2 ``l2``)."""
    import numpy as np

    y = np.asarray(preferences, dtype=np.float64)  # (n,) soft labels in [0, 1]
    if y.size == 0:
        raise ValueError("length_controlled_win_rate: no preferences")
    d = np.asarray(policy_lengths, dtype=np.float64) - np.asarray(baseline_lengths, dtype=np.float64)  # (n,)
    sd = d.std()
    x = np.tanh(d / sd) if sd > 0 else np.zeros_like(d)  # (n,) AlpacaEval's normalised length feature
    X = np.stack([np.ones_like(x), x], axis=1)  # (n, 2)
    theta = np.zeros(2)
    for _ in range(100):
        p = 1.0 / (1.0 + np.exp(-(X @ theta)))  # (n,)
        grad = X.T @ (p - y) / y.size + l2 * theta  # (2,)
        hess = (X.T * (p * (1 - p))) @ X / y.size + l2 * np.eye(2)  # (2, 2)
        step = np.linalg.solve(hess, grad)
        theta -= step
        if np.abs(step).max() < 1e-10:
            break
    return float(1.0 / (1.0 + math.exp(-theta[0])))


def win_rate(
    policy: Any,
    baseline: Any,
    tokenizer: Any,
    prompts: Sequence[str],
    judge: Any,
    *,
    max_new_tokens: int = 64,
    batch_size: int = 32,
    do_sample: bool = False,
    temperature: float = 1.0,
    seed: int = 0,
    baseline_tokenizer: Any = None,
    judge_timeout_s: float | None = None,
    judge_batch_size: int | None = None,
) -> WinRateResult:
    """Generate from ``policy`` and ``baseline`` (greedy, or seeded sampling) and let ``judge`` compare them.

    ``judge`` is a :class:`prefzoo.judge.registry.Judge` (``get_judge("oracle")``) or a
    registered judge name.  Lengths for the length control are completion tokens
    under ``tokenizer``.  Each model's prompts are cut (keeping their end) to fit its context beside
    ``max_new_tokens``; ``prompts_truncated`` counts them (the larger of the two models' counts).
    ``judge_timeout_s`` / ``judge_batch_size``: see :func:`judge_completions`.
    """
    from prefzoo.judge import generate, get_judge

    prompts = list(prompts)
    if not prompts:
        raise ValueError("win_rate: the prompt set is empty; pass at least one prompt")
    if isinstance(judge, str):
        judge = get_judge(judge)
    kw: dict[str, Any] = {"max_new_tokens": max_new_tokens, "batch_size": batch_size, "do_sample": do_sample,
          "temperature": temperature, "seed": seed}  # fmt: skip
    pol_report: dict[str, Any] = {}
    base_report: dict[str, Any] = {}
    pol = generate(policy, tokenizer, prompts, report=pol_report, **kw)
    base = generate(baseline, baseline_tokenizer or tokenizer, prompts, report=base_report, **kw)
    result = judge_completions(prompts, pol, base, judge, tokenizer,
                               lengths=(pol_report["new_tokens"], base_report["new_tokens"]),
                               timeout_s=judge_timeout_s, batch_size=judge_batch_size)  # fmt: skip
    # lengths as generated: re-tokenizing the decoded text can count differently
    result.prompts_truncated = max(pol_report["prompts_truncated"], base_report["prompts_truncated"])
    return result


def judge_completions(
    prompts: Sequence[str], policy_completions: Sequence[str], baseline_completions: Sequence[str], judge: Any,
    tokenizer: Any, lengths: tuple[Sequence[int], Sequence[int]] | None = None, *, timeout_s: float | None = None,
    batch_size: int | None = None,
) -> WinRateResult:  # fmt: skip
    """Judge completions already generated (e.g. cached baseline completions); lengths are the generated token
    counts ``lengths`` (policy, baseline) when given, else the completions re-tokenized with ``tokenizer``.

    The judge is called on ``batch_size`` prompts at a time (default: all at once).  With ``timeout_s`` each call
    runs in a daemon thread and a call that has not answered in time is abandoned: its prompts are left out and
    counted in ``result.skipped`` (a warning says so), so a hung or slow judge never stalls a run.
    """
    from prefzoo.judge import get_judge

    if isinstance(judge, str):
        judge = get_judge(judge)
    prompts, pol, base = list(prompts), list(policy_completions), list(baseline_completions)
    if not len(prompts) == len(pol) == len(base):
        raise ValueError(f"judge_completions: {len(prompts)} prompts, {len(pol)} and {len(base)} completions")
    name = getattr(judge, "name", judge)
    step = batch_size or max(len(prompts), 1)
    kept: list[int] = []
    prefs: list[float] = []
    for start in range(0, len(prompts), step):
        rows = list(range(start, min(start + step, len(prompts))))
        got = _call_judge(judge, [prompts[i] for i in rows], [pol[i] for i in rows], [base[i] for i in rows],
                          timeout_s)  # fmt: skip
        if got is None:
            log.warning("judge %r did not answer within %gs for prompts %d-%d: skipped", name, timeout_s, rows[0],
                        rows[-1])  # fmt: skip
            continue
        verdicts = [float(v) for v in got]
        if len(verdicts) != len(rows):
            raise ValueError(f"judge {name!r} returned {len(verdicts)} verdicts for {len(rows)} prompts")
        kept += rows
        prefs += verdicts
    bad = [v for v in prefs if not 0.0 <= v <= 1.0]
    if bad:
        raise ValueError(f"judge {name!r} returned {bad[0]}; verdicts must lie in [0, 1]")
    skipped = len(prompts) - len(kept)
    prompts, pol, base = [prompts[i] for i in kept], [pol[i] for i in kept], [base[i] for i in kept]

    def n_tokens(texts: list[str]) -> list[int]:
        return [len(tokenizer(t, add_special_tokens=False).input_ids) for t in texts]

    if lengths is not None:
        pol_len, base_len = [int(lengths[0][i]) for i in kept], [int(lengths[1][i]) for i in kept]
    else:
        pol_len, base_len = n_tokens(pol), n_tokens(base)
    return WinRateResult(prompts, pol, base, prefs, pol_len, base_len, skipped=skipped)


def _call_judge(judge: Any, prompts: list[str], pol: list[str], base: list[str], timeout_s: float | None) -> Any:
    """``judge(prompts, pol, base)``, or None when it has not returned within ``timeout_s`` (its errors re-raised)."""
    if timeout_s is None:
        return judge(prompts, pol, base)
    import threading

    box: dict[str, Any] = {}

    def call() -> None:
        try:
            box["out"] = judge(prompts, pol, base)
        except BaseException as e:  # re-raised in the caller's thread
            box["err"] = e

    worker = threading.Thread(target=call, name="prefzoo-judge", daemon=True)  # a hung judge cannot block exit
    worker.start()
    worker.join(timeout_s)
    if worker.is_alive():
        return None
    if "err" in box:
        raise box["err"]
    return box["out"]
