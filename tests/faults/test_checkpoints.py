"""kill -9 during a checkpoint write never leaves a corrupt newest checkpoint; --resume auto skips incomplete ones."""

from __future__ import annotations

import json
import shutil
import signal

import pytest

from prefzoo.train.checkpoint.save import (
    COMPLETE_MARKER,
    ResumeError,
    complete_checkpoints,
    find_latest_checkpoint,
    is_complete,
    read_marker,
)
from tests.faults._run import final_weights, max_diff, start_cli, wait_for
from tests.faults.injector import SPEC as INJECTOR
from tests.train.helpers import base_config, run_inprocess

KW = dict(loss="dpo", per_device_batch_size=4, grad_accum=1, max_steps=8, eval_fraction=0.0, save_steps=2)
KW["callbacks"] = [INJECTOR]  # faults come from PREFZOO_FAULTS through this callback


@pytest.mark.slow
def test_kill9_inside_checkpoint_write_then_resume_auto_uses_previous(tmp_path, tiny_dir, pairs_file):
    out = tmp_path / "run"
    log = tmp_path / "run.log"
    cfg = base_config(tiny_dir, pairs_file, out, **KW)
    # checkpoint 4's writer sleeps after the state files and before the completion marker
    proc = start_cli(cfg, log, PREFZOO_FAULTS="ckpt_sleep@4", PREFZOO_FAULT_SLEEP="120")
    wait_for(lambda: "checkpoint 4 written, no marker yet" in log.read_text(), 240, "checkpoint 4's write", proc, log)
    proc.send_signal(signal.SIGKILL)
    assert proc.wait(timeout=30) == -signal.SIGKILL
    tmp = out / "checkpoints" / ".tmp-step-00000004"
    assert (tmp / "model.safetensors").is_file() and not (tmp / COMPLETE_MARKER).exists()  # really mid-write
    assert find_latest_checkpoint(out).name == "step-00000002"
    resumed = start_cli({**cfg, "resume": "auto"}, tmp_path / "resume.log")
    assert resumed.wait(timeout=300) == 0, (tmp_path / "resume.log").read_text()[-3000:]
    assert "resumed from" in (text := (tmp_path / "resume.log").read_text()) and "step-00000002" in text
    assert not tmp.exists()  # the stale temp folder was cleaned up by the next save
    full = run_inprocess(base_config(tiny_dir, pairs_file, tmp_path / "full", **KW))
    assert full.global_step == 8
    diff = max_diff(final_weights(tmp_path / "full"), final_weights(out))
    assert diff < 1e-6, diff


def test_kill9_then_resume_logs_every_step_once(tmp_path, tiny_dir, pairs_file, capsys):
    """Issue 49: steps logged after the last checkpoint were logged again by the resumed run (step 3 twice)."""
    from prefzoo.cli.main import main
    from tests.faults._run import cli_args, logged_steps

    out = tmp_path / "run"
    log = tmp_path / "run.log"
    cfg = base_config(tiny_dir, pairs_file, out, **{**KW, "max_steps": 4, "logging_steps": 1})  # checkpoints 2, 4
    proc = start_cli(cfg, log, PREFZOO_FAULTS="sleep_step@0", PREFZOO_FAULT_SLEEP="0.5")  # steps slow enough to aim
    wait_for(lambda: logged_steps(out) >= 3, 240, "step 3 logged", proc, log)
    proc.send_signal(signal.SIGKILL)  # step 4 (and its checkpoint) is at least 0.5 s away
    assert proc.wait(timeout=30) == -signal.SIGKILL
    assert find_latest_checkpoint(out).name == "step-00000002" and logged_steps(out) == 3  # step 3 is past it
    capsys.readouterr()
    assert main(["train", *cli_args(cfg), "--resume", "auto"]) == 0
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows if "loss" in r] == [1, 2, 3, 4]
    said = capsys.readouterr().out
    assert f"dropped 1 line(s) of {out / 'metrics.jsonl'} logged after step 2" in said, said[-2000:]


def test_resuming_drops_the_records_past_the_checkpoint_and_a_torn_line(tmp_path):
    from prefzoo.train.loop.metrics import JsonlWriter, last_logged

    path = tmp_path / "metrics.jsonl"
    rows = [
        {"step": 0, "eval/loss": 0.7},
        {"step": 1, "loss": 0.6, "lr": 1.0},
        {"event": "note"},
        {"step": 2, "loss": 0.5, "lr": 1.0},
        {"step": 2, "eval/loss": 0.5},
        {"step": 3, "loss": 0.4, "lr": 1.0},
    ]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows) + '{"step": 4, "lo')  # torn by a kill -9
    writer = JsonlWriter(path, enabled=True)
    assert writer.drop_after(2) == 2  # step 3 and the torn line
    assert [json.loads(line) for line in path.read_text().splitlines()] == rows[:5]
    assert last_logged(path, 2) == rows[3] and last_logged(path, 1) == rows[1]
    assert writer.drop_after(2) == 0 and writer.drop_after(0) == 4  # at step 0 the run starts over
    assert [json.loads(line) for line in path.read_text().splitlines()] == [{"event": "note"}]


def test_save_total_limit_keeps_the_last_k(tmp_path, tiny_dir, pairs_file):
    out = tmp_path / "run"
    run_inprocess(base_config(tiny_dir, pairs_file, out, **{**KW, "save_steps": 1, "max_steps": 5}, save_total_limit=3))
    names = [p.name for p in complete_checkpoints(out)]
    assert names == ["step-00000003", "step-00000004", "step-00000005"]
    info = read_marker(out / "checkpoints" / "step-00000005")
    assert info["step"] == 5 and info["skipped_steps"] == 0
    assert {"model.safetensors", "optimizer.bin"} <= set(info["files"])  # the manifest


def _fake_checkpoint(root, step, files=None, marker=True):
    d = root / "checkpoints" / f"step-{step:08d}"
    d.mkdir(parents=True)
    files = files or {"model.safetensors": b"x" * 10, "optimizer.bin": b"y" * 5}
    for name, data in files.items():
        (d / name).write_bytes(data)
    if marker:
        manifest = {k: len(v) for k, v in files.items()}
        (d / COMPLETE_MARKER).write_text(json.dumps({"step": step, "files": manifest}))
    return d


def test_truncated_or_missing_files_make_a_checkpoint_incomplete(tmp_path):
    good = _fake_checkpoint(tmp_path, 2)
    truncated = _fake_checkpoint(tmp_path, 4)
    (truncated / "model.safetensors").write_bytes(b"x" * 3)  # torn write on a filesystem without atomic rename
    missing = _fake_checkpoint(tmp_path, 6)
    (missing / "optimizer.bin").unlink()
    assert is_complete(good) and not is_complete(truncated) and not is_complete(missing)
    assert find_latest_checkpoint(tmp_path) == good
    with pytest.raises(ResumeError, match="incomplete or corrupt"):
        read_marker(truncated)


def test_corrupt_or_absent_marker_is_skipped(tmp_path):
    good = _fake_checkpoint(tmp_path, 2)
    bad = _fake_checkpoint(tmp_path, 4)
    (bad / COMPLETE_MARKER).write_text('{"step": 4, "fi')  # killed while writing the marker itself
    _fake_checkpoint(tmp_path, 6, marker=False)
    (tmp_path / "checkpoints" / ".tmp-step-00000008").mkdir()
    assert find_latest_checkpoint(tmp_path) == good
    with pytest.raises(ResumeError, match=r"no prefzoo_checkpoint\.json"):
        read_marker(tmp_path / "checkpoints" / "step-00000006")
    with pytest.raises(ResumeError, match="no such checkpoint"):
        read_marker(tmp_path / "checkpoints" / "step-00000099")


def test_resume_auto_with_only_incomplete_checkpoints_is_refused(tmp_path, tiny_dir, pairs_file):
    """A step-N folder without its marker is damaged (the rename comes after the marker): starting afresh would
    overwrite the run's metrics and final model, so --resume auto refuses and says how to start afresh."""
    out = tmp_path / "run"
    _fake_checkpoint(out, 4, marker=False)
    (out / ".tmp-step-00000006").mkdir()  # a write killed before its marker: not a checkpoint, not damage
    with pytest.raises(ResumeError, match=r"no checkpoint in .* verifies \(step-00000004: incomplete.*move the dama"):
        run_inprocess(base_config(tiny_dir, pairs_file, out, **{**KW, "max_steps": 2}, resume="auto"))
    assert not (out / "metrics.jsonl").exists()
    shutil.rmtree(out / "checkpoints" / "step-00000004")  # the way out the message names: afresh
    res = run_inprocess(base_config(tiny_dir, pairs_file, out, **{**KW, "max_steps": 2}, resume="auto"))
    assert res.global_step == 2


@pytest.mark.slow
def test_kill9_at_random_moments_and_resume_auto_until_done_equals_uninterrupted(tmp_path, tiny_dir, pairs_file):
    import random
    import time

    from tests.faults._run import logged_steps

    kw = {**KW, "save_steps": 1, "max_steps": 10, "save_total_limit": 2}
    out = tmp_path / "run"
    cfg = base_config(tiny_dir, pairs_file, out, **kw)
    rng = random.Random(7)
    kills = 0
    for attempt in range(12):
        log = tmp_path / f"attempt{attempt}.log"
        proc = start_cli({**cfg, "resume": "auto"}, log, PREFZOO_FAULTS="sleep_step@0", PREFZOO_FAULT_SLEEP="0.15")
        if kills < 4:
            start, t0 = logged_steps(out), time.time()
            while logged_steps(out) <= start and proc.poll() is None and time.time() - t0 < 240:
                time.sleep(0.05)  # wait until this attempt made progress (or finished)
            time.sleep(rng.uniform(0.0, 0.6))  # anywhere: mid-step, mid-save_state, mid-rename, mid-pruning
            if proc.poll() is None:
                proc.send_signal(signal.SIGKILL)
                proc.wait(timeout=30)
                kills += 1
                latest = find_latest_checkpoint(out)
                assert latest is None or is_complete(latest)
                continue
        assert proc.wait(timeout=300) == 0, log.read_text()[-3000:]
        break
    assert kills == 4 and (out / "final").is_dir()
    full = run_inprocess(base_config(tiny_dir, pairs_file, tmp_path / "full", **kw))
    assert full.global_step == 10
    diff = max_diff(final_weights(tmp_path / "full"), final_weights(out))
    assert diff < 1e-6, diff
