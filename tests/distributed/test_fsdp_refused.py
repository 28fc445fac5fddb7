"""accelerate's FSDP config where accelerate would quietly run something else is a one-line error, never silent DDP."""

from __future__ import annotations

import pytest

pytest.importorskip("accelerate")

from prefzoo.train.config import ConfigError, TrainConfig
from prefzoo.train.engines import EngineSettings
from prefzoo.train.engines.accelerator import build_accelerator


def test_accelerate_fsdp_without_gpu_is_refused(monkeypatch, tmp_path):
    monkeypatch.setenv("ACCELERATE_USE_FSDP", "true")
    with pytest.raises(ConfigError, match="without a GPU accelerate ignores FSDP and would run plain DDP"):
        build_accelerator(EngineSettings.of(TrainConfig(model="m", cpu=True)), None, str(tmp_path))


def test_accelerate_fsdp_with_deepspeed_is_refused(monkeypatch, tmp_path):
    monkeypatch.setenv("ACCELERATE_USE_FSDP", "true")
    with pytest.raises(ConfigError, match="choose one sharding engine"):
        build_accelerator(EngineSettings.of(TrainConfig(model="m", cpu=True, deepspeed="zero3")), None,
                          str(tmp_path))  # fmt: skip
