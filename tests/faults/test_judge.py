"""A judge that hangs or is slow: each call has a timeout, its prompts are skipped and counted, the run goes on."""

from __future__ import annotations

import threading
import time

from prefzoo.eval.winrate import judge_completions
from tests.train.helpers import base_config, run_inprocess


class _CharTok:
    def __call__(self, text, add_special_tokens=False):
        return type("Enc", (), {"input_ids": list(text)})()


class StuckJudge:
    """Prefers the longer completion; a call with a prompt 'hang' waits until released, one with 'slow' sleeps."""

    name = "stuck"

    def __init__(self) -> None:
        self.release = threading.Event()
        self.calls = 0

    def __call__(self, prompts, a, b):
        self.calls += 1
        if any("hang" in p for p in prompts):
            self.release.wait()
        if any("slow" in p for p in prompts):
            time.sleep(2.0)
        return [1.0 if len(x) > len(y) else 0.0 for x, y in zip(a, b, strict=True)]


def test_a_hung_and_a_slow_judge_call_are_skipped_and_counted():
    judge = StuckJudge()
    prompts = ["p0", "p1", "hang", "p3", "slow", "p5"]
    threading.Timer(5.0, judge.release.set).start()  # a code without timeouts still ends (and fails below)
    res = judge_completions(prompts, ["aa"] * 6, ["a"] * 6, judge, _CharTok(), timeout_s=0.3, batch_size=2)
    judge.release.set()
    assert res.skipped == 4 and res.prompts == ["p0", "p1"]
    assert res.summary()["n"] == 2 and res.summary()["skipped"] == 4 and res.summary()["win_rate"] == 1.0
    assert judge.calls == 3


def test_without_a_timeout_a_judge_answers_as_before():
    res = judge_completions(["p0", "p1"], ["aa", "a"], ["a", "aa"], StuckJudge(), _CharTok())
    assert res.skipped == 0 and res.preferences == [1.0, 0.0]


def test_the_win_rate_callback_counts_a_hung_judge_and_the_run_finishes(tmp_path, tiny_dir, pairs_file, capsys):
    from prefzoo.eval.callbacks import WinRateCallback

    cb = WinRateCallback(["ab", "hang", "cd", "ef"], judge="oracle", max_new_tokens=2, judge_timeout_s=0.3,
                         judge_batch_size=2)  # fmt: skip
    cb.judge = judge = StuckJudge()  # the registered judge replaced by a stuck one (test-only)
    try:
        res = run_inprocess(base_config(tiny_dir, pairs_file, tmp_path / "run", max_steps=None, epochs=1), [cb])
    finally:
        judge.release.set()
    assert res.final_dir is not None and res.global_step == 16
    record = cb.history[-1]
    assert record["winrate/skipped"] == 2 and record["winrate/n"] == 2, record
    assert "2 skipped: the judge did not answer within 0.3s per call" in capsys.readouterr().out
