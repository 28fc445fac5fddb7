"""The CLI's process set-up and end: CPU threads chosen from free cores, a one-process `accelerate launch --cpu`
refused, huge pages, and a launched worker's exit without interpreter teardown."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from prefzoo.cli.main import CLIError, end_launched_worker
from prefzoo.cli.runtime import check_launcher, choose_threads, huge_pages


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


def _sysfs(tmp_path, mode):
    path = tmp_path / "enabled"
    path.write_text(mode + "\n", encoding="ascii")
    return str(path)


@pytest.mark.parametrize("mode", ["always [madvise] never", "[always] madvise never"])
def test_huge_pages_are_turned_on_before_torch_loads(tmp_path, mode):
    env: dict[str, str] = {}
    line = huge_pages(env, sysfs=_sysfs(tmp_path, mode), torch_loaded=False)
    assert env == {"THP_MEM_ALLOC_ENABLE": "1"}
    assert line is not None and "THP_MEM_ALLOC_ENABLE=0 turns them off" in line


@pytest.mark.parametrize(
    ("env", "mode", "torch_loaded"),
    [
        ({"THP_MEM_ALLOC_ENABLE": "0"}, "always [madvise] never", False),  # the user's choice wins
        ({}, "always madvise [never]", False),  # the kernel has them off: nothing to promise
        ({}, "always [madvise] never", True),  # torch read the variable at its first allocation: too late
    ],
)
def test_huge_pages_leave_the_users_choice_the_kernels_and_a_loaded_torch_alone(tmp_path, env, mode, torch_loaded):
    before = dict(env)
    assert huge_pages(env, sysfs=_sysfs(tmp_path, mode), torch_loaded=torch_loaded) is None
    assert env == before


def test_huge_pages_without_the_sysfs_file_change_nothing(tmp_path):
    env: dict[str, str] = {}
    assert huge_pages(env, sysfs=str(tmp_path / "missing"), torch_loaded=False) is None
    assert env == {}


_THP_CHILD = """
import os, sys
from prefzoo.cli.runtime import huge_pages
line = huge_pages()
import torch
x = torch.empty(64 << 20, dtype=torch.uint8).fill_(1)  # a 64 MB buffer, every page touched
huge = next(int(l.split()[1]) for l in open("/proc/self/smaps_rollup") if l.startswith("AnonHugePages:"))
print(line is not None, huge)
"""


@pytest.mark.skipif(
    not os.path.exists("/sys/kernel/mm/transparent_hugepage/enabled")
    or "[madvise]" not in open("/sys/kernel/mm/transparent_hugepage/enabled").read(),
    reason="needs Linux with transparent huge pages in madvise mode (then only a madvise'd buffer gets them)",
)
@pytest.mark.parametrize("user_env", [None, "0"])
def test_torch_gets_huge_pages_only_when_set_before_it_loads(user_env):
    env = {k: v for k, v in os.environ.items() if k != "THP_MEM_ALLOC_ENABLE"}
    if user_env is not None:
        env["THP_MEM_ALLOC_ENABLE"] = user_env
    proc = subprocess.run([sys.executable, "-c", _THP_CHILD], capture_output=True, text=True, env=env, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    said, huge_kb = proc.stdout.split()
    assert said == str(user_env is None)
    assert (huge_kb != "0") == (user_env is None), proc.stdout  # ≥ 30 of the 32 2-MB pages when on
    if user_env is None:
        assert int(huge_kb) >= 60 * 1024


@pytest.mark.parametrize(
    ("env", "ends"),
    [
        ({"WORLD_SIZE": "2", "RANK": "1"}, True),
        ({"RANK": "0", "WORLD_SIZE": "1"}, True),  # prefzoo's own one-process group (DeepSpeed on CPU)
        ({"WORLD_SIZE": "1"}, False),
        ({}, False),
        ({"WORLD_SIZE": ""}, False),
    ],
)
def test_a_launched_worker_ends_at_once_with_its_status(env, ends):
    seen = []
    end_launched_worker(3, env, exit_now=seen.append)
    assert seen == ([3] if ends else [])


# a run stopped by a signal before its first step, from the program's own entry (argv None): the line, the status,
# and no interpreter teardown (which took 1.5 s after the line); a plain Ctrl-C keeps the teardown
_STOPPED = (
    "import atexit, sys; atexit.register(lambda: print('TEARDOWN', flush=True)); "
    "sys.argv = ['prefzoo', 'losses']; import prefzoo.cli.losses as cmd; from prefzoo.train.loop.signals import "
    "StoppedBeforeTraining as S; cmd.run = lambda args: (_ for _ in ()).throw({exc}); "
    "from prefzoo.cli.main import main; sys.exit(main())"
)


@pytest.mark.parametrize(
    ("exc", "code", "line", "teardown"),
    [
        ("S('SIGTERM')", 143, "prefzoo losses: stopped by SIGTERM before the first training step", False),
        ("KeyboardInterrupt()", 130, "prefzoo losses: interrupted", True),
    ],
)
def test_a_run_stopped_before_its_first_step_ends_at_once_with_its_status(exc, code, line, teardown):
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE")}  # not a launched worker
    proc = subprocess.run([sys.executable, "-c", _STOPPED.format(exc=exc)], capture_output=True, text=True, env=env,
                          timeout=300)  # fmt: skip
    assert proc.returncode == code, proc.stderr[-2000:]
    assert proc.stderr.strip().splitlines()[-1].startswith(line), proc.stderr[-2000:]
    assert ("TEARDOWN" in proc.stdout) == teardown


# the program's own entry (argv None) under a launcher: the command's output is complete, the status kept, and the
# interpreter's teardown (where gloo's threads aborted one finished worker in ten) never runs
_PROGRAM = (
    "import atexit, sys; atexit.register(lambda: print('TEARDOWN', flush=True)); "
    "sys.argv = ['prefzoo', 'inspect', 'no-such-loss']; "
    "from prefzoo.cli.main import main; print('OUT ' * 20, end=''); sys.exit(main())"
)


@pytest.mark.parametrize("world", ["2", "1"])
def test_the_program_under_a_launcher_skips_teardown_but_not_its_output(world):
    # CI sets PYTHONUNBUFFERED, a user's shell may not; RANK may be left in os.environ by an in-process DeepSpeed test
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONUNBUFFERED", "RANK")}
    env.update(WORLD_SIZE=world, OMP_NUM_THREADS="1")
    proc = subprocess.run([sys.executable, "-c", _PROGRAM], env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2, proc.stderr[-2000:]  # the unknown loss: a user error, one line, status 2
    assert proc.stdout.count("OUT ") == 20 and "no-such-loss" in proc.stderr  # buffered output flushed
    assert ("TEARDOWN" in proc.stdout) == (world == "1")
