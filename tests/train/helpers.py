"""Running the trainer in-process or in spawned processes, and comparing parameters."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import torch

from tests.support import free_port

HERE = Path(__file__).parent


def base_config(model_dir: Path, data: Path, out: Path, **kw: Any) -> dict[str, Any]:
    cfg = {
        "loss": "dpo",
        "model": str(model_dir),
        "dataset": str(data),
        "lr": 1e-3,
        "max_steps": 3,
        "per_device_batch_size": 4,
        "grad_accum": 1,
        "output_dir": str(out),
        "report_to": "none",
        "progress": False,
        "eval_fraction": 0.0,
        "seed": 0,
    }
    cfg.update(kw)
    return cfg


def run_inprocess(cfg: dict[str, Any], callbacks: list[Any] = ()):
    from prefzoo.train.config import TrainConfig
    from prefzoo.train.loop import train

    return train(TrainConfig.from_dict(cfg), callbacks=callbacks)


def run_processes(cfg: dict[str, Any], nproc: int, timeout: int = 900, launcher: str = "torchrun") -> dict[str, Any]:
    """Train in ``nproc`` fresh processes (torchrun or accelerate launch; gloo on CPU); returns rank 0's result."""
    env = {
        **os.environ,
        "OMP_NUM_THREADS": "1",
        "DS_ACCELERATOR": "cpu",
        "HF_HUB_OFFLINE": "1",
        "HF_DATASETS_OFFLINE": "1",
        "PYTHONPATH": str(HERE.parents[1]),
    }
    if launcher == "accelerate":  # --cpu would start ONE process (PLATFORM.md): --multi_gpu + Accelerator(cpu=True)
        cmd = [
            sys.executable,
            "-m",
            "accelerate.commands.launch",
            "--multi_gpu",
            f"--num_processes={nproc}",
            "--num_machines=1",
            "--mixed_precision=no",
            "--dynamo_backend=no",
            f"--main_process_port={free_port()}",
        ]
    else:
        cmd = [
            sys.executable,
            "-m",
            "torch.distributed.run",
            f"--nproc_per_node={nproc}",
            "--standalone",  # binds a free port itself: no race with a second copy of the suite
        ]
    cmd += [str(HERE / "worker.py"), json.dumps(cfg)]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout)
    if proc.returncode != 0:
        raise AssertionError(f"worker failed ({proc.returncode}):\n{proc.stdout[-3000:]}\n{proc.stderr[-5000:]}")
    return torch.load(Path(cfg["output_dir"]) / "worker_result.pt", weights_only=True)


def max_param_diff(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    assert a.keys() == b.keys()
    return max(float((a[k].float() - b[k].float()).abs().max()) for k in a)


def params_of(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.detach().cpu().float().clone() for k, v in model.state_dict().items()}
