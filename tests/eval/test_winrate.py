"""Batched deterministic generation, the win-rate, and the length-controlled win-rate."""

from __future__ import annotations

import pytest

from prefzoo.eval.winrate import WinRateResult, length_controlled_win_rate, win_rate
from prefzoo.judge.generation import generate
from prefzoo.judge.registry import get_judge

from .conftest import make_causal_lm

PROMPTS = ["10+10=", "rev abcde=", "49+49=", "1+2=", "rev ab=", "33+12=", "20+21="]  # mixed lengths: left padding


def test_greedy_generation_is_independent_of_batching() -> None:
    model, tok = make_causal_lm(0)
    one_by_one = [generate(model, tok, [p], max_new_tokens=5)[0] for p in PROMPTS]
    assert generate(model, tok, PROMPTS, max_new_tokens=5, batch_size=3) == one_by_one
    assert tok.padding_side == "right" and not model.training  # restored


def test_seeded_sampling_is_reproducible_and_leaves_global_rng_alone() -> None:
    import torch

    model, tok = make_causal_lm(0)
    torch.manual_seed(123)
    state = torch.random.get_rng_state()
    a = generate(model, tok, PROMPTS * 3, max_new_tokens=5, do_sample=True, seed=7, batch_size=8)
    assert torch.equal(torch.random.get_rng_state(), state)
    assert generate(model, tok, PROMPTS * 3, max_new_tokens=5, do_sample=True, seed=7, batch_size=8) == a
    assert generate(model, tok, PROMPTS * 3, max_new_tokens=5, do_sample=True, seed=8, batch_size=8) != a


def test_generation_errors() -> None:
    model, tok = make_causal_lm(0)
    with pytest.raises(ValueError, match="prompts is empty"):
        generate(model, tok, [])
    with pytest.raises(ValueError, match="max_new_tokens"):
        generate(model, tok, ["1+1="], max_new_tokens=0)


def test_win_rate_against_itself_is_all_ties() -> None:
    model, tok = make_causal_lm(0)
    res = win_rate(model, model, tok, PROMPTS, "oracle", max_new_tokens=4)
    s = res.summary()
    assert s["win_rate"] == 0.5 and s["ties"] == s["n"] == len(PROMPTS) and s["lc_win_rate"] == pytest.approx(0.5)


def test_win_rate_counts_match_the_judge() -> None:
    policy, tok = make_causal_lm(0)
    baseline, _ = make_causal_lm(1)
    prompts = [f"{a}+{b}=" for a in range(10, 20) for b in (11, 27)]
    res = win_rate(policy, baseline, tok, prompts, get_judge("oracle"), max_new_tokens=4, batch_size=6)
    direct = get_judge("oracle")(prompts, res.policy_completions, res.baseline_completions)
    assert res.preferences == direct
    s = res.summary()
    assert s["wins"] + s["ties"] + s["losses"] == s["n"] == len(prompts)
    assert s["win_rate"] == pytest.approx((s["wins"] + 0.5 * s["ties"]) / s["n"])


def test_judge_returning_garbage_is_an_error() -> None:
    model, tok = make_causal_lm(0)
    with pytest.raises(ValueError, match=r"verdicts must lie in \[0, 1\]"):
        win_rate(model, model, tok, PROMPTS, lambda p, a, b: [2.0] * len(p), max_new_tokens=2)
    with pytest.raises(ValueError, match="returned 1 verdicts for 7 prompts"):
        win_rate(model, model, tok, PROMPTS, lambda p, a, b: [1.0], max_new_tokens=2)


def test_lc_equals_raw_win_rate_without_length_differences() -> None:
    prefs = [1.0] * 30 + [0.0] * 10 + [0.5] * 10  # raw win-rate 0.7
    lc = length_controlled_win_rate(prefs, [5] * 50, [5] * 50)
    assert lc == pytest.approx(0.7, abs=0.01)


def test_lc_removes_a_pure_length_preference() -> None:
    import random

    rng = random.Random(0)
    # the policy is usually longer; the judge prefers the longer answer 90% of the time and ignores everything else
    pol = [rng.randint(6, 14) for _ in range(600)]
    base = [rng.randint(3, 10) for _ in range(600)]
    prefs = [float(rng.random() < (0.9 if p > b else 0.1 if p < b else 0.5)) for p, b in zip(pol, base, strict=True)]
    raw = sum(prefs) / len(prefs)
    lc = length_controlled_win_rate(prefs, pol, base)
    assert raw > 0.7
    assert abs(lc - 0.5) < 0.08, (raw, lc)  # at zero length difference there is nothing left to prefer


def test_lc_of_all_wins_stays_near_one() -> None:
    assert length_controlled_win_rate([1.0] * 50, [3] * 25 + [9] * 25, [5] * 50) > 0.99


def test_lc_keeps_a_quality_preference_independent_of_length() -> None:
    import random

    rng = random.Random(0)
    pol = [rng.randint(3, 12) for _ in range(400)]
    base = [rng.randint(3, 12) for _ in range(400)]
    prefs = [float(rng.random() < 0.75) for _ in range(400)]  # 75% wins, whatever the lengths
    assert length_controlled_win_rate(prefs, pol, base) == pytest.approx(sum(prefs) / 400, abs=0.03)


def test_summary_keys() -> None:
    r = WinRateResult(["a", "b"], ["x", "y"], ["x", "z"], [0.5, 1.0], [1, 1], [1, 1])
    assert r.summary()["win_rate"] == 0.75 and r.summary()["wins"] == 1 and r.summary()["ties"] == 1
