"""A user's DeepSpeed JSON is checked before anything loads (no deepspeed needed: the config is plain data)."""

from __future__ import annotations

import json
import re

import pytest

from prefzoo.train.config import ConfigError
from prefzoo.train.engines.deepspeed import deepspeed_config

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
    want = (rf"^--deepspeed {re.escape(spec)}: zero_optimization.{KEY} is false, so the final model could not be "
            r"saved after training; set it to true \(or remove it: prefzoo sets it\)$")  # fmt: skip
    with pytest.raises(ConfigError, match=want) as e:
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


@pytest.mark.parametrize("precision", ["no", "bf16", "fp16"])
def test_the_presets_follow_the_runs_precision_batch_and_clipping(precision):
    cfg = deepspeed_config("zero2", per_device_batch_size=4, grad_accum=2, max_grad_norm=0.5, mixed_precision=precision)
    assert cfg["bf16"] == {"enabled": precision == "bf16"} and cfg["fp16"] == {"enabled": precision == "fp16"}
    assert (cfg["train_micro_batch_size_per_gpu"], cfg["gradient_accumulation_steps"]) == (4, 2)
    assert cfg["gradient_clipping"] == 0.5 and cfg["zero_optimization"]["stage"] == 2
    assert "train_batch_size" not in cfg  # DeepSpeed derives it from micro batch × accumulation × processes


def test_a_users_own_precision_and_clipping_are_kept_and_its_batch_keys_are_the_runs(tmp_path):
    user = {"zero_optimization": {"stage": 2}, "fp16": {"enabled": False, "loss_scale": 0}, "gradient_clipping": 2.0}
    spec = _write(tmp_path, {**user, "train_batch_size": 999, "train_micro_batch_size_per_gpu": 7})
    cfg = deepspeed_config(spec, per_device_batch_size=2, grad_accum=3, max_grad_norm=1.0, mixed_precision="no")
    assert cfg["fp16"] == {"enabled": False, "loss_scale": 0} and cfg["bf16"] == {"enabled": False}
    assert cfg["gradient_clipping"] == 2.0
    assert (cfg["train_micro_batch_size_per_gpu"], cfg["gradient_accumulation_steps"]) == (2, 3)
    assert "train_batch_size" not in cfg


@pytest.mark.parametrize("spec", ["zero2", "zero3"])
def test_deepspeed_prints_no_step_lines_of_its_own_unless_the_users_file_asks(spec, tmp_path):
    """prefzoo logs each step itself.  DeepSpeed prints every ``steps_per_print`` steps, and releases in the supported
    range (``deepspeed>=0.15``; before the default became None) compute ``(global_steps + 1) % steps_per_print``
    unguarded: the presets set a positive int that no run reaches, never None.  A user's own value is kept."""
    n = _cfg(spec)["steps_per_print"]
    assert type(n) is int and n >= 10**9
    user = _write(tmp_path, {"zero_optimization": {"stage": 2}, "steps_per_print": 5})
    assert _cfg(user)["steps_per_print"] == 5


@pytest.mark.parametrize("spec", ["zero2", "zero3"])
def test_the_presets_turn_communication_overlap_off_for_both_stages(spec):
    """DeepSpeed's own default differs by stage (its ZeRO config turns ``overlap_comm`` on for stage 3 when unset), so
    the presets say it: off, the configuration the DeepSpeed tests and ``bench_memory.py`` ran on gloo CPU ranks."""
    assert _cfg(spec)["zero_optimization"]["overlap_comm"] is False
