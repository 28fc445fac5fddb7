"""Files you can trust in the output folder, as a user runs `prefzoo train` (a CLI subprocess each).

One output folder holds one run: a second run without --resume is refused in one line naming the ways out
(--resume auto, --overwrite-output-dir, another --output-dir), and the lock is taken before the default task loads.
No symbolic link is followed where a run writes: the lock file, metrics.jsonl and final/ as links are refused in one
line, their targets untouched; a metrics.jsonl link planted during the run is refused when it is opened.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from prefzoo.cli.main import main
from prefzoo.train import Callback
from tests.faults._run import ROOT, cli_args, env
from tests.train.helpers import base_config, run_inprocess

KW = dict(loss="dpo", max_steps=3, save_steps=1, save_total_limit=10, logging_steps=1)
VICTIM_ENV = "PREFZOO_TEST_VICTIM"


def _cli(*argv: str, cwd: Path = ROOT, timeout: float = 600) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "prefzoo.cli.main", *argv], env=env(), cwd=cwd, text=True,
                          capture_output=True, timeout=timeout)  # fmt: skip


def _train(cfg: dict, *extra: str) -> subprocess.CompletedProcess[str]:
    return _cli("train", *cli_args(cfg), *extra)


def _snapshot(root: Path) -> dict[str, bytes | None]:
    """Relative path -> contents (None for a folder) of everything under ``root`` but the lock file."""
    out: dict[str, bytes | None] = {}
    for p in sorted(root.rglob("*")):
        if p.name != ".prefzoo-train.lock":
            out[str(p.relative_to(root))] = None if p.is_dir() else p.read_bytes()
    return out


def _one_error_line(proc: subprocess.CompletedProcess[str]) -> str:
    assert proc.returncode != 0, proc.stdout[-3000:]
    assert "Traceback" not in proc.stderr, proc.stderr[-3000:]
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr[-3000:]
    return lines[0]


@pytest.mark.slow  # about 30 s on a loaded 2-core machine (a run, then a CLI subprocess)
def test_a_second_run_without_resume_is_refused_and_the_first_run_is_untouched(tmp_path, tiny_dir, pairs_file):
    out = tmp_path / "run"
    cfg = base_config(tiny_dir, pairs_file, out, **KW)
    run_inprocess(cfg)  # the first run (in this process: the second is the one run as a user runs it)
    before = _snapshot(out)
    second = _train({**cfg, "loss": "simpo", "max_steps": 2})  # another experiment, same folder, no --resume
    line = _one_error_line(second)
    assert f"--output-dir {out} holds a run already" in line, line
    assert "--resume auto" in line and "--overwrite-output-dir" in line and "another --output-dir" in line, line
    assert _snapshot(out) == before  # no row appended, no checkpoint added, final/ as it was


@pytest.mark.slow  # 30-60 s on a loaded 2-core machine: a 4-step run, then a CLI subprocess
def test_overwrite_output_dir_deletes_the_runs_files_only_and_starts_over(tmp_path, tiny_dir, pairs_file, capsys):
    out = tmp_path / "run"
    cfg = base_config(tiny_dir, pairs_file, out, **{**KW, "max_steps": 4})
    run_inprocess(cfg)
    (out / "notes.txt").write_text("mine")  # a file of the user's own
    again = _train({**cfg, "max_steps": 2}, "--overwrite-output-dir")
    assert again.returncode == 0, again.stderr[-3000:]
    steps = sorted(p.name for p in (out / "checkpoints").iterdir())
    assert steps == ["step-00000001", "step-00000002"], steps  # the first run's step 3 and 4 are gone
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows if "loss" in r] == [1, 2], rows  # one run's rows
    assert (out / "notes.txt").read_text() == "mine"
    assert main(["checkpoint", "info", str(out)]) == 0
    assert "step-00000002" in capsys.readouterr().out  # the run's newest: not the first run's step 4


@pytest.mark.slow  # about 20 s on a loaded 2-core machine (a CLI subprocess that trains)
def test_what_a_run_stopped_before_its_first_step_left_does_not_block_the_same_command(tmp_path, tiny_dir, pairs_file):
    out = tmp_path / "run"
    (out / "tb").mkdir(parents=True)  # what Ctrl-C after the evaluation at the start leaves ("rerun the same command")
    (out / "metrics.jsonl").write_text(json.dumps({"eval/loss": 0.69, "epoch": 0, "step": 0}) + "\n")
    proc = _train(base_config(tiny_dir, pairs_file, out, **KW))
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2, 3] and "eval/loss" not in rows[0], rows  # this run's rows only


@pytest.mark.slow  # 30-90 s on a loaded 2-core machine: one default-task run, a second stopped at once
def test_a_second_default_run_on_the_same_folder_stops_before_loading_the_task(tmp_path):
    out = tmp_path / "default"
    log = tmp_path / "first.log"
    argv = [sys.executable, "-m", "prefzoo.cli.main", "train", "--loss", "mmpo", "--output-dir", str(out),
            "--max-steps", "2", "--no-progress"]  # fmt: skip
    with log.open("w") as fh:
        first = subprocess.Popen(argv, env=env(), cwd=ROOT, stdout=fh, stderr=subprocess.STDOUT)
    try:
        t0 = time.monotonic()
        while "loading the embedded default task" not in log.read_text():
            assert first.poll() is None and time.monotonic() - t0 < 300, log.read_text()[-3000:]
            time.sleep(0.1)
        second = _cli(*argv[3:])  # started while the first loads, scores or trains
        assert "default task" not in second.stdout and "scoring" not in second.stdout, second.stdout  # no work done
        assert first.poll() is None, log.read_text()[-3000:]  # the first was still running (it holds the folder)
        line = _one_error_line(second)
        assert "is in use by another prefzoo train" in line and f"pid {first.pid}" in line, line
    finally:
        first.kill()
        first.wait(timeout=60)


@pytest.mark.parametrize("name", [".prefzoo-train.lock", "metrics.jsonl", "final"])
def test_a_symlink_where_the_run_writes_is_refused_and_its_target_untouched(tmp_path, tiny_dir, pairs_file, name):
    out = tmp_path / "run"
    out.mkdir()
    victim = tmp_path / "victim"
    if name == "final":
        victim.mkdir()
        (victim / "keep.txt").write_text("precious")
    else:
        victim.write_text("precious\n")
    (out / name).symlink_to(victim)
    before = _snapshot(tmp_path / "victim") if victim.is_dir() else victim.read_bytes()
    line = _one_error_line(_train(base_config(tiny_dir, pairs_file, out, **KW)))
    assert f"{out / name} is a symbolic link (to {victim})" in line, line
    assert (_snapshot(victim) if victim.is_dir() else victim.read_bytes()) == before
    assert not (out / "checkpoints").exists()  # refused before any work


class PlantLink(Callback):
    """Test-only: after step 1, replace the run's metrics.jsonl by a symlink to ``$PREFZOO_TEST_VICTIM``."""

    def on_step_end(self, state) -> None:
        if state.global_step == 1 and state.accelerator.is_main_process:
            path = Path(state.cfg.output_dir) / "metrics.jsonl"
            path.unlink(missing_ok=True)
            path.symlink_to(os.environ[VICTIM_ENV])


@pytest.mark.slow  # about 40 s on a loaded 2-core machine (a CLI subprocess that trains)
def test_a_metrics_link_planted_during_the_run_is_not_followed(tmp_path, tiny_dir, pairs_file, monkeypatch):
    out = tmp_path / "run"
    victim = tmp_path / "victim.txt"
    victim.write_text("precious\n")
    monkeypatch.setenv(VICTIM_ENV, str(victim))  # env() passes it on to the subprocess
    cfg = base_config(tiny_dir, pairs_file, out, **KW, callbacks=[f"{__name__}:PlantLink"])
    line = _one_error_line(_train(cfg))
    assert f"{out / 'metrics.jsonl'} is a symbolic link" in line, line
    assert victim.read_text() == "precious\n"
