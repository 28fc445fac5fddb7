"""SIGTERM/SIGINT: a checkpoint at the next step boundary, a clean exit naming --resume auto, and an exact resume."""

from __future__ import annotations

import signal

import pytest
from _run import final_weights, logged_steps, max_diff, start_cli, wait_for
from helpers import base_config, max_param_diff, params_of, run_inprocess, run_processes

from prefzoo.train.checkpoint import find_latest_checkpoint
from prefzoo.train.signals import PreemptionHandler

KW = dict(loss="dpo", per_device_batch_size=4, grad_accum=2, max_steps=12, eval_fraction=0.0, save_steps=5)


def test_sigterm_in_process_checkpoints_at_step_boundary_and_resume_is_exact(tmp_path, tiny_dir, pairs_file, faults):
    full = run_inprocess(base_config(tiny_dir, pairs_file, tmp_path / "full", **KW))
    out = tmp_path / "pre"
    faults("sigterm@4")  # the process sends itself SIGTERM when optimizer step 4 starts
    first = run_inprocess(base_config(tiny_dir, pairs_file, out, **KW))
    assert first.stop_reason == "preempted by SIGTERM" and first.stopped_early
    assert first.global_step == 4 and first.final_dir is None  # the step in flight finished, then it stopped
    assert find_latest_checkpoint(out).name == "step-00000004"
    faults("")
    second = run_inprocess(base_config(tiny_dir, pairs_file, out, resume="auto", **KW))
    assert second.global_step == 12 and second.stop_reason is None
    diff = max_param_diff(params_of(full.model), params_of(second.model))
    assert diff < 1e-6, diff
    # and the comparison can fail: the weights at the preemption point differ from the final ones
    assert max_param_diff(params_of(first.model), params_of(second.model)) > 1e-4


@pytest.mark.slow
def test_sigterm_to_cli_subprocess_then_resume_equals_uninterrupted(tmp_path, tiny_dir, pairs_file):
    cfg = base_config(tiny_dir, pairs_file, tmp_path / "full", **KW)
    full = start_cli(cfg, tmp_path / "full.log")
    assert full.wait(timeout=300) == 0, (tmp_path / "full.log").read_text()[-3000:]
    out = tmp_path / "pre"
    log = tmp_path / "pre.log"
    cfg = base_config(tiny_dir, pairs_file, out, **KW)
    proc = start_cli(cfg, log, PREFZOO_FAULTS="sleep_step@0", PREFZOO_FAULT_SLEEP="0.4")  # slow steps: a real race
    wait_for(lambda: logged_steps(out) >= 3, 240, "step 3", proc, log)
    proc.send_signal(signal.SIGTERM)  # from outside, at whatever point the run is
    rc = proc.wait(timeout=120)
    text = log.read_text()
    assert rc == 0, text[-3000:]
    assert "preempted by SIGTERM" in text and "--resume auto" in text, text[-2000:]
    ckpt = find_latest_checkpoint(out)
    stopped = int(ckpt.name.split("-")[1])
    assert 3 <= stopped < 12, text[-2000:]
    assert not (out / "final").exists()
    resumed = start_cli({**cfg, "resume": "auto"}, tmp_path / "resume.log")
    assert resumed.wait(timeout=300) == 0, (tmp_path / "resume.log").read_text()[-3000:]
    assert f"resumed from {ckpt}" in (tmp_path / "resume.log").read_text()
    diff = max_diff(final_weights(tmp_path / "full"), final_weights(out))
    assert diff < 1e-6, diff


@pytest.mark.slow
@pytest.mark.distributed
def test_sigterm_on_one_rank_stops_every_rank_at_the_same_step(tmp_path, tiny_dir, pairs_file, monkeypatch):
    monkeypatch.setenv("PREFZOO_FAULTS", "sigterm@3:1")  # only rank 1 is signalled
    out = tmp_path / "two"
    cfg = base_config(tiny_dir, pairs_file, out, loss="mmpo-no-aux", per_device_batch_size=4, max_steps=8)
    res = run_processes(cfg, 2)
    assert res["step"] == 3
    assert find_latest_checkpoint(out).name == "step-00000003"
    assert not (out / "final").exists()


def test_second_sigint_interrupts_at_once():
    with PreemptionHandler() as pre:
        signal.raise_signal(signal.SIGINT)
        assert pre.should_stop() and pre.reason() == "SIGINT"
        with pytest.raises(KeyboardInterrupt):
            signal.raise_signal(signal.SIGINT)
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler  # restored


def test_handlers_are_restored_and_no_signal_means_no_stop():
    before = signal.getsignal(signal.SIGTERM)
    with PreemptionHandler() as pre:
        assert not pre.should_stop()
        assert signal.getsignal(signal.SIGTERM) != before
    assert signal.getsignal(signal.SIGTERM) == before
