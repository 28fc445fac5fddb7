"""A user's DeepSpeed JSON is checked before anything loads (no deepspeed needed: the config is plain data)."""

from __future__ import annotations

import json

import pytest

from prefzoo.train.config import ConfigError
from prefzoo.train.distributed import deepspeed_config

KEY = "stage3_gather_16bit_weights_on_model_save"


def _write(tmp_path, obj) -> str:
    path = tmp_path / "ds.json"
    path.write_text(obj if isinstance(obj, str) else json.dumps(obj))
    return str(path)


def _cfg(spec: str) -> dict:
    return deepspeed_config(spec, per_device_batch_size=2, grad_accum=3, max_grad_norm=1.0, mixed_precision="no")


def test_zero3_without_the_gather_flag_gets_it_since_the_final_save_needs_it(tmp_path):
    cfg = _cfg(_write(tmp_path, {"zero_optimization": {"stage": 3}}))
    assert cfg["zero_optimization"][KEY] is True
    assert (cfg["train_micro_batch_size_per_gpu"], cfg["gradient_accumulation_steps"]) == (2, 3)


def test_zero3_with_the_gather_flag_false_is_one_line_naming_it(tmp_path):
    spec = _write(tmp_path, {"zero_optimization": {"stage": 3, KEY: False}})
    with pytest.raises(ConfigError, match=f"zero_optimization.{KEY} is false.*set it to true") as e:
        _cfg(spec)
    assert "\n" not in str(e.value)


def test_zero2_is_left_as_written(tmp_path):
    cfg = _cfg(_write(tmp_path, {"zero_optimization": {"stage": 2}}))
    assert KEY not in cfg["zero_optimization"]


def test_a_file_that_is_not_json_is_one_line(tmp_path):
    with pytest.raises(ConfigError, match=r"not valid JSON .* line 1\); fix the file"):
        _cfg(_write(tmp_path, "{stage: 3"))


def test_a_json_list_is_refused(tmp_path):
    with pytest.raises(ConfigError, match="expected a JSON object"):
        _cfg(_write(tmp_path, [1, 2]))


def test_the_zero3_preset_gathers_on_save():
    assert _cfg("zero3")["zero_optimization"][KEY] is True
