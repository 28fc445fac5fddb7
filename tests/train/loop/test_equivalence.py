"""One process with accumulation 2 equals batch ×2; kill-and-resume equals the uninterrupted run."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from prefzoo.train.checkpoint.save import COMPLETE_MARKER, ResumeError, find_latest_checkpoint
from tests.train.helpers import base_config, max_param_diff, params_of, run_inprocess


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
    from tests.support.tiny import make_model_dir

    other = make_model_dir(tmp_path / "other", seed=7)
    with pytest.raises(ResumeError, match="same --model"):
        run_inprocess(base_config(other, pairs_file, out, max_steps=4, resume="auto"))
    with pytest.raises(ResumeError, match=r"checkpoint trained 4 examples per step \(1 processes × 4 per device × 1 "
                       r"accumulation\), this run 8 \(1 × 4 × 2\)"):  # fmt: skip
        run_inprocess(base_config(tiny_dir, pairs_file, out, max_steps=4, resume="auto", grad_accum=2))


def test_resume_from_an_explicit_path_and_an_incomplete_one(tmp_path, tiny_dir, pairs_file):
    kw = dict(per_device_batch_size=4, max_steps=4)
    full = run_inprocess(base_config(tiny_dir, pairs_file, tmp_path / "full", **kw))
    out = tmp_path / "run"
    run_inprocess(base_config(tiny_dir, pairs_file, out, save_steps=2, stop_after_steps=2, **kw))
    ckpt = out / "checkpoints" / "step-00000002"
    resumed = run_inprocess(base_config(tiny_dir, pairs_file, tmp_path / "other", resume=str(ckpt), **kw))
    assert max_param_diff(params_of(full.model), params_of(resumed.model)) < 1e-6
    (ckpt / COMPLETE_MARKER).unlink()
    with pytest.raises(ResumeError, match="incomplete checkpoint"):
        run_inprocess(base_config(tiny_dir, pairs_file, out, resume=str(ckpt), **kw))


@pytest.mark.slow
def test_sigkill_mid_run_then_resume_equals_uninterrupted(tmp_path, tiny_dir, pairs_file):
    """A real SIGKILL while training (checkpoints every step): the latest complete checkpoint resumes exactly."""
    import os
    import signal
    import subprocess
    import sys
    import time

    kw = dict(per_device_batch_size=2, grad_accum=1, max_steps=30, save_steps=1, lr=1e-3)
    out = tmp_path / "killed"
    args = [
        "train",
        "--loss",
        "dpo",
        "--model",
        str(tiny_dir),
        "--dataset",
        str(pairs_file),
        "--output-dir",
        str(out),
        "--report-to",
        "none",
        "--no-progress",
        "--eval-fraction",
        "0",
        "--seed",
        "0",
    ]
    args += [f"--{k.replace('_', '-')}={v}" for k, v in kw.items()]
    # every step sleeps 0.1 s (the tests' fault injector; weights unchanged), so the kill 0.3 s after the first
    # checkpoint lands mid-run even when the run is fast and the test's own process is scheduled late
    args += ["--callback", "tests.faults.injector:FaultInjector"]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1",
           "PREFZOO_FAULTS": "sleep_step@0", "PREFZOO_FAULT_SLEEP": "0.1"}  # fmt: skip
    root = Path(__file__).resolve().parents[3]
    proc = subprocess.Popen(
        [sys.executable, "-m", "prefzoo", *args], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        cwd=root,
    )
    deadline = time.time() + 900  # a hang guard only: a busy machine reaches the first checkpoint late, not never
    while time.time() < deadline and find_latest_checkpoint(out) is None and proc.poll() is None:
        time.sleep(0.05)
    time.sleep(0.3)  # mid-run, possibly mid-save
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    latest = find_latest_checkpoint(out)
    assert latest is not None
    killed_at = int(latest.name.split("-")[1])
    assert killed_at < 30, "the run finished before the kill; nothing was tested"
    resumed = run_inprocess(base_config(tiny_dir, pairs_file, out, resume="auto", **kw))
    full = run_inprocess(base_config(tiny_dir, pairs_file, tmp_path / "full", **kw))
    assert resumed.global_step == 30
    assert max_param_diff(params_of(full.model), params_of(resumed.model)) < 1e-6
