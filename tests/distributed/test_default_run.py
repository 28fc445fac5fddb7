"""The README's default run (no --model/--dataset: the embedded default task) launched with torchrun on 2 gloo ranks
under FSDP2: it trains, saves, scores the trained policy (from the saved final model, whole whatever the engine) and
exits 0, as a user runs it.  One optimizer step, the fewest the CLI accepts; most of the run is the scoring (200
win-rate and 200 retention prompts generated before and after training).
ZeRO-3: tests/train/engines/test_deepspeed.py."""

from __future__ import annotations

import os

import pytest

from tests.support.launch import assert_default_report, torchrun_prefzoo

WORLDS = [int(w) for w in os.environ.get("PREFZOO_DIST_WORLDS", "2,4").split(",") if w]


@pytest.mark.distributed
@pytest.mark.slow
@pytest.mark.skipif(2 not in WORLDS, reason="run once, with 2 ranks")
def test_default_run_under_fsdp_scores_the_trained_policy(tmp_path):
    stdout = torchrun_prefzoo("train", "--loss", "dpo", "--max-steps", "1", "--output-dir", str(tmp_path),
                              "--no-progress", "--fsdp")  # fmt: skip
    assert "FSDP2 (full sharding): 2 decoder layers and the root sharded over 2 processes" in stdout
    assert_default_report(stdout, tmp_path)
