"""The CLI as a user launches it on several processes: ``torchrun --nproc_per_node N -m prefzoo ARGS`` (gloo on CPU,
one thread per process), the checks of the default run's closing report, and SIGKILL for such a run whole (torchrun
and every rank at once: :func:`kill_run`)."""

from __future__ import annotations

import math
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

__all__ = ["alive", "assert_default_report", "descendants", "kill_run", "torchrun_prefzoo"]

ROOT = Path(__file__).resolve().parents[2]


def torchrun_prefzoo(*args: str, nproc: int = 2) -> str:
    """Run ``prefzoo ARGS`` in ``nproc`` torchrun processes of this checkout; its stdout (it must exit 0)."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "DS_ACCELERATOR": "cpu", "HF_HUB_OFFLINE": "1",
           "HF_DATASETS_OFFLINE": "1", "PYTHONPATH": str(ROOT)}  # fmt: skip
    cmd = [sys.executable, "-m", "torch.distributed.run", f"--nproc_per_node={nproc}", "--standalone", "-m", "prefzoo",
           *args]  # fmt: skip
    # its own session; a hang ends with every rank, not only torchrun (ranks outlive a killed torchrun: kill_run)
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)  # fmt: skip
    try:
        out, err = proc.communicate(timeout=600)  # a hang guard only: these runs take well under a minute
    except subprocess.TimeoutExpired:
        kill_run(proc)
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


def descendants(pid: int) -> list[int]:
    """Every live process below ``pid`` (from /proc's parent links), children first."""
    parent: dict[int, int] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()  # after "pid (comm)": state, ppid, ...
        except (OSError, IndexError):
            continue
        parent[int(stat.parent.name)] = int(fields[1])
    found, todo = [], [pid]
    while todo:
        above = todo.pop(0)
        kids = [c for c, p in parent.items() if p == above]
        found += kids
        todo += kids
    return found


def alive(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie does not)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state != "Z"  # a zombie is dead, only not reaped yet (ranks are reparented when torchrun dies)


def kill_run(proc: subprocess.Popen) -> list[int]:
    """SIGKILL torchrun and every rank at once, then wait until none is left (a run started next never meets a dying
    one).  torchrun starts each rank in a session of its own (torch's ``SubprocessHandler`` passes
    ``start_new_session``), so killing torchrun's process group alone leaves the ranks running: every group of the
    run is killed, each by the id of its leader, a process this run started.  Returns the processes still alive."""
    ours = [*descendants(proc.pid), proc.pid]
    groups = []
    for pid in ours:
        try:
            groups.append(os.getpgid(pid))
        except ProcessLookupError:
            continue
    for group in dict.fromkeys(g for g in groups if g in ours):  # never a group this run did not start
        try:
            os.killpg(group, signal.SIGKILL)
        except ProcessLookupError:
            pass
    proc.wait()
    t0 = time.monotonic()
    while any(alive(pid) for pid in ours) and time.monotonic() - t0 < 30:
        time.sleep(0.02)
    return [pid for pid in ours if alive(pid)]  # none, unless a process outlived SIGKILL for 30 s
