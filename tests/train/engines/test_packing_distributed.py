"""Packing on two gloo processes trains exactly like the unpacked path on two processes (torchrun, spawned)."""

from __future__ import annotations

import pytest

from tests.train.helpers import base_config, max_param_diff, run_processes

pytestmark = [pytest.mark.distributed, pytest.mark.slow]  # two launches of two processes: minutes under load


def test_two_processes_packed_equal_unpacked(tmp_path, tiny_dir, pairs_file):
    # mmpo-entropy: token log-probs and entropies, normalized over the global batch (a gather), with prompt sharing
    kw = dict(loss="mmpo-entropy", share_prompt=True, max_steps=2, grad_accum=1, per_device_batch_size=4)
    plain = run_processes(base_config(tiny_dir, pairs_file, tmp_path / "plain", packing="off", **kw), 2)
    packed = run_processes(base_config(tiny_dir, pairs_file, tmp_path / "packed", packing=True, **kw), 2)
    assert max_param_diff(packed["params"], plain["params"]) < 1e-5
    assert len(packed["history"]) == len(plain["history"]) == 2
    for a, b in zip(packed["history"], plain["history"], strict=True):
        assert abs(a["loss"] - b["loss"]) < 1e-5
