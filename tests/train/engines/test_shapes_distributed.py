"""Two gloo processes equal one process with the same global batch for a group-coupled list loss (mml)."""

from __future__ import annotations

import pytest

from tests.support.shaped_data import make_ultrafeedback_raw
from tests.support.tiny import write_jsonl
from tests.train.helpers import base_config, max_param_diff, run_processes

pytestmark = [pytest.mark.distributed, pytest.mark.slow]


def test_two_processes_equal_one_for_mml_on_lists(tmp_path, tiny_dir):
    """mml min-max normalises R over the whole gathered batch: uneven work per rank, one result."""
    data = write_jsonl(tmp_path / "ultrafeedback_raw.jsonl", make_ultrafeedback_raw(32))
    kw = dict(loss="mml", loss_params={"reward_from": "score"}, max_steps=3, grad_accum=1)
    two = run_processes(base_config(tiny_dir, data, tmp_path / "two", per_device_batch_size=4, **kw), 2)
    one = run_processes(base_config(tiny_dir, data, tmp_path / "one", per_device_batch_size=8, **kw), 1)
    diff = max_param_diff(two["params"], one["params"])
    assert diff < 1e-5, diff
    assert len(two["history"]) == len(one["history"]) == 3
    for a, b in zip(two["history"], one["history"], strict=True):
        assert abs(a["loss"] - b["loss"]) < 1e-5, (a["loss"], b["loss"])
        assert abs(a["rewards/ranking_accuracy"] - b["rewards/ranking_accuracy"]) < 1e-6
