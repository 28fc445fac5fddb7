"""Under DeepSpeed a non-finite step is skipped like without it when each step is one micro-batch."""

from __future__ import annotations

import pytest

from tests.faults.injector import SPEC as INJECTOR
from tests.train.helpers import base_config, max_param_diff, params_of, run_inprocess, run_processes

pytest.importorskip("deepspeed")


@pytest.mark.slow  # about 30 s (1 process) and 45 s (2 processes) on a loaded 2-core machine
@pytest.mark.deepspeed
@pytest.mark.distributed
@pytest.mark.parametrize(("nproc", "fault"), [(1, "nan_logps@2"), (2, "nan_logps@2:1")])  # 2: on rank 1 only
def test_zero2_skips_a_nan_step_like_plain_training(tmp_path, tiny_dir, pairs_file, faults, nproc, fault):
    kw = dict(loss="dpo", max_steps=4, grad_accum=1, lr=1e-2, callbacks=[INJECTOR])
    faults(fault)
    ds_cfg = base_config(tiny_dir, pairs_file, tmp_path / "ds", deepspeed="zero2", per_device_batch_size=4 // nproc,
                         **kw)  # fmt: skip
    ds = run_processes(ds_cfg, nproc)
    faults("nan_logps@2")  # the same global batch of 4 pairs skipped in one process
    plain = run_inprocess(base_config(tiny_dir, pairs_file, tmp_path / "plain", per_device_batch_size=4, **kw))
    assert ds["step"] == plain.global_step == 4 and plain.skipped_steps == 1
    assert ds["history"][-1]["skipped_steps"] == 1
    diff = max_param_diff(ds["params"], params_of(plain.model))
    assert diff < 1e-4, diff  # the skipped step left weights and optimizer moments as plain training does


@pytest.mark.slow  # about 40 s per case on a loaded 2-core machine
@pytest.mark.deepspeed
@pytest.mark.distributed
@pytest.mark.parametrize("stage", ["zero2", "zero3"])
def test_a_nan_in_the_last_micro_batch_is_skipped_with_accumulation(tmp_path, tiny_dir, pairs_file, faults, stage):
    """With --grad-accum 2 the first micro-batch's gradients are already in the engine when the second is NaN: the
    step backpropagates NaN and ZeRO drops it; weights and moments end as in plain training with the same skip."""
    kw = dict(loss="dpo", max_steps=4, grad_accum=2, per_device_batch_size=2, lr=1e-2, callbacks=[INJECTOR])
    faults("nan_last_micro@2")
    ds = run_processes(base_config(tiny_dir, pairs_file, tmp_path / "ds", deepspeed=stage, **kw), 1)
    plain = run_inprocess(base_config(tiny_dir, pairs_file, tmp_path / "plain", **kw))
    faults("")
    unskipped = run_inprocess(base_config(tiny_dir, pairs_file, tmp_path / "unskipped", **kw))
    assert ds["step"] == plain.global_step == 4 and plain.skipped_steps == 1
    assert ds["history"][-1]["skipped_steps"] == 1
    diff = max_param_diff(ds["params"], params_of(plain.model))
    assert diff < 1e-4, diff  # the dropped step left weights and optimizer moments as plain training does
    assert max_param_diff(params_of(unskipped.model), params_of(plain.model)) > 1e-3  # the skip is visible
