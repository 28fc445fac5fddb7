"""--skip-batches (issue 18): pass over the micro-batches at the start or resume point, as accelerate's
skip_first_batches does, in whole optimizer steps counted as skipped, and only once across later resumes."""

from __future__ import annotations

import json

from tests.faults._run import final_weights, max_diff
from tests.faults.injector import SPEC as INJECTOR
from tests.train.helpers import base_config, run_inprocess

KW = dict(loss="dpo", max_steps=6, save_steps=2, per_device_batch_size=2, grad_accum=2)


def _skip_events(out):
    lines = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    return [r for r in lines if r.get("event") == "skipped_step"]


def test_skipping_batches_at_the_start_equals_skipping_those_steps(tmp_path, tiny_dir, pairs_file, faults, capsys):
    skip = run_inprocess(base_config(tiny_dir, pairs_file, tmp_path / "skip", **KW, skip_batches=3,
                                     max_consecutive_skips=1))  # fmt: skip  # asked-for skips are not faults
    assert "--skip-batches 3: the micro-batches of steps 1..2 are passed over" in capsys.readouterr().out
    assert skip.skipped_steps == 2 and skip.global_step == 6
    events = _skip_events(tmp_path / "skip")
    assert [(e["step"], e["reason"], len(e["example_ids"])) for e in events] == [(1, "--skip-batches", 4),
                                                                                  (2, "--skip-batches", 4)]  # fmt: skip
    faults("nan_logps@1,nan_logps@2")  # the same two steps skipped by the non-finite guard
    nan = run_inprocess(base_config(tiny_dir, pairs_file, tmp_path / "nan", **KW, callbacks=[INJECTOR]))
    plain = run_inprocess(base_config(tiny_dir, pairs_file, tmp_path / "plain", **KW))
    assert max_diff(final_weights(tmp_path / "skip"), final_weights(tmp_path / "nan")) == 0
    assert max_diff(final_weights(tmp_path / "skip"), final_weights(tmp_path / "plain")) > 0
    for mine, theirs in zip(events, _skip_events(tmp_path / "nan"), strict=True):  # the guard names the NaN rows only
        assert set(theirs["example_ids"]) < set(mine["example_ids"])
    assert nan.skipped_steps == 2 and plain.skipped_steps == 0


def test_skip_batches_on_resume_applies_once(tmp_path, tiny_dir, pairs_file, faults, capsys):
    out = tmp_path / "run"
    cfg = base_config(tiny_dir, pairs_file, out, **KW)
    run_inprocess({**cfg, "stop_after_steps": 2})
    run_inprocess({**cfg, "resume": "auto", "skip_batches": 3, "stop_after_steps": 4})  # steps 3 and 4 passed over
    capsys.readouterr()
    # a preempted job restarted with the same command does not skip again
    res = run_inprocess({**cfg, "resume": "auto", "skip_batches": 3})
    assert "--skip-batches 3 was applied at step 2; not skipping again" in capsys.readouterr().out
    assert res.global_step == 6 and res.skipped_steps == 2
    assert [e["step"] for e in _skip_events(out)] == [3, 4]
    faults("nan_logps@3,nan_logps@4")
    run_inprocess(base_config(tiny_dir, pairs_file, tmp_path / "nan", **KW, callbacks=[INJECTOR]))
    assert max_diff(final_weights(out), final_weights(tmp_path / "nan")) < 1e-6
