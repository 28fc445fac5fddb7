"""SIGTERM/SIGINT: a checkpoint at the next step boundary, a clean exit naming --resume auto, and an exact resume."""

from __future__ import annotations

import json
import signal
import subprocess
import sys

import pytest

from prefzoo.train.checkpoint import find_latest_checkpoint
from prefzoo.train.signals import PreemptionHandler
from tests.faults._run import env, final_weights, logged_steps, max_diff, start_cli, wait_for
from tests.faults.injector import SPEC as INJECTOR
from tests.train.helpers import base_config, max_param_diff, params_of, run_inprocess, run_processes

KW = dict(loss="dpo", per_device_batch_size=4, grad_accum=2, max_steps=12, eval_fraction=0.0, save_steps=5)
KW["callbacks"] = [INJECTOR]  # faults come from PREFZOO_FAULTS through this callback


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
    cfg = base_config(
        tiny_dir, pairs_file, out, loss="mmpo-no-aux", per_device_batch_size=4, max_steps=8, callbacks=[INJECTOR]
    )
    res = run_processes(cfg, 2)
    assert res["step"] == 3
    assert find_latest_checkpoint(out).name == "step-00000003"
    assert not (out / "final").exists()


@pytest.fixture
def sigint(request):
    """SIGINT's disposition for one test (``request.param``), whatever the suite inherited; restored afterwards."""
    before = signal.signal(signal.SIGINT, request.param)
    yield request.param
    signal.signal(signal.SIGINT, before)


@pytest.mark.parametrize("sigint", [signal.default_int_handler], indirect=True, ids=["default_int_handler"])
def test_second_sigint_interrupts_at_once(sigint):
    before = signal.getsignal(signal.SIGINT)
    with PreemptionHandler() as pre:
        assert pre.handled == ("SIGTERM", "SIGINT")
        signal.raise_signal(signal.SIGINT)
        assert pre.should_stop() and pre.reason() == "SIGINT"
        with pytest.raises(KeyboardInterrupt):
            signal.raise_signal(signal.SIGINT)
    assert signal.getsignal(signal.SIGINT) is before  # restored


def test_handlers_are_restored_and_no_signal_means_no_stop():
    before = signal.getsignal(signal.SIGTERM)
    with PreemptionHandler() as pre:
        assert not pre.should_stop()
        assert signal.getsignal(signal.SIGTERM) != before
    assert signal.getsignal(signal.SIGTERM) == before


@pytest.mark.parametrize("sigint", [signal.SIG_IGN], indirect=True, ids=["SIG_IGN"])
def test_ignored_sigint_stays_ignored_and_sigterm_still_preempts(sigint):
    with PreemptionHandler() as pre:
        assert pre.handled == ("SIGTERM",)
        assert signal.getsignal(signal.SIGINT) is signal.SIG_IGN
        signal.raise_signal(signal.SIGINT)
        signal.raise_signal(signal.SIGINT)  # neither stops the run nor interrupts it
        assert not pre.should_stop()
        signal.raise_signal(signal.SIGTERM)
        assert pre.should_stop() and pre.reason() == "SIGTERM"
    assert signal.getsignal(signal.SIGINT) is signal.SIG_IGN


# The child: a fresh interpreter that inherits SIGINT ignored (as under `nohup cmd &`) and uses the handler with
# real signals sent by kill(2).  It prints what it saw as JSON.
_CHILD = """
import json, os, signal
from prefzoo.train.signals import PreemptionHandler
seen = {"inherited": signal.getsignal(signal.SIGINT) is signal.SIG_IGN}
with PreemptionHandler() as pre:
    seen["handled"] = list(pre.handled)
    os.kill(os.getpid(), signal.SIGINT)
    os.kill(os.getpid(), signal.SIGINT)
    seen["stop_after_sigint"] = pre.should_stop()
    os.kill(os.getpid(), signal.SIGTERM)
    seen["stop_after_sigterm"], seen["reason"] = pre.should_stop(), pre.reason()
seen["ignored_after"] = signal.getsignal(signal.SIGINT) is signal.SIG_IGN
print(json.dumps(seen))
"""
# Sets SIGINT ignored, then execs Python: the disposition survives exec, exactly as a shell's `&` or nohup leaves it.
_IGNORE_SIGINT_THEN_EXEC = (
    "import os, signal, sys; signal.signal(signal.SIGINT, signal.SIG_IGN); "
    "os.execv(sys.executable, [sys.executable, *sys.argv[1:]])"
)


def test_child_started_with_sigint_ignored_is_preempted_by_sigterm_only():
    cmd = [sys.executable, "-c", _IGNORE_SIGINT_THEN_EXEC, "-c", _CHILD]
    proc = subprocess.run(cmd, env=env(), capture_output=True, text=True, stdin=subprocess.DEVNULL, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    seen = json.loads(proc.stdout.strip().splitlines()[-1])
    assert seen == {
        "inherited": True,  # Python kept the inherited SIG_IGN at start-up (no default_int_handler)
        "handled": ["SIGTERM"],
        "stop_after_sigint": False,
        "stop_after_sigterm": True,
        "reason": "SIGTERM",
        "ignored_after": True,
    }, seen
