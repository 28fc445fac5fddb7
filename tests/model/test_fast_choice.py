"""The automatic fast-path choice: a pure function of the pairs' length statistics, logged in one line per run."""

from __future__ import annotations

import pytest

from prefzoo.model.fast.choice import LengthStats, choose_fast_paths, length_stats, switch_value
from prefzoo.train.config import ConfigError, TrainConfig

PROMPT_HEAVY = LengthStats(pairs=100, prompt_saving=0.4, padding_plain=0.1, padding_shared=0.1)
SPREAD = LengthStats(pairs=100, prompt_saving=0.05, padding_plain=0.4, padding_shared=0.45)


def test_switch_values():
    assert [switch_value("packing", v) for v in (True, False, "auto", "ON", "false", "yes")] == [
        "on", "off", "auto", "on", "off", "on",
    ]  # fmt: skip
    with pytest.raises(ValueError, match="packing='sometimes': choose auto, on or off"):
        switch_value("packing", "sometimes")
    with pytest.raises(ConfigError, match="share_prompt=2"):
        TrainConfig(model="m", dataset=["d"], share_prompt=2)  # type: ignore[arg-type]
    assert TrainConfig(model="m", dataset=["d"], group_by_length=True).group_by_length == "on"  # YAML booleans


def test_length_stats_by_hand():
    # pairs (|x|, |y_w|, |y_l|); one batch of both: plain rows 12, 10, 14, 10 → 4 rows of 14 = 56 slots, 46 tokens
    s = length_stats([(10, 2, 4), (2, 8, 8)], batch_size=2)
    assert s.prompt_saving == pytest.approx(12 / (26 + 20))
    assert s.padding_plain == pytest.approx(1 - 46 / 56)
    assert s.padding_shared == pytest.approx(1 - 34 / 36)  # rows 16 and 18


def test_prompt_heavy_data_shares_the_prompt():
    f = choose_fast_paths(PROMPT_HEAVY)
    assert (f.share_prompt, f.packing, f.group_by_length) == (True, False, False)
    assert "share-prompt on (auto: prompt is 40% of plain tokens, ≥ 15%)" in f.line()


def test_spread_data_packs_instead_of_grouping():
    f = choose_fast_paths(SPREAD)
    assert (f.share_prompt, f.packing, f.group_by_length) == (False, True, False)
    assert "packing removes the padding" in f.line()
    g = choose_fast_paths(SPREAD, packing="off")
    assert g.group_by_length and not g.packing
    assert not choose_fast_paths(SPREAD, packing="off", batch_coupled=True).group_by_length  # batches unchanged


def test_a_model_that_takes_the_split_packs_from_a_little_padding():
    """One padding-free row with the split attention needs no mask: packing pays from 2% padding, not 25%."""
    f = choose_fast_paths(PROMPT_HEAVY, split=True)
    assert (f.share_prompt, f.packing, f.group_by_length) == (True, True, False)
    assert "packing on (auto: batches 10% padding, ≥ 2%: one row, split attention)" in f.line()
    shared = "share-prompt on (auto: prompt is 40% of plain tokens, ≥ 15%, attention split in two causal parts)"
    assert shared in f.line()
    assert "split" not in choose_fast_paths(PROMPT_HEAVY).line()
    assert not choose_fast_paths(PROMPT_HEAVY).packing  # the masked packing: 10% < 25%
    even = LengthStats(pairs=100, prompt_saving=0.4, padding_plain=0.01, padding_shared=0.01)
    f = choose_fast_paths(even, split=True)
    assert not f.packing and "packing off (auto: batches 1% padding, < 2%)" in f.line()


def test_flags_force_either_way_and_auto_yields_to_refusals():
    f = choose_fast_paths(PROMPT_HEAVY, share_prompt="off", packing="on", group_by_length="on")
    assert (f.share_prompt, f.packing, f.group_by_length) == (False, True, True)
    assert f.reasons == ("forced", "forced", "forced")
    f = choose_fast_paths(PROMPT_HEAVY, refusal="recurrent layers")
    assert not f.share_prompt and "recurrent layers" in f.reasons[0]
    f = choose_fast_paths(None, unavailable="lists batches")
    assert not (f.share_prompt or f.packing or f.group_by_length) and f.reasons[2] == "auto: lists batches"


@pytest.mark.slow  # two CLI runs: ~30 s on a loaded machine
def test_a_run_logs_its_choice(tmp_path, tiny_dir, pairs_file, capsys):
    from prefzoo.cli.main import main

    common = ["train", "--model", str(tiny_dir), "--dataset", str(pairs_file), "--max-steps", "1",
              "--report-to", "none", "--no-progress", "--per-device-batch-size", "4"]  # fmt: skip
    assert main([*common, "--output-dir", str(tmp_path / "a")]) == 0
    out = capsys.readouterr().out
    assert "prefzoo train: fast paths: share-prompt on (auto: prompt is" in out  # 'add 12+34=' prompts, 1–2 digits
    assert "gated MLPs recompute silu(gate) and the product in backward" in out
    assert "(LlamaMLP × 2; --no-fused-mlp" in out
    assert main([*common, "--output-dir", str(tmp_path / "b"), "--no-share-prompt", "--packing", "--no-fused-mlp"]) == 0
    out = capsys.readouterr().out
    assert "fast paths: share-prompt off (forced); packing on (forced)" in out
    assert "gated MLPs" not in out
