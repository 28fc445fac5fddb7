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
from prefzoo.train.engines import EngineSettings
from prefzoo.train.engines.fsdp import FsdpEngine, mesh_shape
from tests.distributed._nodes import free_port
from tests.train.helpers import base_config, max_param_diff

HERE = Path(__file__).parent
WORLDS = [int(w) for w in os.environ.get("PREFZOO_DIST_WORLDS", "2,4").split(",") if w]


def _train(cfg: dict[str, Any], nproc: int, nodes: int = 1) -> dict[str, Any]:
    """``nproc`` ranks in one ``torchrun --standalone``, or as ``nodes`` simulated nodes: one torchrun per node rank
    over loopback with ``nproc / nodes`` processes (so LOCAL_WORLD_SIZE is the processes per node), each node its
    own output dir ``node-R/`` (one machine's output dir is locked by one run: node-local disks)."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "PYTHONPATH": str(HERE.parents[1])}
    run = [sys.executable, "-m", "torch.distributed.run"]
    out = Path(cfg["output_dir"])
    if nodes == 1:
        cmds, outs = [[*run, f"--nproc_per_node={nproc}", "--standalone"]], [out]
    else:
        port, outs = free_port(), [out / f"node-{r}" for r in range(nodes)]
        cmds = [[*run, f"--nnodes={nodes}", f"--node_rank={r}", f"--nproc_per_node={nproc // nodes}",
                 "--master_addr=127.0.0.1", f"--master_port={port}"] for r in range(nodes)]  # fmt: skip
    worker = str(HERE / "_fsdp_worker.py")
    procs = [
        subprocess.Popen([*c, worker, json.dumps({**cfg, "output_dir": str(o)})], env=env, text=True,
                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        for c, o in zip(cmds, outs, strict=True)
    ]  # fmt: skip
    try:
        logs = [p.communicate(timeout=900)[0] for p in procs]
    finally:  # a node that failed leaves the others waiting in a collective: end them with the test
        for p in procs:
            if p.poll() is None:
                p.kill()
    assert [p.returncode for p in procs] == [0] * nodes, "\n".join(log[-4000:] for log in logs)
    result = torch.load(outs[0] / "worker_result.pt", weights_only=True)
    per_node = nproc // nodes
    result["shards"] = [json.loads((outs[r // per_node] / f"shards-{r}.json").read_text()) for r in range(nproc)]
    result["log"] = "\n".join(logs)
    return result


@pytest.fixture(scope="module")
def runs(tmp_path_factory, tiny_dir, pairs_file):
    cache: dict[tuple[Any, ...], dict[str, Any]] = {}

    def run(world: int, name: str = "", nodes: int = 1, **kw: Any) -> dict[str, Any]:
        # the same batch layout on both engines: "auto" picks prompt sharing / packing under DDP and never under FSDP,
        # and LoRA's dropout masks follow the layout (equal in distribution, not bit for bit)
        kw = {"share_prompt": "off", "packing": "off", "group_by_length": "off", **kw}
        key = (world, name, nodes, tuple(sorted(kw.items())))
        if key not in cache:
            out = tmp_path_factory.mktemp(f"fsdp-{world}-{name or 'run'}")
            cache[key] = _train(base_config(tiny_dir, pairs_file, out, **kw), world, nodes)
            cache[key]["out"] = out
        return cache[key]

    return run


def _assert_sharded(shards: list[dict[str, list[Any]]], world: int) -> None:
    """Every parameter is a DTensor on every rank, holding a dim-0 slice; the slices add up to the whole."""
    for name, (_, _, full, _) in shards[0].items():
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
    files = sorted(os.listdir(tmp_path / "out" / "checkpoints" / "step-00000002" / "dcp"))
    assert files == [".metadata", "__0_0.distcp", "__1_0.distcp"]  # torch's Distributed Checkpoint, one file a rank
    resumed = _train({**cfg, "resume": "auto"}, 2)
    assert "resumed from" in resumed["log"] and resumed["step"] == 3
    diff = max_param_diff(resumed["params"], whole["params"])
    assert diff <= 1e-6, diff


def test_fsdp_where_it_cannot_apply_is_one_line(tmp_path):
    cfg = EngineSettings.of(TrainConfig(model="m", fsdp=True))
    with pytest.raises(ConfigError, match="--fsdp with one process has nothing to shard"):
        FsdpEngine(cfg).check(1, no_gpu=True)
    with pytest.raises(ConfigError, match="choose one sharding engine"):
        engine = FsdpEngine(EngineSettings.of(TrainConfig(model="m", fsdp=True, deepspeed="zero3")))
        engine.check(2, no_gpu=True)
    with pytest.raises(ConfigError, match="--fsdp-cpu-offload without a GPU"):
        engine = FsdpEngine(EngineSettings.of(TrainConfig(model="m", fsdp=True, fsdp_cpu_offload=True)))
        engine.check(2, no_gpu=True)
    with pytest.raises(ConfigError, match="fsdp_sharding='zero3': choose full, shard_grad_op or hybrid"):
        TrainConfig(model="m", fsdp=True, fsdp_sharding="zero3")
    FsdpEngine(cfg).check(2, no_gpu=True)  # two processes on CPU: fine


@pytest.mark.distributed
@pytest.mark.slow
@pytest.mark.skipif(4 not in WORLDS, reason="two simulated nodes of 2 ranks: run in the dist-4 env")
def test_hybrid_on_two_nodes_equals_ddp_sharded_in_node_replicated_across(runs):
    """HSDP on 2 simulated nodes × 2 ranks: the shard groups are the nodes (from LOCAL_WORLD_SIZE), replicas equal."""
    ddp = runs(4, loss="dpo", lora=False)
    hybrid = runs(4, nodes=2, loss="dpo", lora=False, fsdp=True, fsdp_sharding="hybrid")
    assert "FSDP2 (hybrid sharding)" in hybrid["log"] and "2 ranks, replicated 2× (4 processes)" in hybrid["log"]
    assert hybrid["step"] == ddp["step"] == 3
    diff = max_param_diff(ddp["params"], hybrid["params"])
    assert diff <= 1e-5, diff
    shards = hybrid["shards"]
    for name, (_, _, full, placements) in shards[0].items():
        assert {s[name][0] for s in shards} == {"DTensor"} and placements == ["R", "S(0)"], name
        rows = [s[name][1][0] if s[name][1] else 0 for s in shards]  # ranks 0, 1 = node 0; ranks 2, 3 = node 1
        assert rows[0] + rows[1] == full[0] and rows[0] < full[0], (name, rows, full)  # sharded within a node
        assert rows[:2] == rows[2:], (name, rows)  # the same slices on the other node: replicated across nodes


def test_hybrid_mesh_shape_from_the_node_size_or_a_one_line_error(monkeypatch):
    hybrid = EngineSettings.of(TrainConfig(model="m", fsdp=True, fsdp_sharding="hybrid"))
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")
    assert mesh_shape(hybrid, 4) == (2, 2) and mesh_shape(hybrid, 2) == (1, 2)
    assert mesh_shape(TrainConfig(model="m", fsdp=True), 4) == (4,)
    assert mesh_shape(TrainConfig(model="m", fsdp=True, fsdp_sharding="hybrid", fsdp_shard_size=4), 8) == (2, 4)
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "3")  # 3 processes per node cannot tile 4
    with pytest.raises(ConfigError, match=r"shard groups of 3 processes per node \(LOCAL_WORLD_SIZE\) do not divide"):
        FsdpEngine(hybrid).check(4, no_gpu=True)
    odd = EngineSettings.of(TrainConfig(model="m", fsdp=True, fsdp_sharding="hybrid", fsdp_shard_size=3))
    with pytest.raises(ConfigError, match="--fsdp-shard-size 3 do not divide the 4 processes: set --fsdp-shard-size"):
        FsdpEngine(odd).check(4, no_gpu=True)
    with pytest.raises(ConfigError, match="it sizes the shard groups of --fsdp-sharding hybrid"):
        engine = FsdpEngine(EngineSettings.of(TrainConfig(model="m", fsdp=True, fsdp_shard_size=2)))
        engine.check(2, no_gpu=True)
    with pytest.raises(ConfigError, match="fsdp_shard_size=0 must be >= 1"):
        TrainConfig(model="m", fsdp=True, fsdp_sharding="hybrid", fsdp_shard_size=0)


def test_resume_on_another_mesh_is_one_line(tmp_path):
    """Shards saved as 2 nodes × 2 ranks cannot be put back on a 1-D mesh of 4 (same world size, other slices)."""
    from types import SimpleNamespace

    from prefzoo.train.engines.fsdp import FsdpEngine

    path = FsdpEngine._file(tmp_path, 0)
    path.parent.mkdir(parents=True)
    torch.save({"model": {}, "optim": {}, "mesh": [2, 2]}, path)
    engine = SimpleNamespace(_file=FsdpEngine._file, accelerator=SimpleNamespace(process_index=0))
    with pytest.raises(ConfigError, match=r"saved on a device mesh of \[2, 2\] .* this run's is \[4\]: resume with"):
        FsdpEngine._load_rank_file(SimpleNamespace(**vars(engine), mesh=SimpleNamespace(shape=(4,))), None, None,
                                   tmp_path)
