"""``--fsdp`` (FSDP2 on gloo): equal to DDP after 3 steps, parameters are DTensor shards, exact resume, a plain final.

Each case trains the tests' tiny Llama for 3 steps in fresh torchrun processes (tests/distributed/_fsdp_worker.py
gathers the parameters in ``on_train_end`` and writes each rank's shard shapes).  Runs are cached per module, so the
uninterrupted FSDP ``dpo`` run is also the reference of the resume test.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

from prefzoo.train.config import ConfigError, TrainConfig
from prefzoo.train.fsdp import check_fsdp
from tests.train.helpers import base_config, max_param_diff

HERE = Path(__file__).parent
WORLDS = [int(w) for w in os.environ.get("PREFZOO_DIST_WORLDS", "2,4").split(",") if w]


def _train(cfg: dict[str, Any], nproc: int) -> dict[str, Any]:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "PYTHONPATH": str(HERE.parents[1])}
    cmd = [sys.executable, "-m", "torch.distributed.run", f"--nproc_per_node={nproc}", "--standalone",
           str(HERE / "_fsdp_worker.py"), json.dumps(cfg)]  # fmt: skip
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, f"{proc.stdout[-3000:]}\n{proc.stderr[-5000:]}"
    out = Path(cfg["output_dir"])
    result = torch.load(out / "worker_result.pt", weights_only=True)
    result["shards"] = [json.loads((out / f"shards-{r}.json").read_text()) for r in range(nproc)]
    result["log"] = proc.stdout + proc.stderr
    return result


@pytest.fixture(scope="module")
def runs(tmp_path_factory, tiny_dir, pairs_file):
    cache: dict[tuple[Any, ...], dict[str, Any]] = {}

    def run(world: int, name: str = "", **kw: Any) -> dict[str, Any]:
        key = (world, name, tuple(sorted(kw.items())))
        if key not in cache:
            out = tmp_path_factory.mktemp(f"fsdp-{world}-{name or 'run'}")
            cache[key] = _train(base_config(tiny_dir, pairs_file, out, **kw), world)
            cache[key]["out"] = out
        return cache[key]

    return run


def _assert_sharded(shards: list[dict[str, list[Any]]], world: int) -> None:
    """Every parameter is a DTensor on every rank, holding a dim-0 slice; the slices add up to the whole."""
    for name, (_, _, full) in shards[0].items():
        kinds = {s[name][0] for s in shards}
        assert kinds == {"DTensor"}, (name, kinds)
        rows = [s[name][1][0] if s[name][1] else 0 for s in shards]
        assert sum(rows) == full[0] and max(rows) < full[0], (name, rows, full)


@pytest.mark.distributed
@pytest.mark.slow
@pytest.mark.parametrize("world", WORLDS)
@pytest.mark.parametrize(
    ("loss", "lora"), [("dpo", False), ("mmpo-no-aux", False), ("dpo", True)], ids=["dpo", "mmpo-no-aux", "dpo-lora"]
)  # reference loss; batch-coupled (gathers); LoRA
def test_fsdp_equals_ddp_and_shards(runs, tiny_dir, world, loss, lora):
    kw: dict[str, Any] = {"loss": loss, "lora": lora, **({"lr": 1e-2} if lora else {})}
    ddp, fsdp = runs(world, **kw), runs(world, fsdp=True, **kw)
    assert "FSDP2 (full sharding)" in fsdp["log"] and "FSDP2" not in ddp["log"]
    assert fsdp["step"] == ddp["step"] == 3
    diff = max_param_diff(ddp["params"], fsdp["params"])
    assert diff <= 1e-5, diff
    if lora:  # it trained: the adapter's B matrices start at zero
        assert max(float(v.abs().max()) for k, v in fsdp["params"].items() if "lora_B" in k) > 1e-4
    else:
        from transformers import AutoModelForCausalLM

        start = {n: p.detach().float() for n, p in AutoModelForCausalLM.from_pretrained(tiny_dir).named_parameters()}
        assert max_param_diff(start, fsdp["params"]) > 1e-4
    _assert_sharded(fsdp["shards"], world)


@pytest.mark.distributed
@pytest.mark.slow
@pytest.mark.skipif(2 not in WORLDS, reason="run once, with 2 ranks")
def test_fsdp_resume_equals_uninterrupted_and_final_loads(runs, tiny_dir, pairs_file, tmp_path):
    from transformers import AutoModelForCausalLM

    whole = runs(2, fsdp=True, loss="dpo", lora=False)
    final = AutoModelForCausalLM.from_pretrained(whole["out"] / "final")  # a plain HF folder, gathered on rank 0
    loaded = {n: p.detach().float() for n, p in final.named_parameters()}
    assert max_param_diff(loaded, whole["params"]) == 0.0

    cfg = base_config(tiny_dir, pairs_file, tmp_path / "out", loss="dpo", fsdp=True, save_steps=1)
    _train({**cfg, "stop_after_steps": 2}, 2)
    files = sorted(os.listdir(tmp_path / "out" / "checkpoints" / "step-00000002" / "fsdp"))
    assert files == ["rank-00000.pt", "rank-00001.pt"]
    resumed = _train({**cfg, "resume": "auto"}, 2)
    assert "resumed from" in resumed["log"] and resumed["step"] == 3
    diff = max_param_diff(resumed["params"], whole["params"])
    assert diff <= 1e-6, diff


def test_fsdp_where_it_cannot_apply_is_one_line(tmp_path):
    cfg = TrainConfig(model="m", fsdp=True)
    with pytest.raises(ConfigError, match="--fsdp with one process has nothing to shard"):
        check_fsdp(cfg, 1, no_gpu=True)
    with pytest.raises(ConfigError, match="choose one sharding engine"):
        check_fsdp(TrainConfig(model="m", fsdp=True, deepspeed="zero3"), 2, no_gpu=True)
    with pytest.raises(ConfigError, match="--fsdp-cpu-offload without a GPU"):
        check_fsdp(TrainConfig(model="m", fsdp=True, fsdp_cpu_offload=True), 2, no_gpu=True)
    with pytest.raises(ConfigError, match="fsdp_sharding='hybrid': choose full or shard_grad_op"):
        TrainConfig(model="m", fsdp=True, fsdp_sharding="hybrid")
    check_fsdp(cfg, 2, no_gpu=True)  # two processes on CPU: fine
