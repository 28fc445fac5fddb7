"""One process with accumulation 2 equals batch ×2; kill-and-resume equals the uninterrupted run."""

from __future__ import annotations

import json

import pytest
from helpers import base_config, max_param_diff, params_of, run_inprocess

from prefzoo.train.checkpoint import COMPLETE_MARKER, ResumeError, find_latest_checkpoint


def test_accumulation_equals_larger_batch(tmp_path, tiny_dir, pairs_file):
    a = run_inprocess(
        base_config(tiny_dir, pairs_file, tmp_path / "a", per_device_batch_size=2, grad_accum=2, max_steps=4)
    )
    b = run_inprocess(
        base_config(tiny_dir, pairs_file, tmp_path / "b", per_device_batch_size=4, grad_accum=1, max_steps=4)
    )
    diff = max_param_diff(params_of(a.model), params_of(b.model))
    assert diff < 1e-5, diff
    assert abs(a.history[-1]["loss"] - b.history[-1]["loss"]) < 1e-5
    # and the comparison can fail: a different seed reorders the data
    c = run_inprocess(base_config(tiny_dir, pairs_file, tmp_path / "c", per_device_batch_size=4, max_steps=4, seed=1))
    assert max_param_diff(params_of(a.model), params_of(c.model)) > 1e-4


@pytest.mark.parametrize("loss", ["dpo", "mmpo"])
def test_kill_and_resume_equals_uninterrupted(tmp_path, tiny_dir, pairs_file, loss):
    kw = dict(loss=loss, per_device_batch_size=4, grad_accum=2, max_steps=12, eval_fraction=0.1)  # 8 steps/epoch
    full = run_inprocess(base_config(tiny_dir, pairs_file, tmp_path / "full", **kw))
    out = tmp_path / "resumed"
    first = run_inprocess(base_config(tiny_dir, pairs_file, out, save_steps=3, stop_after_steps=9, **kw))
    assert first.stopped_early and first.final_dir is None
    assert find_latest_checkpoint(out).name == "step-00000009"
    second = run_inprocess(base_config(tiny_dir, pairs_file, out, save_steps=3, resume="auto", **kw))
    assert second.global_step == 12
    diff = max_param_diff(params_of(full.model), params_of(second.model))
    assert diff < 1e-6, diff
    assert [e["eval/reward_accuracy"] for e in second.evals] == [e["eval/reward_accuracy"] for e in full.evals[1:]]


def test_incomplete_checkpoint_is_never_the_latest(tmp_path):
    root = tmp_path / "checkpoints"
    (root / "step-00000002").mkdir(parents=True)
    (root / "step-00000002" / COMPLETE_MARKER).write_text(json.dumps({"step": 2}))
    (root / "step-00000004").mkdir()  # killed before its marker was written
    (root / ".tmp-step-00000006").mkdir()
    assert find_latest_checkpoint(tmp_path).name == "step-00000002"


def test_resume_with_another_loss_or_model_is_an_error(tmp_path, tiny_dir, pairs_file):
    out = tmp_path / "run"
    run_inprocess(base_config(tiny_dir, pairs_file, out, max_steps=2))
    with pytest.raises(ResumeError, match=r"loss 'dpo'.*'ipo'"):
        run_inprocess(base_config(tiny_dir, pairs_file, out, max_steps=4, loss="ipo", resume="auto"))
    from tiny import make_model_dir

    other = make_model_dir(tmp_path / "other", seed=7)
    with pytest.raises(ResumeError, match="same --model"):
        run_inprocess(base_config(other, pairs_file, out, max_steps=4, resume="auto"))
