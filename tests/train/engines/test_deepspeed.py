"""DeepSpeed ZeRO-2 and ZeRO-3 train on CPU (1 and 2 gloo processes) with a frozen reference model."""

from __future__ import annotations

import math

import pytest
from transformers import AutoModelForCausalLM

from tests.train.helpers import base_config, max_param_diff, params_of, run_inprocess, run_processes

pytest.importorskip("deepspeed")
pytestmark = [pytest.mark.deepspeed, pytest.mark.distributed, pytest.mark.slow]


@pytest.mark.parametrize("nproc", [1, 2])
@pytest.mark.parametrize("stage", ["zero2", "zero3"])
def test_zero_trains_with_reference(tmp_path, tiny_dir, pairs_file, stage, nproc):
    kw = dict(loss="dpo", max_steps=3, grad_accum=2, lr=1e-2)  # global batch 16 pairs in every run
    cfg = base_config(
        tiny_dir, pairs_file, tmp_path / "run", deepspeed=stage, per_device_batch_size=8 // nproc, save_steps=2, **kw
    )
    res = run_processes(cfg, nproc)
    assert res["step"] == 3
    assert all(math.isfinite(h["loss"]) for h in res["history"])
    plain = run_inprocess(base_config(tiny_dir, pairs_file, tmp_path / "plain", per_device_batch_size=8, **kw))
    diff = max_param_diff(res["params"], params_of(plain.model))
    assert diff < 1e-4, diff  # same training as without DeepSpeed
    assert max_param_diff(res["params"], params_of(AutoModelForCausalLM.from_pretrained(tiny_dir))) > 1e-3
    assert (tmp_path / "run" / "final" / "model.safetensors").is_file()
    assert (tmp_path / "run" / "checkpoints" / "step-00000003").is_dir()


def test_default_run_under_zero3_scores_the_trained_policy(tmp_path):
    """The default task under ZeRO-3 on 2 ranks ends with the report, scored from the saved final model (the
    in-memory policy's ZeRO-3 hooks need the process group, gone once training ends); FSDP2's twin:
    tests/distributed/test_default_run.py."""
    from tests.support.launch import assert_default_report, torchrun_prefzoo

    stdout = torchrun_prefzoo("train", "--loss", "dpo", "--max-steps", "1", "--output-dir", str(tmp_path),
                              "--no-progress", "--deepspeed", "zero3")  # fmt: skip
    assert_default_report(stdout, tmp_path)
