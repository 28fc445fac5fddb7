"""examples/slurm/prefzoo.sbatch renders one torchrun per node from the SLURM_* environment (fake srun/scontrol)."""

from __future__ import annotations

import os
import shlex
import subprocess
from pathlib import Path

ROOT = Path(__file__).parents[2]
SCRIPT = ROOT / "examples" / "slurm" / "prefzoo.sbatch"

FAKE_SRUN = """#!/bin/bash
# one task per node: run the command once per node with that node's SLURM_NODEID
while [[ "$1" == --* ]]; do shift; done
for ((i = 0; i < SLURM_JOB_NUM_NODES; i++)); do SLURM_NODEID=$i "$@" || exit $?; done
"""
FAKE_SCONTROL = """#!/bin/bash
[[ "$1 $2" == "show hostnames" ]] || exit 2
echo gpu-017; echo gpu-018; echo gpu-019
"""
FAKE_TORCHRUN = """#!/bin/bash
printf '%q ' torchrun "$@" >> "$TORCHRUN_LOG"; echo >> "$TORCHRUN_LOG"
"""


def _fake(bin_dir: Path, name: str, text: str) -> None:
    (bin_dir / name).write_text(text)
    (bin_dir / name).chmod(0o755)


def test_sbatch_renders_one_torchrun_per_node(tmp_path):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name, text in (("srun", FAKE_SRUN), ("scontrol", FAKE_SCONTROL), ("torchrun", FAKE_TORCHRUN)):
        _fake(bin_dir, name, text)
    log = tmp_path / "torchrun.log"
    env = {
        "PATH": f"{bin_dir}:{os.environ['PATH']}",
        "TORCHRUN_LOG": str(log),
        "SLURM_JOB_NUM_NODES": "3",
        "SLURM_JOB_NODELIST": "gpu-[017-019]",
        "SLURM_JOB_ID": "123456",
        "SLURM_GPUS_ON_NODE": "8",
    }
    args = ["--config", "run.yaml", "--output-dir", "/scratch/run one"]
    proc = subprocess.run(["bash", str(SCRIPT), *args], env=env, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    lines = [shlex.split(line) for line in log.read_text().splitlines()]
    assert len(lines) == 3
    for node, cmd in enumerate(lines):
        assert cmd == [
            "torchrun", "--nnodes", "3", "--node_rank", str(node), "--nproc_per_node", "8",
            "--master_addr", "gpu-017", "--master_port", str(29500 + 123456 % 1000),
            "-m", "prefzoo", "train", "--dist-timeout", "600", *args,
        ]  # fmt: skip


def test_sbatch_outside_slurm_says_how_to_run_it(tmp_path):
    proc = subprocess.run(["bash", str(SCRIPT)], env={"PATH": os.environ["PATH"]}, capture_output=True, text=True)
    assert proc.returncode != 0 and "run this script with sbatch" in proc.stderr
