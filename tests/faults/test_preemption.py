"""SIGTERM/SIGINT: a checkpoint at the next step boundary, a clean exit naming --resume auto, and an exact resume;
before the first step (nothing to save) an exit at once, and during the last step a finished run."""

from __future__ import annotations

import json
import math
import re
import shutil
import signal
import subprocess
import sys
import time

import pytest

from prefzoo.cli.main import main
from prefzoo.train.checkpoint.outdir import FINISHED_MARKER
from prefzoo.train.checkpoint.save import find_latest_checkpoint
from prefzoo.train.loop.signals import PreemptionHandler
from tests.faults._run import (
    cli_args,
    env,
    final_weights,
    logged_steps,
    max_diff,
    slow_to_tokenize,
    start_cli,
    wait_for,
)
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
from prefzoo.train.loop.signals import PreemptionHandler
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


# ---- issue 49: a signal before the first step, and during the last ----
BEFORE_TOKENIZING = "prefzoo train: token limits"  # the run's last line before it starts tokenizing
PROGRESS = re.compile(r"^tokenizing pairs: (\d+)/(\d+) pairs \(\d+%\), \d+ s(?:, about (\d+) s left)?", re.M)
STOPPED = (
    "prefzoo train: stopped by {} before the first training step: nothing was trained or saved; rerun the same "
    "command to start again"
)


def start_slow_tokenizing(tmp_path, tiny_dir):
    """`prefzoo train` as a user starts it at a terminal (progress on, Ctrl-C live; its log is not a terminal) on
    data that takes seconds to tokenize, in a datasets cache of its own (nothing tokenized before)."""
    out = tmp_path / "run"
    cfg = base_config(tiny_dir, slow_to_tokenize(tmp_path / "long.jsonl"), out, max_steps=1, progress=True)
    log = tmp_path / "run.log"
    return start_cli(cfg, log, ctrl_c=True, HF_DATASETS_CACHE=str(tmp_path / "hf-datasets")), log, out


def test_sigint_while_tokenizing_stops_at_once_with_one_line(tmp_path, tiny_dir):
    proc, log, out = start_slow_tokenizing(tmp_path, tiny_dir)
    wait_for(lambda: BEFORE_TOKENIZING in log.read_text(), 300, "the line before tokenizing", proc, log)
    t0 = time.monotonic()  # then tokenizing's first progress line (2 s in); without one (main), 8 s into tokenizing
    wait_for(lambda: PROGRESS.search(log.read_text()) or time.monotonic() - t0 > 8, 60, "tokenizing", proc, log)
    before = log.read_text()
    sent = time.monotonic()
    proc.send_signal(signal.SIGINT)
    rc = proc.wait(timeout=300)
    took = time.monotonic() - sent
    text = log.read_text()
    assert rc == 130, text[-3000:]  # 128 + SIGINT, as a shell reports a process Ctrl-C ended
    after = [line for line in text[len(before) :].splitlines() if line.strip() and not PROGRESS.match(line)]
    assert after == [STOPPED.format("SIGINT")], after  # one line, no traceback
    assert "Traceback" not in text and not re.search(r"^tokenizing pairs: .* in [\d.]+ s", text, re.M)
    assert not (out / "metrics.jsonl").exists() and find_latest_checkpoint(out) is None  # no step was trained
    seen = PROGRESS.search(before)
    assert seen is not None, before[-2000:]  # the run was tokenizing: k of n pairs done when the signal came
    done, total, left = int(seen.group(1)), int(seen.group(2)), int(seen.group(3) or 0)
    assert 0 < done < total and took < max(left, 1.0), (done, total, left, took)  # before tokenizing could finish


def test_a_signal_during_the_last_step_finishes_the_run(tmp_path, tiny_dir, pairs_file, capsys):
    out = tmp_path / "run"
    cfg = base_config(tiny_dir, pairs_file, out, max_steps=2, callbacks=[INJECTOR])
    log = tmp_path / "run.log"
    proc = start_cli(cfg, log, PREFZOO_FAULTS="sigterm@2")  # SIGTERM as the last step starts
    assert proc.wait(timeout=300) == 0, log.read_text()[-3000:]
    text = log.read_text()
    said = "prefzoo train: SIGTERM arrived during the last step (2/2): the run is complete, writing the final model"
    assert said in text.splitlines(), text[-2000:]  # on a line of its own
    assert "no final model yet" not in text and "preempted" not in text, text[-2000:]
    assert (out / "final" / "model.safetensors").is_file()
    numbers = re.search(r"^prefzoo train: 2 steps; (final loss (\S+), reward accuracy (\S+))$", text, re.M)
    assert numbers is not None and math.isfinite(float(numbers.group(2))), text[-2000:]
    # resuming it trains nothing and says so, with the run's numbers
    capsys.readouterr()
    assert main(["train", *cli_args(cfg), "--resume", "auto"]) == 0
    said = capsys.readouterr().out
    assert f"this run is already complete (step 2 of 2; {numbers.group(1)})" in said, said[-2000:]


def test_the_preemption_message_is_a_line_of_its_own_after_the_progress(tmp_path, tiny_dir, pairs_file):
    """Issue 49: in a log the message was printed on the progress bar's line (after its carriage returns)."""
    out = tmp_path / "run"
    cfg = base_config(tiny_dir, pairs_file, out, max_steps=4, progress=True, callbacks=[INJECTOR])
    log = tmp_path / "run.log"
    proc = start_cli(cfg, log, PREFZOO_FAULTS="sigterm@2")
    assert proc.wait(timeout=300) == 0, log.read_text()[-3000:]
    text = log.read_text()
    assert b"\r" not in log.read_bytes(), text[-2000:]  # whole lines in a log (read_text would turn \r into \n)
    said = [line for line in text.splitlines() if "preempted by SIGTERM at step 2/4" in line]
    assert len(said) == 1 and said[0].startswith("prefzoo train: preempted by SIGTERM at step 2/4;"), said
    assert re.search(r"^prefzoo train: \d/4 steps \(\d+%\)", text, re.M), text[-2000:]  # the progress, as lines


def test_a_resume_with_nothing_left_to_train_reports_the_run_s_numbers(tmp_path, tiny_dir, pairs_file, capsys):
    """The last checkpoint is the run's last step but there is no final model (a kill -9 while it was written, or a
    run preempted in its last step before issue 49): the resume writes it and reports the run's numbers, not NaN."""
    out = tmp_path / "run"
    flags = cli_args(base_config(tiny_dir, pairs_file, out, max_steps=2))
    assert main(["train", *flags]) == 0
    first = re.search(r"^prefzoo train: 2 steps; final loss .*$", capsys.readouterr().out, re.M)
    assert first is not None and "nan" not in first.group(0)
    shutil.rmtree(out / "final")
    (out / FINISHED_MARKER).unlink()
    assert main(["train", *flags, "--resume", "auto"]) == 0
    said = capsys.readouterr().out
    assert "resumed from" in said and first.group(0) in said.splitlines(), said[-2000:]
    assert (out / "final" / "model.safetensors").is_file()


def test_the_handler_unblocks_the_signals_it_handles():
    """A SIGINT/SIGTERM blocked by whoever started the run (a signal mask survives fork and exec) would never arrive:
    the handler unblocks what it handles, as a shell does."""
    from prefzoo.train.loop.signals import PreemptionHandler

    before = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})
    try:
        with PreemptionHandler() as handler:
            assert "SIGTERM" in handler.handled
            assert signal.SIGTERM not in signal.pthread_sigmask(signal.SIG_BLOCK, set())
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, before)
