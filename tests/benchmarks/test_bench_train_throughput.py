"""The training benchmark runs end to end on a tiny model, and its FLOP bound is the documented arithmetic."""

from __future__ import annotations

import importlib
import json
from pathlib import Path

import pytest

BENCH_DIR = Path(__file__).resolve().parents[2] / "benchmarks"


@pytest.fixture(scope="module")
def bench():
    with pytest.MonkeyPatch.context() as mp:  # the benchmarks are scripts in a folder, not a package
        mp.syspath_prepend(str(BENCH_DIR))
        yield importlib.import_module("bench_train_throughput")


def test_flop_bound_by_hand(bench):
    from trainbench_setup import ModelShape, flop_bound

    shape = ModelShape(vocab_size=10, hidden_size=2, intermediate_size=3, num_hidden_layers=1, num_attention_heads=1)
    p_bb, hv = 4 * 2 * 2 + 3 * 2 * 3, 10 * 2  # 34 backbone parameters, 20 head parameters
    assert shape.backbone_params == p_bb and shape.head_params == hv
    pairs = [{"prompt": 5, "chosen": 2, "rejected": 3}]  # 10 tokens (prompt once), 5 completion positions
    assert flop_bound(shape, pairs, "none", attention=False) == 6 * p_bb * 10 + 6 * hv * 5
    assert flop_bound(shape, pairs, "forward", attention=False) == 8 * p_bb * 10 + 8 * hv * 5
    # LoRA: no weight gradients of the base or the head; rank-2 adapters on the 4 attention (2 → 2) and 3 MLP
    # (2 → 3, 3 → 2) matrices hold 2·(4·4 + 3·5) = 62 parameters, 4 FLOPs each per token
    assert shape.adapter_params(2) == 62
    lora = 6 * p_bb * 10 + 6 * hv * 5 + 4 * 62 * 10
    assert flop_bound(shape, pairs, "forward", lora=True, lora_rank=2, attention=False) == lora
    # attention: the prompt's 5·6/2 = 15 causal pairs, the chosen 2·5 + 2·3/2 = 13, the rejected 3·5 + 3·4/2 = 21;
    # per pair and layer 4·H forward, 8·H backward, 4·H for the reference's forward (H = 2, 1 layer)
    assert flop_bound(shape, pairs, "none") == 6 * p_bb * 10 + 6 * hv * 5 + 12 * 2 * 49
    assert flop_bound(shape, pairs, "forward") == 8 * p_bb * 10 + 8 * hv * 5 + 16 * 2 * 49
    assert flop_bound(shape, pairs, "forward", lora=True, lora_rank=2) == lora + 16 * 2 * 49


def test_the_bound_counts_the_adapters_prefzoo_trains_by_default(bench):
    """prefzoo's side runs its default LoRA (no rank passed), TRL's side LORA_RANK: the bound's rank is both."""
    from trainbench_setup import LORA_RANK

    from prefzoo.train import TrainConfig

    defaults = TrainConfig()
    assert defaults.lora_r == defaults.lora_alpha == LORA_RANK
    assert set(defaults.lora_target_modules) == {"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj",
                                                 "down_proj"}  # fmt: skip


def test_write_page_replaces_only_the_bench_block(bench, tmp_path):
    page = tmp_path / "perf.md"
    page.write_text(f"# Title\n\nbefore\n\n{bench.BEGIN}\nold table\n{bench.END}\n\nafter\n")
    bench.write_page(page, "new table\n")
    text = page.read_text()
    assert "old table" not in text and "new table" in text
    assert text.startswith("# Title\n\nbefore") and text.rstrip().endswith("after")


def _run(bench, tmp_path, sides):
    out = tmp_path / "res"
    argv = ["--tiny", "--cases", "dpo", "--repeats", "1", "--warmup", "1", "--steps", "1", "--threads", "1"]
    argv += ["--sides", *sides, "--cache", str(tmp_path / "cache"), "--out", str(out)]
    argv += ["--write-page", str(tmp_path / "page.md")]
    assert bench.main(argv) == 0
    return json.loads(out.with_suffix(".json").read_text()), (tmp_path / "page.md").read_text()


@pytest.mark.slow
def test_tiny_prefzoo_run(bench, tmp_path):
    res, page = _run(bench, tmp_path, ["prefzoo"])
    (case,) = res["cases"]
    run = case["sides"]["prefzoo"]["runs"][0]
    assert run["steps"] == 1  # 1 warm-up step (excluded) + 1 timed
    assert run["tokens_per_s"] > 0 and run["peak_rss_mb"] > 0 and 0 < run["efficiency"]
    assert "| tiny | dpo |" in page and res["meta"]["versions"]["torch"]


@pytest.mark.slow
def test_tiny_run_both_sides(bench, tmp_path):
    pytest.importorskip("trl")
    res, page = _run(bench, tmp_path, ["prefzoo", "trl"])
    (case,) = res["cases"]
    assert set(case["sides"]) == {"prefzoo", "trl"}
    assert case["speed_ratio"]["min"] > 0 and case["memory_ratio"]["min"] > 0
    assert "trl 1.16" in page or "trl " in page
