"""Which checkpoint resumes where: the examples per step, a batch-coupled loss's micro-batch, the engine pair."""

from __future__ import annotations

from pathlib import Path

import pytest

from prefzoo.train.checkpoint import ResumeError, check_resumable, fit_batch_to_checkpoint
from prefzoo.train.checkpoint.resume import batch_fits
from prefzoo.train.config import TrainConfig
from prefzoo.train.engines import Engine, EngineSettings, engine_for, resume_refusal
from prefzoo.train.engines.fsdp import FsdpEngine

CKPT = Path("out/checkpoints/step-00000002")


def marker(engine: Engine, processes: int, per_device: int, accum: int, seed: int = 0) -> dict:
    return {"seed": seed, "batch": [processes, per_device, accum], **engine.marker(processes)}


DDP = Engine(EngineSettings.of(TrainConfig(model="m")))
FSDP = FsdpEngine(EngineSettings.of(TrainConfig(model="m", fsdp=True)))


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
    with pytest.raises(ResumeError, match=r"keep processes × per-device batch = 4: set --per-device-batch-size 4 "
                       r"--grad-accum 1$"):  # fmt: skip
        check_resumable(CKPT, marker(DDP, 2, 2, 1), marker(DDP, 1, 2, 2), batch_coupled=True)


def test_the_pairs_that_keep_the_examples_per_step_on_other_processes():
    assert batch_fits([2, 2, 1], 1, batch_coupled=False) == [(2, 2), (4, 1)]  # the checkpoint's batch kept first
    assert batch_fits([2, 2, 1], 4, batch_coupled=False) == [(1, 1)]
    assert batch_fits([2, 2, 1], 3, batch_coupled=False) == []  # 4 examples on 3 processes: nothing whole
    assert batch_fits([2, 2, 3], 1, batch_coupled=True) == [(4, 3)]  # the micro-batch of 4 kept
    assert batch_fits([2, 1, 2], 4, batch_coupled=True) == []


def test_the_batch_is_fitted_only_when_neither_flag_was_given():
    saved = marker(DDP, 2, 2, 1)
    opt = TrainConfig.from_dict({"model": "m"}).optimization
    assert "--per-device-batch-size 2 --grad-accum 2 keep them" in fit_batch_to_checkpoint(opt, False, saved, 1, False)
    assert (opt.per_device_batch_size, opt.grad_accum) == (2, 2)
    opt = TrainConfig.from_dict({"model": "m", "grad_accum": 1}).optimization
    assert fit_batch_to_checkpoint(opt, True, saved, 1, False) is None  # a flag chose the batch
    assert (opt.per_device_batch_size, opt.grad_accum) == (2, 1)
    same = TrainConfig.from_dict({"model": "m"}).optimization
    assert fit_batch_to_checkpoint(same, False, marker(DDP, 1, 2, 16), 1, False) is None  # nothing to change


def test_deepspeed_and_per_rank_checkpoints_resume_only_where_written():
    zero3 = engine_for(EngineSettings.of(TrainConfig(model="m", deepspeed="zero3")))
    assert resume_refusal(marker(zero3, 2, 2, 1), marker(zero3, 2, 2, 1)) is None
    for run in (marker(zero3, 1, 4, 1), marker(DDP, 2, 2, 1), marker(FSDP, 2, 2, 1)):
        assert "DeepSpeed's checkpoints resume here on the same engine" in resume_refusal(marker(zero3, 2, 2, 1), run)
    assert "DeepSpeed's" in resume_refusal(marker(DDP, 2, 2, 1), marker(zero3, 2, 2, 1))
    local = FsdpEngine(EngineSettings.of(TrainConfig(model="m", fsdp=True)))
    local.node_local = True
    assert local.checkpoint_format == "per-rank" and FSDP.checkpoint_format == "dcp"
    assert resume_refusal(marker(local, 2, 2, 1), marker(local, 2, 2, 1)) is None
    assert "saved per rank on node-local disks" in resume_refusal(marker(local, 2, 2, 1), marker(local, 4, 1, 1))
    assert "saved per rank on node-local disks" in resume_refusal(marker(local, 2, 2, 1), marker(DDP, 2, 2, 1))


def test_a_marker_without_an_engine_resumes_as_before():
    assert resume_refusal({"batch": [2, 2, 1], "seed": 0}, marker(FSDP, 4, 1, 1)) is None
