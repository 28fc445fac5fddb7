"""Every registered loss trains on the embedded default task through the same loop; the CLI default finishes fast."""

from __future__ import annotations

import math
import os
import subprocess
import sys

import pytest
import torch

from prefzoo.registry import list_losses, loss_spec
from prefzoo.types import Shape
from tests.train.helpers import params_of

default = pytest.importorskip("prefzoo.data.default")
load_default_task = pytest.importorskip("prefzoo.model").load_default_task


@pytest.fixture(scope="module")
def task():
    return load_default_task(seed=0)


@pytest.mark.slow
# the trainer feeds pairs; unpaired losses train once the unpaired data path lands (helper "shapes")
@pytest.mark.parametrize("loss_name", [n for n in list_losses() if loss_spec(n).accepts(Shape.PAIR)])
def test_every_loss_trains_on_the_default_task(tmp_path, task, loss_name):
    from prefzoo.train.config import TrainConfig
    from prefzoo.train.loop import train

    settings = {**task.recommended, "epochs": 1, "max_steps": 2, "lr": 1e-3}
    cfg = TrainConfig.from_dict(
        {
            **settings,
            "loss": loss_name,
            "model": str(task.model_dir),
            "output_dir": str(tmp_path),
            "report_to": "none",
            "progress": False,
        }
    )
    before = params_of(task.load_model())
    res = train(cfg, train_dataset=task.train.select(range(32)), eval_dataset=task.eval.select(range(16)))
    assert res.global_step == 2 and all(math.isfinite(h["loss"]) for h in res.history)
    after = params_of(res.model)
    moved = sum(not torch.equal(before[k], after[k]) for k in before)
    assert moved == len(before), f"{loss_name}: {len(before) - moved} tensors not updated"
    assert 0.0 <= res.evals[-1]["eval/reward_accuracy"] <= 1.0


@pytest.mark.slow
def test_cli_default_run_prints_the_report(tmp_path, task):
    """The README's first command end to end (its time is measured in docs/training.md, not asserted: a busy
    machine is slow, not wrong)."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}
    proc = subprocess.run(
        [sys.executable, "-m", "prefzoo", "train", "--loss", "mmpo", "--output-dir", str(tmp_path), "--no-progress"],
        env=env,
        capture_output=True,
        text=True,
        timeout=1800,  # a hang guard only
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = proc.stdout
    for row in ("eval reward accuracy", "win-rate vs start", "retention (skill B)"):
        assert row in out
    assert (tmp_path / "final" / "run_card.json").is_file()
