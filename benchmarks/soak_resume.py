"""Soak: SIGKILL a 2-process `prefzoo train` at random moments, N times in a row, resuming each time; compare.

    python benchmarks/soak_resume.py --quick              # 3 kills, 16 steps (CI: tests/faults/test_soak.py)
    python benchmarks/soak_resume.py --kills 20 --seed 1  # the long form in docs/reliability.md

The run is the embedded default task with DPO on ``torchrun --standalone --nproc_per_node 2`` (gloo, one thread per
process), a checkpoint every 2 steps and ``--resume auto``.  Each attempt is killed, torchrun and both ranks at once,
with SIGKILL at a moment drawn from the seed:

* ``step``: during an optimizer step, 1 to 4 steps after the attempt's first new one;
* ``checkpoint``: while a ``checkpoints/.tmp-step-N`` folder of this attempt exists (state files being written, the
  marker not yet, the rename, the pruning);
* ``between-ranks``: while that folder holds rank 0's files but not rank 1's ``random_states_1.pkl``;
* ``anywhere``: a random time after the start (loading, resuming, rewriting ``metrics.jsonl``, a step or a save).

The test-only fault injector (``tests/faults/injector.py``) widens the windows without changing the numbers: every
step sleeps 0.1 s (``sleep_step``), rank 1 sleeps before writing its checkpoint files (``save_sleep``) and the writer
before the completion marker (``ckpt_sleep``).  After every kill, every checkpoint ``--resume auto`` could pick (each
complete one) must load, file by file, with every rank's RNG state.  After the last kill the run is resumed to the
end and compared with an uninterrupted run of the same command: final weights within ``TOLERANCE``, each step logged
once in ``metrics.jsonl`` (none lost, none repeated), no litter (``.tmp-*`` folders, ``*.tmp<pid>`` files, incomplete
``checkpoints/step-*`` folders).  The
summary prints the kills survived, steps lost and bytes of litter; the exit status is 1 on any failure.  The same
seed draws the same moments (where a moment falls in a step depends on the machine's speed; what it hits is
printed).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import random
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # run as a script: prefzoo and tests/ from this checkout
    sys.path.insert(0, str(ROOT))

from prefzoo.train.checkpoint import (  # noqa: E402
    COMPLETE_MARKER,
    checkpoint_step,
    complete_checkpoints,
    verify_checkpoint,
)
from tests.support.launch import kill_run  # noqa: E402

# Final weights of the soaked run against the uninterrupted one, max |Δ| over every tensor.  A resume restores the
# weights, AdamW moments, scheduler, data position and RNG exactly, and gloo's all-reduce of 2 ranks is
# deterministic on CPU, so a resumed run measures 0.0 (bit-identical); 1e-6 is the bound the single-kill fault tests
# state (tests/faults/test_checkpoints.py).  One step left out shows: a resume that skips the next-to-last of 16
# steps, where the cosine schedule's lr is nearly 0, ends 7.5e-6 away (tests/faults/test_soak.py).
TOLERANCE = 1e-6
MOMENTS = ("step", "checkpoint", "between-ranks", "anywhere")
STEP_SLEEP = 0.1  # PREFZOO_FAULT_SLEEP: each step, rank 1 before its checkpoint files, the writer before the marker
FAULTS = "sleep_step@0,save_sleep@0:1,ckpt_sleep@0"
INJECTOR = "tests.faults.injector:FaultInjector"
HANG_GUARD_S = 600.0  # a hang guard only, never an expected time
_LITTER = re.compile(r"^\.tmp-|\.tmp\d+$")  # checkpoint/final temp folders; atomically replaced files' temp names


@dataclass
class Kill:
    attempt: int
    moment: str  # one of MOMENTS: what the kill aimed at
    hit: str  # what was on disk when it was sent
    resumed_from: int  # the step of the newest complete checkpoint when the attempt started (0: a fresh start)
    newest_after: int  # the step of the newest complete checkpoint after the kill
    seconds: float  # after the attempt's start


@dataclass
class Report:
    seed: int
    kills_asked: int
    max_steps: int
    kills: list[Kill] = field(default_factory=list)
    steps_lost: int = 0  # steps of 1..max_steps with no record in metrics.jsonl
    steps_repeated: int = 0  # records beyond one per step
    steps_redone: int = 0  # steps trained again after a kill (logged, then dropped on resume): the cost of kills
    litter: dict[str, int] = field(default_factory=dict)  # path -> bytes
    bad_checkpoints: list[str] = field(default_factory=list)
    max_diff: float | None = None
    tolerance: float = TOLERANCE
    failures: list[str] = field(default_factory=list)
    wall_s: float = 0.0

    @property
    def ok(self) -> bool:
        return not self.failures

    @property
    def litter_bytes(self) -> int:
        return sum(self.litter.values())


# ---------------------------------------------------------------------------------------------------- the runs
def train_args(out: Path, max_steps: int, seed: int) -> list[str]:
    """The soaked command's ``prefzoo`` arguments (the uninterrupted run gets the same)."""
    return ["train", "--loss", "dpo", "--seed", str(seed), "--max-steps", str(max_steps), "--save-steps", "2",
            "--save-total-limit", "2", "--logging-steps", "1", "--no-eval-at-start", "--no-progress",
            "--report-to", "none", "--output-dir", str(out), "--resume", "auto", "--callback", INJECTOR]  # fmt: skip


def _env(faults: bool) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PREFZOO_FAULT")}
    env.update(OMP_NUM_THREADS="1", HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1", PYTHONPATH=str(ROOT))
    if faults:
        env.update(PREFZOO_FAULTS=FAULTS, PREFZOO_FAULT_SLEEP=str(STEP_SLEEP))
    return env


def start(args: list[str], log: Path, faults: bool, nproc: int = 2) -> subprocess.Popen:
    """``torchrun --nproc_per_node nproc -m prefzoo ARGS`` in its own session (process group = its pid)."""
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}", "-m", "prefzoo",
           *args]  # fmt: skip
    with log.open("w") as fh:
        return subprocess.Popen(cmd, env=_env(faults), stdout=fh, stderr=subprocess.STDOUT, cwd=ROOT,
                                start_new_session=True)  # fmt: skip


def finish(proc: subprocess.Popen, log: Path, what: str) -> None:
    try:
        rc = proc.wait(timeout=HANG_GUARD_S)
    except subprocess.TimeoutExpired:
        kill_run(proc)
        rc = None
    if rc != 0:
        raise RuntimeError(f"{what}: exit {rc}\n{log.read_text()[-4000:]}")


# ------------------------------------------------------------------------------------------------ what is on disk
def logged_steps(out: Path) -> list[int]:
    """The step of every training record of ``metrics.jsonl`` in file order (a torn last line is skipped)."""
    path = out / "metrics.jsonl"
    steps = []
    if path.is_file():
        for line in path.read_text().splitlines():
            try:
                row = json.loads(line)
            except ValueError:
                continue
            if isinstance(row, dict) and "loss" in row and "step" in row:
                steps.append(int(row["step"]))
    return steps


def newest_step(out: Path) -> int:
    found = complete_checkpoints(out)
    return checkpoint_step(found[-1]) if found else 0


def _temp_folders(out: Path) -> dict[str, tuple[int, set[str]]]:
    """``checkpoints/.tmp-step-*`` folders: name -> (inode, file names); a folder removed meanwhile is left out."""
    root = out / "checkpoints"
    found: dict[str, tuple[int, set[str]]] = {}
    try:
        entries = list(root.iterdir())
    except OSError:
        return found
    for d in entries:
        if d.name.startswith(".tmp-step-"):
            try:
                found[d.name] = (d.stat().st_ino, {p.name for p in d.iterdir()})
            except OSError:
                continue
    return found


def litter(out: Path) -> dict[str, int]:
    """What killed writes and prunings left: temp folders and files, and ``checkpoints/step-*`` folders that are not
    complete (a checkpoint half-deleted by a killed pruning: never resumed, never pruned); path -> bytes."""
    found: dict[str, int] = {}
    for p in sorted(out.rglob("*")):
        if _LITTER.search(p.name) and not any(_LITTER.search(q.name) for q in p.relative_to(out).parents if q.name):
            found[str(p.relative_to(out))] = _size(p)
    complete = set(complete_checkpoints(out))
    for p in sorted((out / "checkpoints").glob("step-*")):
        if p.is_dir() and p not in complete:
            found[str(p.relative_to(out))] = _size(p)
    return found


def _size(p: Path) -> int:
    files = [p] if p.is_file() else [f for f in p.rglob("*") if f.is_file()]
    return sum(f.stat().st_size for f in files)


def checkpoint_problems(out: Path, nproc: int = 2) -> list[str]:
    """Why a checkpoint that looks complete (``--resume auto`` may pick it) would not resume: its files do not verify
    (a sha256 differs from its marker, or the marker records none), a file that does not load, a rank's RNG state
    missing, a marker naming another step."""
    from safetensors.torch import load_file

    from prefzoo.train.checkpoint.state import safe_torch_load

    problems = []
    for ckpt in complete_checkpoints(out):
        marker = json.loads((ckpt / COMPLETE_MARKER).read_text())
        verdict = verify_checkpoint(ckpt)
        if not (verdict.ok and verdict.hashed):
            problems.append(f"{ckpt.name} does not verify: {verdict.why or 'its marker records no sha256'}")
        if marker.get("step") != checkpoint_step(ckpt):
            problems.append(f"{ckpt.name}: its marker says step {marker.get('step')}")
        for rank in range(nproc):
            if not (ckpt / f"random_states_{rank}.pkl").is_file():
                problems.append(f"{ckpt.name}: rank {rank}'s RNG state random_states_{rank}.pkl is missing")
        for rel in marker.get("files", {}):
            path = ckpt / rel
            try:
                if path.suffix == ".safetensors":
                    load_file(str(path))
                elif path.suffix in (".bin", ".pkl", ".pt"):
                    safe_torch_load(str(path))  # as resuming reads it: weights_only=True
                elif path.suffix == ".json":
                    json.loads(path.read_text())
            except Exception as e:  # any error is the finding
                problems.append(f"{ckpt.name}/{rel} does not load: {type(e).__name__}: {str(e)[:200]}")
    return problems


def weights_diff(a: Path, b: Path) -> float:
    from safetensors.torch import load_file

    x, y = load_file(str(a / "final" / "model.safetensors")), load_file(str(b / "final" / "model.safetensors"))
    if set(x) != set(y):
        return float("inf")
    return max(float((x[k].double() - y[k].double()).abs().max()) for k in x)


def check(out: Path, reference: Path, max_steps: int, nproc: int = 2, report: Report | None = None) -> Report:
    """The end state of the soaked run ``out`` against the uninterrupted ``reference``; fills ``report``'s
    counts and failures (a new report when none is given)."""
    r = report if report is not None else Report(seed=-1, kills_asked=0, max_steps=max_steps)
    steps = logged_steps(out)
    counts = {s: steps.count(s) for s in set(steps)}
    lost = [s for s in range(1, max_steps + 1) if s not in counts]
    repeated = sorted(s for s, n in counts.items() if n > 1)
    extra = sorted(s for s in counts if not 1 <= s <= max_steps)
    r.steps_lost = len(lost)
    r.steps_repeated = sum(counts[s] - 1 for s in repeated)
    if lost:
        r.failures.append(f"steps lost: {lost} have no record in metrics.jsonl")
    if repeated:
        r.failures.append(f"steps repeated: {repeated} logged more than once")
    if extra or steps != sorted(steps):
        r.failures.append(f"metrics.jsonl out of order or beyond 1..{max_steps}: {steps}")
    r.litter = litter(out)
    if r.litter:
        r.failures.append(f"litter: {r.litter}")
    r.bad_checkpoints = checkpoint_problems(out, nproc)
    r.failures += [f"checkpoint looks complete but is not: {p}" for p in r.bad_checkpoints]
    if not (out / "final" / "model.safetensors").is_file():
        r.failures.append(f"no final model in {out / 'final'}")
        return r
    r.max_diff = weights_diff(out, reference)
    if not r.max_diff <= r.tolerance:
        r.failures.append(f"final weights differ from the uninterrupted run: max |diff| {r.max_diff:.3g} > "
                          f"{r.tolerance:g}")  # fmt: skip
    return r


# ------------------------------------------------------------------------------------------------------ the soak
def _moments(rng: random.Random, kills: int) -> list[str]:
    """The moments of ``kills`` kills: the first three are step, checkpoint and between-ranks in a seeded order
    (so even --quick meets each), then any of MOMENTS."""
    named = list(MOMENTS[:3])
    rng.shuffle(named)
    return (named + [rng.choice(MOMENTS) for _ in range(max(0, kills - 3))])[:kills]


def _wait_moment(proc: subprocess.Popen, out: Path, moment: str, rng: random.Random, t0: float, max_steps: int,
                 startup: list[float]) -> str | None:  # fmt: skip
    """Poll ``out`` until ``moment`` of this attempt comes (then wait a random part of it); what was on disk then,
    or None when the attempt ended first.  Stale ``.tmp-step-*`` folders and metrics lines of earlier attempts are
    told apart from this attempt's (inode; steps past everything logged before).  ``startup`` collects the seconds
    from an attempt's start to its first new step; ``anywhere`` draws its time over the start-up so measured and the
    next few steps (the same draws on any machine, scaled by what this one measured)."""
    stale = {name: ino for name, (ino, _) in _temp_folders(out).items()}
    first_new = max([newest_step(out), *logged_steps(out)]) + 1  # before it, steps are logged again after a resume
    target = first_new + rng.randint(0, 3)
    steps = max(0, min(max_steps - first_new, 8))  # a step and its share of a save sleep >= 2 × STEP_SLEEP
    anywhere = 0.5 + rng.random() * (0.8 * statistics.median(startup or [12.0]) + steps * 2 * STEP_SLEEP)
    metrics = _Tail(out / "metrics.jsonl")
    seen = False
    while proc.poll() is None:
        if time.monotonic() - t0 > HANG_GUARD_S:
            return None
        newest = metrics.newest()
        if newest >= first_new and not seen:
            seen = True
            startup.append(time.monotonic() - t0)
        temps = {n: v for n, v in _temp_folders(out).items() if stale.get(n) != v[0]}  # this attempt's writes
        if moment == "step" and newest >= target:
            time.sleep(rng.uniform(0.0, STEP_SLEEP * 1.5))  # in the next step's sleep or compute, or a save after it
            return f"after step {target} was logged"
        if moment == "checkpoint" and temps:
            time.sleep(rng.uniform(0.0, STEP_SLEEP * 2.5))  # rank 1's and the marker's sleeps, the rename, pruning
            return f"{sorted(temps)[-1]} being written"
        if moment == "between-ranks":
            for name, (_, files) in temps.items():
                if "model.safetensors" in files and "random_states_1.pkl" not in files:
                    time.sleep(rng.uniform(0.0, STEP_SLEEP / 2))
                    return f"{name} with rank 0's files, not rank 1's ({', '.join(sorted(files))})"
        if moment == "anywhere" and time.monotonic() - t0 >= anywhere:
            where = f"step {newest} logged" if newest >= first_new else "no new step yet"
            return f"{anywhere:.1f} s after the start, {where}"
        time.sleep(0.01)
    return None


class _Tail:
    """The newest step logged in ``metrics.jsonl``, parsed again only when the file changed."""

    def __init__(self, path: Path) -> None:
        self.path, self.key, self.step = path, None, 0

    def newest(self) -> int:
        try:
            st = self.path.stat()
        except OSError:
            return 0
        if (st.st_ino, st.st_size) != self.key:
            self.key, self.step = (st.st_ino, st.st_size), max(logged_steps(self.path.parent), default=0)
        return self.step


def reference_run(root: Path, max_steps: int, seed: int) -> Path:
    """The uninterrupted run: the same command, no kills, no sleeps."""
    ref = root / "uninterrupted"
    log = root / "uninterrupted.log"
    finish(start(train_args(ref, max_steps, seed), log, faults=False), log, "the uninterrupted run")
    return ref


def soak(root: Path, kills: int, seed: int, max_steps: int | None = None, reference: Path | None = None,
         say: Any = print) -> Report:  # fmt: skip
    """Kill ``kills`` attempts of the run in ``root/soaked`` at seeded random moments, resume it to the end, and
    check it against ``reference`` (the uninterrupted run; run here when None)."""
    t_start = time.monotonic()
    max_steps = max_steps or max(16, 2 * kills + 8)  # a kill lets the run on by ~1.3 steps: it outlives them all
    rng = random.Random(seed)
    report = Report(seed=seed, kills_asked=kills, max_steps=max_steps)
    root.mkdir(parents=True, exist_ok=True)
    if reference is None:
        say(f"soak: the uninterrupted run ({max_steps} steps, 2 processes)")
        reference = reference_run(root, max_steps, seed)
    out = root / "soaked"
    args = train_args(out, max_steps, seed)
    startup: list[float] = []  # seconds from an attempt's start to its first new step
    for attempt, moment in enumerate(_moments(rng, kills), 1):
        resumed_from = newest_step(out)
        before = logged_steps(out)
        log = root / f"attempt{attempt:02d}.log"
        t0 = time.monotonic()
        proc = start(args, log, faults=True)
        try:
            hit = _wait_moment(proc, out, moment, rng, t0, max_steps, startup)
        except BaseException:
            kill_run(proc)
            raise
        if hit is None:
            finish(proc, log, f"attempt {attempt}")
            report.failures.append(f"attempt {attempt} ended before its kill ({moment}): {max_steps} steps are too few")
            break
        if survivors := kill_run(proc):
            report.failures.append(f"kill {attempt}: processes {survivors} of the run outlived SIGKILL")
            break
        report.steps_redone += len([s for s in before if s > resumed_from])
        kill = Kill(attempt, moment, hit, resumed_from, newest_step(out), round(time.monotonic() - t0, 2))
        report.kills.append(kill)
        say(f"soak: kill {attempt}/{kills} ({moment}): {hit}; newest checkpoint step {kill.newest_after} "
            f"(was {resumed_from})")  # fmt: skip
        problems = checkpoint_problems(out)
        report.failures += [f"after kill {attempt}: checkpoint looks complete but is not: {p}" for p in problems]
    if report.ok:
        resumed_from, before = newest_step(out), logged_steps(out)
        log = root / "final.log"
        say(f"soak: resuming to the end from step {resumed_from}")
        finish(start(args, log, faults=True), log, "the last resume")
        report.steps_redone += len([s for s in before if s > resumed_from])
        check(out, reference, max_steps, report=report)
    report.wall_s = round(time.monotonic() - t_start, 1)
    return report


def summary(r: Report) -> str:
    moments = {m: sum(k.moment == m for k in r.kills) for m in MOMENTS}
    diff = "n/a" if r.max_diff is None else f"{r.max_diff:.3g}"
    lines = [
        f"seed {r.seed}: kills survived {len(r.kills)} of {r.kills_asked} "
        f"({', '.join(f'{m} {n}' for m, n in moments.items())}), {r.max_steps} steps",
        f"steps lost: {r.steps_lost}, steps repeated: {r.steps_repeated} (steps trained again after a kill: "
        f"{r.steps_redone})",
        f"bytes of litter: {r.litter_bytes}",
        f"checkpoints that look complete but do not load: {len(r.bad_checkpoints)}",
        f"final weights vs the uninterrupted run: max |diff| {diff} (tolerance {r.tolerance:g})",
        f"wall time {r.wall_s:.0f} s",
        "PASS" if r.ok else "FAIL:\n  " + "\n  ".join(r.failures),
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    logging.getLogger(complete_checkpoints.__module__).setLevel(logging.ERROR)  # polled often: no warning per poll
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0], formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="3 kills (the CI form)")
    ap.add_argument("--kills", type=int, default=20, help="kills in a row (default 20)")
    ap.add_argument("--seed", type=int, default=0, help="draws the moments and the run's --seed (default 0)")
    ap.add_argument("--max-steps", type=int, default=None, help="the run's length (default 2 × kills + 8, at least 16)")
    ap.add_argument("--work-dir", type=Path, default=None, help="kept after the run (default: a temp folder, removed)")
    ap.add_argument("--json", type=Path, default=None, help="also write the report as JSON, with versions and machine")
    a = ap.parse_args(argv)
    kills = 3 if a.quick else a.kills
    root = a.work_dir or Path(tempfile.mkdtemp(prefix="prefzoo-soak-"))
    try:
        report = soak(root, kills, a.seed, a.max_steps)
    finally:
        if a.work_dir is None:
            shutil.rmtree(root, ignore_errors=True)
    print(summary(report))
    for k in report.kills:
        print(f"  kill {k.attempt:2d} {k.moment:13s} at {k.seconds:5.1f} s: {k.hit}; checkpoint {k.resumed_from} -> "
              f"{k.newest_after}")  # fmt: skip
    if a.json is not None:
        a.json.write_text(json.dumps({**asdict(report), "machine": _machine()}, indent=1) + "\n")
    return 0 if report.ok else 1


def _machine() -> dict[str, Any]:
    import platform

    import torch

    return {"date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "python": platform.python_version(),
            "torch": torch.__version__, "cpus": os.cpu_count(), "load_average": os.getloadavg()}  # fmt: skip


if __name__ == "__main__":
    sys.exit(main())
