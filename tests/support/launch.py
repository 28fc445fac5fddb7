"""The CLI as a user launches it on several processes: ``torchrun --nproc_per_node N -m prefzoo ARGS`` (gloo on CPU,
one thread per process), and the checks of the default run's closing report."""

from __future__ import annotations

import math
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

__all__ = ["assert_default_report", "torchrun_prefzoo"]

ROOT = Path(__file__).resolve().parents[2]


def torchrun_prefzoo(*args: str, nproc: int = 2) -> str:
    """Run ``prefzoo ARGS`` in ``nproc`` torchrun processes of this checkout; its stdout (it must exit 0)."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "DS_ACCELERATOR": "cpu", "HF_HUB_OFFLINE": "1",
           "HF_DATASETS_OFFLINE": "1", "PYTHONPATH": str(ROOT)}  # fmt: skip
    cmd = [sys.executable, "-m", "torch.distributed.run", f"--nproc_per_node={nproc}", "--standalone", "-m", "prefzoo",
           *args]  # fmt: skip
    # its own session, so that a hang ends with every rank, not only torchrun (ranks outlive a killed torchrun)
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)  # fmt: skip
    try:
        out, err = proc.communicate(timeout=600)  # a hang guard only: these runs take well under a minute
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        err += "\n(hung: every process killed after 600 s)"
    assert proc.returncode == 0, f"prefzoo {' '.join(args)}: exit {proc.returncode}\n{out[-3000:]}\n{err[-6000:]}"
    return out


def assert_default_report(stdout: str, out: Path) -> None:
    """The default run's before/after table with the trained policy's scores, and its last line naming the final
    model in ``out``."""
    assert "prefzoo train: scoring the trained policy" in stdout
    for row in ("win-rate vs start", "retention (skill B)"):
        m = re.search(rf"^{re.escape(row)}\s+(\S+)\s+(\S+)$", stdout, re.MULTILINE)
        assert m is not None, (row, stdout[-2000:])
        after = float(m.group(2))
        assert math.isfinite(after) and 0.0 <= after <= 1.0, (row, m.group(0))
    assert f"wrote final model {out / 'final'}" in stdout.strip().splitlines()[-1]
