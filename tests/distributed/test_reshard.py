"""Resume anywhere: a checkpoint written by N processes resumes on M, and across engines (DDP ↔ FSDP2).

Every run trains the tests' tiny Llama with 4 examples per optimizer step (processes × per-device batch ×
accumulation), saving at every step.  A run stopped after step 2 resumes under another layout and must end where the
uninterrupted 2-process run ends (within the tolerance of a resume from a checkpoint: float summation order changes
with the layout) and train, step by step, exactly the examples it trained.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

from tests.train.helpers import base_config, max_param_diff

HERE = Path(__file__).parent
WORLDS = [int(w) for w in os.environ.get("PREFZOO_DIST_WORLDS", "2,4").split(",") if w]
TOL = 1e-5  # a resumed run against an uninterrupted one on another layout (measured: below 1e-6)
EXAMPLES_PER_STEP = 4


def _run(cfg: dict[str, Any], nproc: int) -> dict[str, Any]:
    """One ``torchrun --standalone`` of the worker: the final parameters and each step's example ids (all ranks)."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "PYTHONPATH": str(HERE.parents[1])}
    cmd = [sys.executable, "-m", "torch.distributed.run", f"--nproc_per_node={nproc}", "--standalone",
           str(HERE / "_reshard_worker.py"), json.dumps(cfg)]  # fmt: skip
    proc = subprocess.run(cmd, env=env, text=True, capture_output=True, timeout=900)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-4000:]
    out = Path(cfg["output_dir"])
    result = torch.load(out / "result.pt", weights_only=True)
    steps: dict[int, set[str]] = {}
    for rank in range(nproc):
        for step, ids in json.loads((out / f"ids-{rank}.json").read_text()).items():
            steps.setdefault(int(step), set()).update(ids)
    result["ids"], result["log"] = steps, proc.stdout + proc.stderr
    return result


def _layout(nproc: int, **kw: Any) -> dict[str, Any]:
    """Settings giving EXAMPLES_PER_STEP examples per step on ``nproc`` processes."""
    return {"per_device_batch_size": EXAMPLES_PER_STEP // nproc, "grad_accum": 1, **kw}


@pytest.fixture(scope="module")
def case(tmp_path_factory, tiny_dir, pairs_file):
    cache: dict[Any, dict[str, Any]] = {}
    common = {"loss": "dpo", "max_steps": 4, "save_steps": 1, "share_prompt": "off", "packing": "off",
              "group_by_length": "off"}  # fmt: skip

    def run(nproc: int, resume_from: Path | None = None, stop: int | None = None, **kw: Any) -> dict[str, Any]:
        key = (nproc, str(resume_from), stop, tuple(sorted(kw.items())))
        if key not in cache:
            out = tmp_path_factory.mktemp("reshard")
            if resume_from is not None:  # a copy of the stopped run's output dir, resumed under another layout
                shutil.rmtree(out)
                shutil.copytree(resume_from, out, ignore=shutil.ignore_patterns("*.lock"))
            cfg = base_config(tiny_dir, pairs_file, out, **common, **_layout(nproc, **kw))
            if stop is not None:
                cfg["stop_after_steps"] = stop
            if resume_from is not None:
                cfg["resume"] = "auto"
            cache[key] = {**_run(cfg, nproc), "out": out}
        return cache[key]

    return run


def _assert_continues(whole: dict[str, Any], resumed: dict[str, Any]) -> None:
    assert "resumed from" in resumed["log"] and resumed["step"] == whole["step"] == 4, resumed["log"][-2000:]
    assert sorted(resumed["ids"]) == [3, 4]  # the resumed run trains steps 3 and 4 only
    for step in (3, 4):  # the same examples, example by example: none seen twice, none skipped
        assert resumed["ids"][step] == whole["ids"][step], (step, resumed["ids"][step], whole["ids"][step])
    diff = max_param_diff(whole["params"], resumed["params"])
    assert diff <= TOL, diff


@pytest.mark.distributed
@pytest.mark.slow
@pytest.mark.skipif(2 not in WORLDS, reason="run once, in the dist-2 env")
@pytest.mark.parametrize(("saved", "resumed"), [("ddp", "fsdp"), ("fsdp", "ddp"), ("ddp", "one"), ("fsdp", "one")])
def test_a_checkpoint_resumes_on_another_engine_or_process_count(case, saved, resumed):
    whole = case(2)
    stopped = case(2, stop=2, fsdp=saved == "fsdp")
    assert len(whole["ids"][1]) == EXAMPLES_PER_STEP
    fmt = json.loads((stopped["out"] / "checkpoints" / "step-00000002" / "prefzoo_checkpoint.json").read_text())
    assert fmt["checkpoint_format"] == ("dcp" if saved == "fsdp" else "accelerate")
    nproc = 1 if resumed == "one" else 2
    _assert_continues(whole, case(nproc, resume_from=stopped["out"], fsdp=resumed == "fsdp"))


@pytest.mark.distributed
@pytest.mark.slow
@pytest.mark.skipif(4 not in WORLDS, reason="four ranks: run in the dist-4 env")
@pytest.mark.parametrize("saved", ["ddp", "fsdp"])
def test_a_two_process_checkpoint_resumes_on_four(case, saved):
    whole = case(2)
    stopped = case(2, stop=2, fsdp=saved == "fsdp")
    _assert_continues(whole, case(4, resume_from=stopped["out"], fsdp=saved == "fsdp"))
