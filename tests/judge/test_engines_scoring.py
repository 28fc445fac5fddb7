"""Sampling n completions per prompt (HFEngine) and scoring them with any judge (score_groups)."""

from __future__ import annotations

import math
from typing import Any

import pytest

from prefzoo.judge.engines import HFEngine, SamplingParams, VLLMEngine, make_engine
from prefzoo.judge.scoring import JudgeFailure, score_groups
from tests.eval.conftest import make_causal_lm

PROMPTS = ["12+34=", "5+6=", "70+8="]


def test_hf_engine_is_deterministic_and_shaped() -> None:
    model, tok = make_causal_lm(0)
    eng = HFEngine(model, tok)
    p = SamplingParams(n=3, max_new_tokens=5, seed=7, batch_size=2)
    a, b = eng.sample(PROMPTS, p), eng.sample(PROMPTS, p)
    assert a.texts == b.texts and a.token_ids == b.token_ids
    assert [len(r) for r in a.texts] == [3, 3, 3]
    for texts, ids, cut in zip(a.texts, a.token_ids, a.truncated, strict=True):
        for text, t, c in zip(texts, ids, cut, strict=True):
            assert tok.decode(t, skip_special_tokens=True) == text
            assert len(t) <= 5 and c == (len(t) == 5)
    # a random policy draws different samples for different seeds and different j
    c = eng.sample(PROMPTS, SamplingParams(n=3, max_new_tokens=5, seed=8, batch_size=2))
    assert c.texts != a.texts
    assert any(len(set(row)) > 1 for row in a.texts)
    # more samples never change the first ones
    d = eng.sample(PROMPTS, SamplingParams(n=4, max_new_tokens=5, seed=7, batch_size=2))
    assert [row[:3] for row in d.texts] == a.texts
    assert a.n_tokens == sum(len(t) for row in a.token_ids for t in row) > 0


def test_sampling_params_errors_name_the_flag() -> None:
    with pytest.raises(ValueError, match="--samples-per-prompt"):
        SamplingParams(n=0)
    with pytest.raises(ValueError, match="--top-p"):
        SamplingParams(top_p=0.0)
    with pytest.raises(ValueError, match="--temperature"):
        SamplingParams(temperature=float("nan"))
    with pytest.raises(ValueError, match="unknown generation engine"):
        make_engine("tgi", None, None)


def test_vllm_engine_refused_without_gpu_or_vllm() -> None:
    import importlib.util

    import torch

    if torch.cuda.is_available() and importlib.util.find_spec("vllm") is not None:
        pytest.skip("vLLM and a GPU are here: the refusal cannot be observed (tests/gpu runs the engine)")
    with pytest.raises(RuntimeError, match="--engine"):
        VLLMEngine(None, None)


class Pairwise:
    """Judge by the answer's closeness to 10 (1.0: first better), counting calls."""

    name = "pairwise-test"

    def __init__(self, fail_on: str = "", nan_on: str = "") -> None:
        self.calls, self.fail_on, self.nan_on = 0, fail_on, nan_on

    def __call__(self, prompts: list[str], c1: list[str], c2: list[str]) -> list[float]:
        self.calls += 1
        if self.fail_on and self.fail_on in prompts:
            raise ConnectionError("judge server went away\nmore lines")
        out = []
        for p, a, b in zip(prompts, c1, c2, strict=True):
            if p == self.nan_on:
                out.append(float("nan"))
                continue
            da, db = abs(int(a) - 10), abs(int(b) - 10)
            out.append(0.5 if da == db else float(da < db))
        return out


class Pointwise:
    name = "pointwise-test"

    def __call__(self, prompts: Any, c1: Any, c2: Any) -> list[float]:  # never used when scores exists
        raise AssertionError("score_groups must use scores()")

    def scores(self, prompts: list[str], completions: list[str]) -> list[float]:
        return [-abs(int(c) - 10) + len(p) for p, c in zip(prompts, completions, strict=True)]


def test_round_robin_borda_scores_by_hand() -> None:
    j = Pairwise()
    got = score_groups(j, ["a", "b"], [["10", "12", "9", "30"], ["1", "1"]])
    # "10" beats all 3; "12" beats "30" and ties nothing else: 1/3; "9" beats "12","30": 2/3; "30": 0
    assert got.scores == [[1.0, 1 / 3, 2 / 3, 0.0], [0.5, 0.5]]
    assert got.skipped == 0 and got.all_tied == 1 and j.calls == 1


def test_pointwise_judge_is_asked_for_scores() -> None:
    got = score_groups(Pointwise(), ["x", "yy"], [["10", "13"], ["8"]])
    assert got.scores == [[1.0, -2.0], [0.0]]


def test_failing_prompts_are_counted_skips() -> None:
    j = Pairwise(fail_on="b", nan_on="c")
    got = score_groups(j, ["a", "b", "c", "d"], [["10", "11"]] * 4, max_skip_fraction=0.5)
    assert got.scores[0] == [1.0, 0.0] and got.scores[3] == [1.0, 0.0]
    assert got.scores[1] is None and got.scores[2] is None and got.skipped == 2
    assert got.reasons[1] == "ConnectionError: judge server went away"
    assert "non-finite" in got.reasons[2]
    with pytest.raises(JudgeFailure, match=r"failed on 2 of 4 prompts .*first failure: ConnectionError"):
        score_groups(j, ["a", "b", "c", "d"], [["10", "11"]] * 4, max_skip_fraction=0.25)


def test_verdict_outside_unit_interval_is_a_skip() -> None:
    class Bad(Pairwise):
        def __call__(self, prompts: list[str], c1: list[str], c2: list[str]) -> list[float]:
            return [2.0 if p == "b" else 1.0 for p in prompts]

    got = score_groups(Bad(), ["a", "b", "c"], [["1", "2"]] * 3)
    assert got.scores[1] is None and "outside [0, 1]" in got.reasons[1]
    assert all(math.isfinite(x) for s in (got.scores[0], got.scores[2]) for x in s)
