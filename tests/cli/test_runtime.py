"""The CLI's process set-up: CPU threads chosen from free cores, a one-process `accelerate launch --cpu` refused."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from prefzoo.cli.main import CLIError
from prefzoo.cli.runtime import check_launcher, choose_threads


@pytest.mark.parametrize(
    ("cores", "load", "env", "want"),
    [
        (2, 1.0, {}, 1),  # one other CPU-bound process on 2 cores: 1 thread, not torch's 2
        (2, 0.1, {}, 2),  # idle: every core
        (2, 7.5, {}, 1),  # overloaded: still at least one
        (16, 3.4, {}, 13),
        (16, 0.0, {"LOCAL_WORLD_SIZE": "4"}, 4),  # 4 processes of the run on this machine share the cores
        (2, 0.0, {"OMP_NUM_THREADS": "3"}, 3),  # the user's (or launcher's) explicit choice wins
        (2, 0.0, {"OMP_NUM_THREADS": ""}, 2),
    ],
)
def test_threads_follow_the_free_cores(cores, load, env, want):
    n, why = choose_threads(None, env, cores=cores, load=load)
    assert n == want
    assert ("OMP_NUM_THREADS" in why) == ("OMP_NUM_THREADS" in env and env["OMP_NUM_THREADS"] != "")


def test_threads_flag_wins_and_is_checked():
    assert choose_threads(5, {"OMP_NUM_THREADS": "1"}, cores=2, load=0.0) == (5, "--threads")
    with pytest.raises(CLIError, match="--threads 0"):
        choose_threads(0, {})


# what accelerate 1.x's simple launcher (the --cpu path) puts in the environment for --num_processes 2
_SIMPLE_LAUNCHER = {
    "ACCELERATE_USE_CPU": "True",
    "ACCELERATE_MIXED_PRECISION": "no",
    "MASTER_ADDR": "127.0.0.1",
    "MASTER_PORT": "29500",
    "OMP_NUM_THREADS": "1",
}


def test_one_process_from_a_multi_process_launch_is_refused():
    with pytest.raises(CLIError, match="torchrun --nproc_per_node N"):
        check_launcher(_SIMPLE_LAUNCHER)
    check_launcher({**_SIMPLE_LAUNCHER, "WORLD_SIZE": "2", "RANK": "1", "LOCAL_RANK": "1"})  # torchrun: fine
    check_launcher({k: v for k, v in _SIMPLE_LAUNCHER.items() if not k.startswith("MASTER")})  # --num_processes 1
    check_launcher({"MASTER_ADDR": "10.0.0.1", "MASTER_PORT": "1"})  # not accelerate: left alone


@pytest.mark.train
def test_accelerate_launch_cpu_two_processes_names_what_to_run(tmp_path):
    pytest.importorskip("accelerate")
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    for k in ("WORLD_SIZE", "RANK", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(k, None)
    cmd = [sys.executable, "-m", "accelerate.commands.launch", "--num_processes", "2", "--cpu", "--mixed_precision"]
    cmd += ["no", "--dynamo_backend", "no", "--num_machines", "1", "-m", "prefzoo", "train", "--loss", "dpo"]
    cmd += ["--output-dir", str(tmp_path)]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300, cwd=tmp_path)
    err = proc.stderr.strip().splitlines()
    assert proc.returncode != 0
    assert any(line.startswith("prefzoo train: error: accelerate launch --cpu started only one") for line in err)
    assert "Traceback" not in proc.stderr.split("prefzoo train: error")[0]
