"""Distributed gather correctness on multi-process CPU (gloo), before any GPU run.

For every batch-coupled loss (MMPO family, AOT; mml and mmpo-list on K = 4 groups): a batch sharded across 2 and 4
spawned processes (uneven shards with a shard of 1, and equal shards), with
prefzoo.testing.gloo_gather as the hook, gives per-example losses equal to one
process on the full batch; Σ over ranks of ∇θ Σ_shard L equals ∇θ Σ L; and with
equal shards the rank-averaged gradient of each shard's mean loss equals the
single-process gradient of the mean loss.  The same through the production gather,
prefzoo.train.engines.accelerator.make_gather (uneven shards with a shard of one, and equal shards with the mean-loss
gradient), under `accelerate launch --multi_gpu --num_processes N` with Accelerator(cpu=True).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

import pytest
import torch

from tests.distributed import _workers as W
from tests.distributed._spawn import free_port, spawn

pytestmark = pytest.mark.distributed
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
WORLDS = [int(w) for w in os.environ.get("PREFZOO_DIST_WORLDS", "2,4").split(",") if w]


def _compare(res, ref, tol=1e-10, check_mean=False):
    assert set(res) == set(ref) and res, (sorted(res), sorted(ref))
    for name in ref:
        torch.testing.assert_close(res[name]["losses"], ref[name]["losses"], rtol=tol, atol=tol, msg=name)
        torch.testing.assert_close(res[name]["grad_sum"], ref[name]["grad_sum"], rtol=tol, atol=tol, msg=name)
        if check_mean:
            torch.testing.assert_close(res[name]["grad_mean"], ref[name]["grad_mean"], rtol=tol, atol=tol, msg=name)


@pytest.mark.parametrize("world", WORLDS)
def test_gloo_shards_equal_single_process(world, tmp_path):
    spawn(W.gloo_worker, world, str(tmp_path))
    out = torch.load(tmp_path / f"gloo_{world}.pt")
    assert out["uneven"]["sizes"][0] == 1 and sum(out["uneven"]["sizes"]) == W.B_UNEVEN
    assert len(set(out["uneven"]["sizes"])) > 1 or world == 2
    _compare(out["uneven"]["res"], W.single_process(W.B_UNEVEN))
    _compare(out["equal"]["res"], W.single_process(3 * world), check_mean=True)


def test_local_normalization_would_differ():
    """Without the gather (each rank normalizing its own shard) the losses differ: the test above can fail."""
    from prefzoo.testing import split_sizes

    ref = W.single_process(W.B_UNEVEN)
    sizes = split_sizes(W.B_UNEVEN, 2)
    local = [W.rank_results(r, 2, lambda t: t, W.B_UNEVEN, sizes) for r in range(2)]
    for name in ("mmpo-no-aux", "aot", "mml", "mmpo-list"):  # the list losses on K = 4 groups
        got = torch.cat([loc[name]["losses"] for loc in local])
        assert float((got - ref[name]["losses"]).abs().max()) > 1e-6, name


@pytest.mark.parametrize("world", WORLDS)
def test_accelerate_gather_multi_cpu(world, tmp_path):
    exe = shutil.which("accelerate", path=os.path.dirname(sys.executable)) or shutil.which("accelerate")
    if exe is None:
        pytest.skip("accelerate is not installed (the [train] extra)")
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": ROOT, "MASTER_PORT": str(free_port())}
    cmd = [exe, "launch", "--multi_gpu", "--num_processes", str(world), "--num_machines", "1",
           "--mixed_precision", "no", "--dynamo_backend", "no", "--main_process_port", env["MASTER_PORT"],
           os.path.join(ROOT, "tests", "distributed", "_workers.py"), str(tmp_path)]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300, cwd=ROOT)
    path = tmp_path / f"accelerate_{world}.pt"
    assert path.exists(), f"rc={proc.returncode}\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    out = torch.load(path)
    assert out["world"] == world and "MULTI_CPU" in out["distributed_type"], out["distributed_type"]
    assert out["uneven"]["sizes"][0] == 1 and sum(out["uneven"]["sizes"]) == W.B_UNEVEN
    _compare(out["uneven"]["res"], W.single_process(W.B_UNEVEN))
    _compare(out["equal"]["res"], W.single_process(3 * world), check_mean=True)
