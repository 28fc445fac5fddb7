"""Two "nodes" on this machine: one ``torchrun --nnodes 2 --node_rank R`` per node over loopback, each with its own
command line (its own ``--output-dir`` simulates a node-local disk).  LOCAL_RANK is 0 on both."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

from tests.faults._run import cli_args, env
from tests.support import free_port


def start_nodes(cfgs: list[dict[str, Any]], logs: list[Path], **extra_env: str) -> list[subprocess.Popen]:
    """``torchrun`` for node R with ``cfgs[R]`` (stdout+stderr to ``logs[R]``), each in its own process group."""
    port = free_port()
    procs = []
    for rank, (cfg, log) in enumerate(zip(cfgs, logs, strict=True)):
        cmd = [
            sys.executable, "-m", "torch.distributed.run", "--nnodes=2", f"--node_rank={rank}", "--nproc_per_node=1",
            "--master_addr=127.0.0.1", f"--master_port={port}", "-m", "prefzoo", "train", *cli_args(cfg),
        ]  # fmt: skip
        procs.append(
            subprocess.Popen(
                cmd, env=env(**extra_env), stdout=log.open("w"), stderr=subprocess.STDOUT, start_new_session=True
            )
        )
    return procs


def wait_nodes(procs: list[subprocess.Popen], timeout: float = 600) -> list[int]:
    """Exit codes of every node (a node still running after ``timeout`` s is killed: the test fails on its code)."""
    codes = []
    for p in procs:
        try:
            codes.append(p.wait(timeout=timeout))
        except subprocess.TimeoutExpired:
            kill_node(p)
            codes.append(-9)
    return codes


def kill_node(proc: subprocess.Popen) -> None:
    """kill -9 a node: its launcher and every process it started (torchrun puts its workers in their own sessions,
    so a process-group kill would miss them)."""
    import psutil  # accelerate's dependency

    try:
        tree = [psutil.Process(proc.pid), *psutil.Process(proc.pid).children(recursive=True)]
    except psutil.NoSuchProcess:
        tree = []
    for p in reversed(tree):  # workers first, then the launcher
        try:
            os.kill(p.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    proc.wait()


def run_nodes(cfgs: list[dict[str, Any]], logs: list[Path], timeout: float = 600) -> tuple[list[int], list[str]]:
    codes = wait_nodes(start_nodes(cfgs, logs), timeout)
    return codes, [log.read_text() for log in logs]
