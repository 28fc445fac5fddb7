"""Which checkpoint resumes where: the examples per step, a batch-coupled loss's micro-batch, the engine pair."""

from __future__ import annotations

from pathlib import Path

import pytest

from prefzoo.train.checkpoint import ResumeError, check_resumable
from prefzoo.train.config import TrainConfig
from prefzoo.train.engines import Engine, engine_for, resume_refusal
from prefzoo.train.engines.fsdp import FsdpEngine

CKPT = Path("out/checkpoints/step-00000002")


def marker(engine: Engine, processes: int, per_device: int, accum: int, seed: int = 0) -> dict:
    return {"seed": seed, "batch": [processes, per_device, accum], **engine.marker(processes)}


DDP = Engine(TrainConfig(model="m"))
FSDP = FsdpEngine(TrainConfig(model="m", fsdp=True))


def test_the_examples_per_step_must_match_and_the_layout_may_change():
    check_resumable(CKPT, marker(DDP, 2, 2, 1), marker(DDP, 1, 4, 1), batch_coupled=False)
    check_resumable(CKPT, marker(DDP, 2, 2, 1), marker(FSDP, 4, 1, 1), batch_coupled=False)
    check_resumable(CKPT, marker(FSDP, 2, 2, 1), marker(DDP, 1, 2, 2), batch_coupled=False)
    with pytest.raises(ResumeError, match=r"checkpoint trained 4 examples per step \(2 processes × 2 per device × 1 "
                       r"accumulation\), this run 8 .* = 4$"):  # fmt: skip
        check_resumable(CKPT, marker(DDP, 2, 2, 1), marker(DDP, 2, 4, 1), batch_coupled=False)
    with pytest.raises(ResumeError, match="checkpoint used seed 0, this run 1"):
        check_resumable(CKPT, marker(DDP, 2, 2, 1), marker(DDP, 2, 2, 1, seed=1), batch_coupled=False)


def test_a_batch_coupled_loss_keeps_the_micro_batch():
    check_resumable(CKPT, marker(DDP, 2, 2, 1), marker(DDP, 1, 4, 1), batch_coupled=True)
    with pytest.raises(ResumeError, match=r"keep processes × per-device batch = 4 \(--grad-accum 1\)"):
        check_resumable(CKPT, marker(DDP, 2, 2, 1), marker(DDP, 1, 2, 2), batch_coupled=True)


def test_deepspeed_and_per_rank_checkpoints_resume_only_where_written():
    zero3 = engine_for(TrainConfig(model="m", deepspeed="zero3"))
    assert resume_refusal(marker(zero3, 2, 2, 1), marker(zero3, 2, 2, 1)) is None
    for run in (marker(zero3, 1, 4, 1), marker(DDP, 2, 2, 1), marker(FSDP, 2, 2, 1)):
        assert "DeepSpeed's checkpoints resume here on the same engine" in resume_refusal(marker(zero3, 2, 2, 1), run)
    assert "DeepSpeed's" in resume_refusal(marker(DDP, 2, 2, 1), marker(zero3, 2, 2, 1))
    local = FsdpEngine(TrainConfig(model="m", fsdp=True))
    local.node_local = True
    assert local.checkpoint_format == "per-rank" and FSDP.checkpoint_format == "dcp"
    assert resume_refusal(marker(local, 2, 2, 1), marker(local, 2, 2, 1)) is None
    assert "saved per rank on node-local disks" in resume_refusal(marker(local, 2, 2, 1), marker(local, 4, 1, 1))
    assert "saved per rank on node-local disks" in resume_refusal(marker(local, 2, 2, 1), marker(DDP, 2, 2, 1))


def test_a_marker_without_an_engine_resumes_as_before():
    assert resume_refusal({"batch": [2, 2, 1], "seed": 0}, marker(FSDP, 4, 1, 1)) is None
