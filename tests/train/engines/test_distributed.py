"""Two gloo processes equal one process with the same global batch (spawned torchrun / accelerate launch)."""

from __future__ import annotations

import pytest

from tests.train.helpers import base_config, max_param_diff, run_processes

pytestmark = [pytest.mark.distributed, pytest.mark.slow]


@pytest.mark.parametrize(
    ("loss", "launcher"),
    [("dpo", "accelerate"), ("mmpo-no-aux", "torchrun")],  # mmpo-no-aux normalizes over the whole global batch
)
def test_two_processes_equal_one_with_same_global_batch(tmp_path, tiny_dir, pairs_file, loss, launcher):
    kw = dict(loss=loss, max_steps=3, grad_accum=1)
    cfg = base_config(tiny_dir, pairs_file, tmp_path / "two", per_device_batch_size=4, **kw)
    two = run_processes(cfg, 2, launcher=launcher)
    one = run_processes(base_config(tiny_dir, pairs_file, tmp_path / "one", per_device_batch_size=8, **kw), 1)
    diff = max_param_diff(two["params"], one["params"])
    assert diff < 1e-5, diff
    for a, b in zip(two["history"], one["history"], strict=True):
        assert abs(a["loss"] - b["loss"]) < 1e-5
        assert abs(a["rewards/accuracies"] - b["rewards/accuracies"]) < 1e-6
