"""Evaluation with a non-finite log-prob counts and skips the pair; a NaN in one rank's eval shard does not hang."""

from __future__ import annotations

import json
import math

import pytest

from tests.faults.injector import SPEC as INJECTOR
from tests.train.helpers import base_config, run_inprocess, run_processes

# 16 eval pairs; the injector poisons the first row of the decoder's output, so the rows stay collated (packing off:
# packed, that row would hold every sequence; a NaN that stays in its own packed sequence is tested in
# tests/model/test_fast_split.py)
KW = dict(loss="dpo", max_steps=2, eval_fraction=0.25, eval_at_start=True, callbacks=[INJECTOR], packing="off")


def _evals(out):
    rows = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines() if x.strip()]
    return [r for r in rows if "eval/reward_accuracy" in r]


def test_a_nan_pair_in_evaluation_is_counted_and_skipped(tmp_path, tiny_dir, pairs_file, faults, capsys):
    faults("nan_eval@0")  # the first pair of each of the 4 eval batches (4 pairs per batch)
    res = run_inprocess(base_config(tiny_dir, pairs_file, tmp_path / "run", **KW))
    assert res.global_step == 2 and res.final_dir is not None
    assert len(res.evals) == 2  # before training and after the epoch
    for ev in res.evals:
        assert ev["eval/skipped_pairs"] == 4 and ev["eval/pairs"] == 12, ev
        assert math.isfinite(ev["eval/reward_accuracy"]) and math.isfinite(ev["eval/loss"]), ev
    assert "evaluation skipped 4 of 16 pairs with non-finite log-probs" in capsys.readouterr().out
    assert all(math.isfinite(h["loss"]) for h in res.history)  # training itself is untouched


@pytest.mark.slow  # about 40 s on a loaded 2-core machine (2 spawned processes)
@pytest.mark.distributed
def test_a_nan_in_one_ranks_eval_shard_does_not_hang_the_gather(tmp_path, tiny_dir, pairs_file, faults):
    faults("nan_eval@0:1")  # rank 1 only: rank 0's shard is clean
    out = tmp_path / "run"
    res = run_processes(base_config(tiny_dir, pairs_file, out, **KW, per_device_batch_size=2, dist_timeout=60), 2)
    assert res["step"] == 2
    evals = _evals(out)
    assert len(evals) == 2
    for ev in evals:  # 16 pairs in batches of 2 per rank: rank 1 has 4 batches, each loses its first pair
        assert ev["eval/skipped_pairs"] == 4 and ev["eval/pairs"] == 12, ev
        assert math.isfinite(ev["eval/reward_accuracy"]), ev
