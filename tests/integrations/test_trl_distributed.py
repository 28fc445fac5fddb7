"""Two gloo processes through the adapter equal one process with the same global batch, for a batch-coupled loss.

``mmpo-no-aux`` min-max normalizes its rewards over the batch gathered from every process (TRL's accelerator), so a
per-process normalization would weight the pairs differently (plain ``mmpo``'s gradient, −∇s_w, does not depend on
the normalization, so it could not tell): the parameters after 3 steps would not match.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from tests.integrations.trl_support import make_pairs, make_unpaired, max_rel_diff, train

pytestmark = [pytest.mark.distributed]

HERE = Path(__file__).resolve().parent


def _run(model_dir: Path, out: Path, nproc: int, per_device: int, loss: str, kind: str = "dpo") -> dict:
    out.mkdir(parents=True, exist_ok=True)
    spec = {"model_dir": str(model_dir), "out": str(out), "pairs": 24, "per_device": per_device, "loss": loss,
            "kind": kind}  # fmt: skip
    cmd = [sys.executable, "-m", "torch.distributed.run", f"--nproc_per_node={nproc}", "--standalone",
           str(HERE / "trl_worker.py"), json.dumps(spec)]  # fmt: skip
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return torch.load(out / "result.pt", weights_only=False)


def test_two_processes_equal_one_with_the_same_global_batch(trl_model_dir, start_params, tmp_path):
    two = _run(trl_model_dir, tmp_path / "two", 2, 2, "mmpo-no-aux")
    params, log, _ = train(trl_model_dir, tmp_path / "one", make_pairs(24, seed=3), adapter=True, loss="mmpo-no-aux",
                           per_device_train_batch_size=4, train_sampling_strategy="sequential")  # fmt: skip
    one = {"params": params, "log": log}
    assert two["world"] == 2
    diff = max_rel_diff(two["params"], one["params"], start_params)
    assert diff <= 1e-5, diff  # measured 1.5e-6 (the fused LM head accumulates its gradients in float32)
    losses = [(a["loss"], b["loss"]) for a, b in zip(two["log"], one["log"], strict=True) if "loss" in a]
    assert len(losses) == 3 and all(a == pytest.approx(b, rel=1e-5) for a, b in losses), losses
    for key in ("mmpo/reward_min", "mmpo/reward_max", "rewards/margins"):  # gathered: the whole global batch
        assert two["log"][-2][key] == pytest.approx(one["log"][-2][key], rel=1e-5), key


def test_bco_through_kto_trainer_on_two_processes_equals_one(trl_model_dir, start_params, tmp_path):
    """BCO's running reward mean δ advances from the rewards of every process (gathered), so 2 processes × 2 examples
    train as 1 × 4; a per-process mean would give each process its own δ and different parameters (measured 0.12
    relative; gathered 5e-7). The first global batch holds one label only, so TRL's metrics skip that side's rewards
    and rewards/margins there, as TRL's own trainer does."""
    two = _run(trl_model_dir, tmp_path / "two", 2, 2, "bco", kind="kto")
    params, log, _ = train(trl_model_dir, tmp_path / "one", make_unpaired(24, seed=3), adapter=True, loss="bco",
                           kind="kto", per_device_train_batch_size=4)  # fmt: skip
    assert two["world"] == 2
    diff = max_rel_diff(two["params"], params, start_params)
    assert diff <= 1e-5, diff
    assert two["log"][-2]["bco/delta"] == pytest.approx(log[-2]["bco/delta"], rel=1e-5)
    assert "rewards/margins" not in log[0] and "rewards/margins" in log[-2]  # step 1's batch: one label
