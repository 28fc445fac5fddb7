"""A dead or hung peer ends a multi-process CPU run with a clear message instead of hanging (--dist-timeout)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from prefzoo.train.loop.guard import is_peer_failure
from tests.faults._run import cli_args, env
from tests.faults.injector import SPEC as INJECTOR
from tests.train.helpers import base_config

pytestmark = [pytest.mark.slow, pytest.mark.distributed]


def _torchrun_cli(cfg, faults: str) -> tuple[int, str]:
    """Two ranks under torchrun; ``--standalone`` binds a free port itself (no race with a second suite)."""
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--nproc_per_node=2",
        "--standalone",
        "-m",
        "prefzoo.cli.main",
        "train",
        *cli_args(cfg),
    ]
    # the timeout only guards against a hang of the test itself; how fast the run ends is not asserted (a busy
    # machine is slow, not wrong): --dist-timeout turns the peer's failure into an exit
    proc = subprocess.run(cmd, env=env(PREFZOO_FAULTS=faults), capture_output=True, text=True, timeout=900)
    return proc.returncode, proc.stdout + proc.stderr


def test_hung_peer_times_out_with_a_message(tmp_path, tiny_dir, pairs_file):
    cfg = base_config(tiny_dir, pairs_file, tmp_path / "run", max_steps=6, save_steps=1, dist_timeout=15)
    cfg["callbacks"] = [INJECTOR]
    rc, text = _torchrun_cli(cfg, "hang@3:1")  # rank 1 stops answering in step 3
    assert rc != 0, text[-3000:]
    assert "lost rank(s) 1 (node 0)" in text and "--dist-timeout=15s" in text, text[-3000:]  # the hung one, named
    assert "--resume auto" in text and "step-00000002" in text, text[-3000:]  # names the checkpoint to resume from


def test_peer_that_exits_ends_the_run(tmp_path, tiny_dir, pairs_file):
    cfg = base_config(tiny_dir, pairs_file, tmp_path / "run", max_steps=6, dist_timeout=60)
    cfg["callbacks"] = [INJECTOR]
    rc, text = _torchrun_cli(cfg, "exit@2:1")
    assert rc != 0, text[-3000:]
    assert "rank 1 exits at step 2" in text


def test_peer_failure_classification():
    assert is_peer_failure(RuntimeError("[../gloo/transport/tcp/pair.cc:534] Connection closed by peer"))
    assert is_peer_failure(RuntimeError("Timed out waiting 15000ms for recv operation to complete"))
    assert not is_peer_failure(RuntimeError("mat1 and mat2 shapes cannot be multiplied"))
    assert not is_peer_failure(ValueError("timeout"))
