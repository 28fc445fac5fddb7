"""The soak's quick form: a 2-process run SIGKILLed 3 times at seeded random moments (mid-step, mid-checkpoint,
between the ranks' writes), resumed with ``--resume auto`` each time, ends like the uninterrupted run
(``benchmarks/soak_resume.py --quick``).  Then each of the soak's checks is shown to fail on a scratch copy of the
soaked run broken the way it looks for, and its kill to leave no rank behind."""

from __future__ import annotations

import contextlib
import importlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from prefzoo.train.checkpoint import COMPLETE_MARKER, complete_checkpoints, is_complete, verify_checkpoint
from tests.faults._run import ROOT
from tests.support.launch import alive, descendants, kill_run

SEED = 0  # draws the moments: benchmarks/soak_resume.py --quick --seed 0 reproduces a failure
# 2-process runs: the quick soak is five launches (~60 s of CPU; 73 s to 5 min on a 2-core machine beside other jobs),
# the two resumes and the kill check 40 s to 2 min more
pytestmark = [pytest.mark.slow, pytest.mark.distributed]


@pytest.fixture(scope="module")
def soak():
    with pytest.MonkeyPatch.context() as mp:  # the benchmarks are scripts in a folder, not a package
        mp.syspath_prepend(str(ROOT / "benchmarks"))
        yield importlib.import_module("soak_resume")


@pytest.fixture(scope="module")
def soaked(soak, tmp_path_factory):
    """The quick soak, run once: its work folder (``soaked/``, ``uninterrupted/``, the logs) and its report."""
    root = tmp_path_factory.mktemp("soak")
    return root, soak.soak(root, kills=3, seed=SEED)


def test_three_random_kills_then_resume_equals_the_uninterrupted_run(soak, soaked):
    root, r = soaked
    assert r.ok, soak.summary(r)
    assert len(r.kills) == 3 and {k.moment for k in r.kills} == {"step", "checkpoint", "between-ranks"}
    assert r.steps_lost == 0 and r.steps_repeated == 0 and r.litter_bytes == 0 and not r.bad_checkpoints
    kept = complete_checkpoints(root / "soaked")
    assert kept and all(verify_checkpoint(c).ok and verify_checkpoint(c).hashed for c in kept)  # sha256 of every file
    assert r.max_diff is not None and r.max_diff <= soak.TOLERANCE
    assert soak.logged_steps(root / "soaked") == list(range(1, r.max_steps + 1))


@pytest.fixture
def scratch(soaked, tmp_path):
    """A copy of the soaked run to break, and the uninterrupted run to compare it with."""
    root, r = soaked
    out = tmp_path / "soaked"
    shutil.copytree(root / "soaked", out)
    return out, root / "uninterrupted", r.max_steps


def _lines(out):
    return (out / "metrics.jsonl").read_text().splitlines(keepends=True)


def test_a_lost_step_fails(soak, scratch):
    out, ref, n = scratch
    (out / "metrics.jsonl").write_text("".join(x for x in _lines(out) if json.loads(x).get("step") != 5))
    r = soak.check(out, ref, n)
    assert r.steps_lost == 1 and any("steps lost: [5]" in f for f in r.failures), r.failures


def test_a_repeated_step_fails(soak, scratch):
    out, ref, n = scratch
    lines = _lines(out)
    (out / "metrics.jsonl").write_text("".join(lines[:3] + lines[2:]))  # a record logged twice
    r = soak.check(out, ref, n)
    assert r.steps_repeated == 1 and any("steps repeated" in f for f in r.failures), r.failures


def test_litter_fails_and_is_counted_in_bytes(soak, scratch):
    out, ref, n = scratch
    tmp = out / "checkpoints" / ".tmp-step-00000099"
    tmp.mkdir()
    (tmp / "model.safetensors").write_bytes(b"x" * 100)
    (out / ".metrics.jsonl.tmp4242").write_bytes(b"y" * 7)  # a metrics rewrite killed before its rename
    r = soak.check(out, ref, n)
    assert r.litter_bytes == 107 and any("litter" in f for f in r.failures), r.failures


def test_a_half_deleted_checkpoint_is_litter(soak, scratch):
    """A pruning killed inside its rmtree: the folder keeps its marker and some files, so it is neither resumed
    (incomplete) nor pruned (only complete ones are)."""
    out, ref, n = scratch
    half = out / "checkpoints" / "step-00000001"
    shutil.copytree(complete_checkpoints(out)[-1], half)
    (half / "model.safetensors").unlink()
    r = soak.check(out, ref, n)
    assert r.litter == {"checkpoints/step-00000001": soak._size(half)} and r.litter_bytes > 0, r.failures


def test_a_checkpoint_that_looks_complete_but_does_not_load_fails(soak, scratch):
    out, ref, n = scratch
    newest = complete_checkpoints(out)[-1]
    model = newest / "model.safetensors"
    model.write_bytes(b"\xff" * model.stat().st_size)  # the manifest's size, garbage inside
    assert is_complete(newest)  # the marker's sizes alone cannot tell; its sha256 can
    r = soak.check(out, ref, n)
    assert any(f"{newest.name}/model.safetensors does not load" in f for f in r.failures), r.failures
    assert any(f"{newest.name} does not verify: model.safetensors: its sha256" in f for f in r.failures), r.failures


def test_a_checkpoint_without_a_ranks_rng_state_fails(soak, scratch):
    out, ref, n = scratch
    newest = complete_checkpoints(out)[-1]
    (newest / "random_states_1.pkl").unlink()  # sealed before rank 1 wrote: the manifest would not list it
    marker = json.loads((newest / COMPLETE_MARKER).read_text())
    del marker["files"]["random_states_1.pkl"], marker["sha256"]["random_states_1.pkl"]
    (newest / COMPLETE_MARKER).write_text(json.dumps(marker))
    assert is_complete(newest)
    r = soak.check(out, ref, n)
    assert any("rank 1's RNG state" in f for f in r.failures), r.failures


def test_final_weights_beyond_the_tolerance_fail(soak, scratch):
    from safetensors.torch import load_file, save_file

    out, ref, n = scratch
    path = out / "final" / "model.safetensors"
    weights = load_file(str(path))
    name = sorted(weights)[0]
    weights[name].view(-1)[0] += 10 * soak.TOLERANCE
    save_file(weights, str(path), metadata={"format": "pt"})
    r = soak.check(out, ref, n)
    assert r.max_diff is not None and r.max_diff > soak.TOLERANCE
    assert any("final weights differ" in f for f in r.failures), r.failures


def test_a_resume_that_skips_a_step_fails(soak, soaked, tmp_path):
    """The uninterrupted run cut back to its checkpoint at step n-2, renamed step n-1 (marker too): the resume
    trains step n only, so step n-1 is never trained or logged.  Even this late in the cosine schedule (lr near 0)
    the one missing step moves the weights by ~7e-6, over the tolerance."""
    root, r = soaked
    n = r.max_steps
    out = tmp_path / "skipped"
    shutil.copytree(root / "uninterrupted", out)
    shutil.rmtree(out / "final")
    (out / ".prefzoo-finished.json").unlink()
    shutil.rmtree(out / "checkpoints" / f"step-{n:08d}")
    ckpt = out / "checkpoints" / f"step-{n - 2:08d}"
    marker = json.loads((ckpt / COMPLETE_MARKER).read_text())
    (ckpt / COMPLETE_MARKER).write_text(json.dumps({**marker, "step": n - 1}))
    ckpt.rename(out / "checkpoints" / f"step-{n - 1:08d}")
    (out / "metrics.jsonl").write_text("".join(x for x in _lines(out) if json.loads(x).get("step", 0) <= n - 2))
    log = tmp_path / "resume.log"
    soak.finish(soak.start(soak.train_args(out, n, SEED), log, faults=False), log, "the resume")
    assert f"at step {n - 1}" in log.read_text()
    c = soak.check(out, root / "uninterrupted", n)
    assert c.steps_lost == 1 and any(f"steps lost: [{n - 1}]" in f for f in c.failures), c.failures
    assert any("final weights differ" in f for f in c.failures), c.failures


def test_the_kill_leaves_no_rank_behind(soak):
    """torchrun puts each rank in a session of its own: a SIGKILL to torchrun's process group alone leaves the ranks
    running (shown first, on a torchrun of ``sleep``); the soak's kill ends every process of the run."""

    def _is_sleep(pid):  # a rank, not a helper torchrun runs for a moment while it starts
        try:
            return (Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[0]).endswith(b"sleep")
        except OSError:
            return False

    def launch():
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", "--no-python",
               "sleep", "300"]  # fmt: skip
        proc = subprocess.Popen(cmd, env=soak._env(False), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                start_new_session=True)  # fmt: skip
        t0 = time.monotonic()
        while len(ranks := [p for p in descendants(proc.pid) if _is_sleep(p) and alive(p)]) < 2:
            assert time.monotonic() - t0 < 120 and proc.poll() is None, "torchrun did not start its 2 ranks"
            time.sleep(0.1)
        return proc, ranks

    proc, ranks = launch()
    try:
        os.killpg(proc.pid, signal.SIGKILL)  # torchrun's group only
        proc.wait()
        time.sleep(0.5)
        assert all(alive(p) for p in ranks)  # the ranks outlive it
    finally:
        for pid in ranks:  # ours: end them by their ids
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
    proc, ranks = launch()
    assert kill_run(proc) == []
    assert not any(alive(p) for p in ranks)


def test_leftovers_of_a_killed_rewrite_and_a_killed_pruning_are_removed_by_the_next_run(soak, soaked, tmp_path):
    """The states a SIGKILL leaves when it lands in the resume's rewrite of ``metrics.jsonl`` (caught by polling for
    the temp file and killing the run then: 24 kB left) and in a pruning's ``rmtree`` (the long soak, seed 1), made
    here without the timing, then resumed to the end: the soak's litter check must find nothing."""
    root, r = soaked
    n = r.max_steps
    out = tmp_path / "killed-in-rewrite-and-pruning"
    shutil.copytree(root / "uninterrupted", out)
    shutil.rmtree(out / "final")
    (out / ".prefzoo-finished.json").unlink()
    shutil.rmtree(out / "checkpoints" / f"step-{n:08d}")  # the resume starts at n-2 and drops 2 records
    kept = [x for x in _lines(out) if json.loads(x).get("step", 0) <= n - 2]
    (out / ".metrics.jsonl.tmp99999").write_text("".join(kept))  # written, not yet renamed when the kill came
    half = out / "checkpoints" / f"step-{n - 4:08d}"  # pruned when step n-2 was saved; its rmtree cut short
    shutil.copytree(out / "checkpoints" / f"step-{n - 2:08d}", half)
    (half / "model.safetensors").unlink()
    log = tmp_path / "resume.log"
    soak.finish(soak.start(soak.train_args(out, n, SEED), log, faults=False), log, "the resume")
    c = soak.check(out, root / "uninterrupted", n)
    assert c.steps_lost == 0 and c.max_diff is not None and c.max_diff <= soak.TOLERANCE, c.failures
    assert c.litter == {}, c.failures
