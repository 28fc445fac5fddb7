"""The output dir: a finished run resumed is reported and left untouched; a second run on it stops at once."""

from __future__ import annotations

import math
import os
import re
import signal

import pytest

from prefzoo.cli.main import main
from prefzoo.train.checkpoint.outdir import LOCK_FILE, OutputDirLockedError
from tests.faults._run import cli_args, start_cli, wait_for
from tests.faults.injector import SPEC as INJECTOR
from tests.train.helpers import base_config, run_inprocess

KW = dict(loss="dpo", max_steps=3, save_steps=2)


def _snapshot(root):
    """(relative path -> mtime_ns, size) of every file and folder under ``root`` but the lock (it names its holder)."""
    out = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            p = os.path.join(dirpath, name)
            if name == LOCK_FILE:
                continue
            st = os.stat(p)
            out[os.path.relpath(p, root)] = (st.st_mtime_ns, st.st_size)
    return out


def test_resume_of_a_finished_run_says_so_and_touches_nothing(tmp_path, tiny_dir, pairs_file, capsys):
    out = tmp_path / "run"
    argv = ["train", *cli_args(base_config(tiny_dir, pairs_file, out, **KW))]
    assert main(argv) == 0
    before = _snapshot(out)
    assert "final/model.safetensors" in before and "checkpoints/step-00000003" in before
    capsys.readouterr()
    assert main([*argv, "--resume", "auto"]) == 0
    text = capsys.readouterr().out
    complete = r"already complete \(step 3 of 3; final loss (\S+), reward accuracy (\S+)\); its model is in (\S+)\."
    said = re.search(complete, text)
    assert said is not None and said.group(3) == str(out / "final"), text  # the run's numbers (issue 49), not NaN
    assert math.isfinite(float(said.group(1))) and math.isfinite(float(said.group(2)))
    assert "Traceback" not in text and "steps; final loss" not in text  # no summary of a run that trained nothing
    assert _snapshot(out) == before  # nothing rewritten, nothing added


def test_a_longer_run_resumed_from_a_finished_one_trains_on(tmp_path, tiny_dir, pairs_file):
    out = tmp_path / "run"
    run_inprocess(base_config(tiny_dir, pairs_file, out, **KW))
    res = run_inprocess(base_config(tiny_dir, pairs_file, out, **{**KW, "max_steps": 4}, resume="auto"))
    assert not res.already_complete and res.global_step == 4


@pytest.mark.slow  # 2-15 s (two default-task runs of 2 steps)
def test_resume_of_a_finished_default_run_says_so_and_touches_nothing(tmp_path, capsys):
    out = tmp_path / "default"
    argv = ["train", "--output-dir", str(out), "--max-steps", "2", "--no-progress"]
    assert main(argv) == 0
    before = _snapshot(out)
    capsys.readouterr()
    assert main([*argv, "--resume", "auto"]) == 0
    text = capsys.readouterr().out
    assert "already complete (step 2 of 2; final loss " in text and str(out / "final") in text, text
    assert _snapshot(out) == before


@pytest.mark.slow  # about 60 s on a loaded 2-core machine (a CLI subprocess starts and trains)
def test_a_second_run_on_the_same_output_dir_stops_with_one_line(tmp_path, tiny_dir, pairs_file, capsys):
    out = tmp_path / "run"
    cfg = base_config(tiny_dir, pairs_file, out, **{**KW, "max_steps": 40}, callbacks=[INJECTOR])
    log = tmp_path / "first.log"
    first = start_cli(cfg, log, PREFZOO_FAULTS="sleep_step@0", PREFZOO_FAULT_SLEEP="1")  # a slow first run
    try:
        wait_for(lambda: (out / "checkpoints" / "step-00000002").exists(), 240, "the first run's checkpoint 2", first,
                 log)  # fmt: skip
        with pytest.raises(OutputDirLockedError, match=r"is in use by another prefzoo train .*pid"):
            run_inprocess({**cfg, "callbacks": []})
        assert main(["train", *cli_args({**cfg, "callbacks": []})]) != 0
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and "is in use by another" in err[0] and "different --output-dir" in err[0], err
        assert first.poll() is None  # the first run was not disturbed
    finally:
        first.send_signal(signal.SIGKILL)
        first.wait(timeout=30)
    # kill -9 drops the lock with the process: the lock file left behind does not block the resume
    assert (out / LOCK_FILE).exists()
    res = run_inprocess({**cfg, "callbacks": [], "max_steps": 40, "resume": "auto"})
    assert res.global_step == 40 and not res.already_complete
