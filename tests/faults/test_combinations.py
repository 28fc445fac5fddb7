"""Combinations that were untested: LoRA with --precompute-ref on 2 processes (equal to 1), resume of a LoRA run."""

from __future__ import annotations

import pytest

from tests.faults._run import max_diff
from tests.train.helpers import base_config, max_param_diff, params_of, run_inprocess, run_processes

LORA = dict(loss="dpo", lora=True, lora_r=4, lora_alpha=8, lora_dropout=0.0, lora_target_modules=["q_proj", "v_proj"])


def test_resume_of_a_lora_run_equals_the_uninterrupted_run(tmp_path, tiny_dir, pairs_file):
    kw = dict(**LORA, max_steps=4, save_steps=2)
    full = run_inprocess(base_config(tiny_dir, pairs_file, tmp_path / "full", **kw))
    cfg = base_config(tiny_dir, pairs_file, tmp_path / "run", **kw)
    first = run_inprocess({**cfg, "stop_after_steps": 2})
    assert first.global_step == 2
    res = run_inprocess({**cfg, "resume": "auto"})
    assert res.global_step == 4 and full.global_step == 4
    from safetensors.torch import load_file

    full_adapter, resumed_adapter = (tmp_path / d / "final" / "adapter_model.safetensors" for d in ("full", "run"))
    assert full_adapter.is_file() and resumed_adapter.is_file()  # the adapter, not a full model, was saved
    diff = max_diff(load_file(str(full_adapter)), load_file(str(resumed_adapter)))
    assert diff < 1e-6, diff
    for h_full, h_res in zip(full.history[2:], res.history, strict=False):
        assert abs(h_full["loss"] - h_res["loss"]) < 1e-6


@pytest.mark.slow  # about 60 s on a loaded 2-core machine (a 2-process and a 1-process spawned run)
@pytest.mark.distributed
def test_lora_with_precompute_ref_on_two_processes_equals_one(tmp_path, tiny_dir, pairs_file):
    kw = dict(**LORA, max_steps=3, precompute_ref=True)
    two = run_processes(base_config(tiny_dir, pairs_file, tmp_path / "two", per_device_batch_size=2, **kw,
                                    ref_cache_dir=str(tmp_path / "ref2")), 2)  # fmt: skip
    one = run_processes(base_config(tiny_dir, pairs_file, tmp_path / "one", per_device_batch_size=4, **kw,
                                    ref_cache_dir=str(tmp_path / "ref1")), 1)  # fmt: skip
    assert two["step"] == one["step"] == 3
    diff = max_param_diff(two["params"], one["params"])
    assert diff < 1e-5, diff
    assert any("lora_B" in k for k in two["params"])
    for a, b in zip(two["history"], one["history"], strict=True):
        assert abs(a["loss"] - b["loss"]) < 1e-5


@pytest.mark.slow  # about 25 s each on a loaded 2-core machine (a 2-process DeepSpeed run and a plain one)
@pytest.mark.deepspeed
@pytest.mark.distributed
@pytest.mark.parametrize("stage", ["zero2", "zero3"])
def test_lora_with_precompute_ref_under_zero_on_two_processes_equals_one_plain(tmp_path, tiny_dir, pairs_file, stage):
    pytest.importorskip("deepspeed")
    kw = dict(**LORA, max_steps=3, precompute_ref=True, lr=1e-2)
    two = run_processes(base_config(tiny_dir, pairs_file, tmp_path / "two", per_device_batch_size=2, deepspeed=stage,
                                    **kw, ref_cache_dir=str(tmp_path / "ref2")), 2)  # fmt: skip
    one = run_inprocess(base_config(tiny_dir, pairs_file, tmp_path / "one", per_device_batch_size=4, **kw,
                                    ref_cache_dir=str(tmp_path / "ref1")))  # fmt: skip
    assert two["step"] == one.global_step == 3
    diff = max_param_diff(two["params"], params_of(one.model))
    assert diff < 1e-4, diff
    assert max(abs(a["loss"] - b["loss"]) for a, b in zip(two["history"], one.history, strict=True)) < 1e-4
