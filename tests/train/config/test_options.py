"""AdamW8bit, precomputed (cached) reference log-probs, mixed precision, metrics files."""

from __future__ import annotations

import json

import pytest
import torch

from prefzoo.scoring.reference_cache import _cache_file
from tests.train.helpers import base_config, max_param_diff, params_of, run_inprocess


def test_adamw8bit_trains_and_tracks_adamw(tmp_path, tiny_dir, pairs_file):
    pytest.importorskip("bitsandbytes")
    from tests.support.tiny import make_model_dir

    model_dir = make_model_dir(tmp_path, hidden=64)  # MLP weights 64 × 128 = 8192 ≥ 4096: really 8-bit state
    kw = dict(loss="sft", max_steps=12, lr=1e-2, per_device_batch_size=8)
    eight = run_inprocess(base_config(model_dir, pairs_file, tmp_path / "8bit", optim="adamw8bit", **kw))
    full = run_inprocess(base_config(model_dir, pairs_file, tmp_path / "fp32", **kw))
    l8 = [h["loss"] for h in eight.history]
    assert l8[-1] < l8[0] - 0.5  # the NLL of the chosen answers goes down
    assert abs(l8[-1] - full.history[-1]["loss"]) < 0.05 * abs(full.history[-1]["loss"])
    assert max_param_diff(params_of(eight.model), params_of(full.model)) > 0  # really a different optimizer


def test_precomputed_reference_matches_frozen_and_is_cached(tmp_path, tiny_dir, pairs_file, caplog):
    kw = dict(loss="dpo", max_steps=3, eval_fraction=0.1, ref_cache_dir=str(tmp_path / "cache"))
    frozen = run_inprocess(base_config(tiny_dir, pairs_file, tmp_path / "frozen", **kw))
    pre = run_inprocess(base_config(tiny_dir, pairs_file, tmp_path / "pre", precompute_ref=True, **kw))
    assert max_param_diff(params_of(frozen.model), params_of(pre.model)) < 1e-5
    files = list((tmp_path / "cache").glob("*.safetensors"))
    assert len(files) == 1
    mtime = files[0].stat().st_mtime_ns
    again = run_inprocess(base_config(tiny_dir, pairs_file, tmp_path / "again", precompute_ref=True, **kw))
    assert files[0].stat().st_mtime_ns == mtime  # reused, not recomputed
    assert max_param_diff(params_of(again.model), params_of(pre.model)) == 0
    # a corrupted cache (wrong shape) is detected and recomputed
    from safetensors import safe_open
    from safetensors.torch import load_file, save_file

    with safe_open(str(files[0]), framework="pt") as f:
        meta = f.metadata()
    bad = load_file(str(files[0]))["logps"][:-1]
    save_file({"logps": bad}, str(files[0]), metadata=meta)
    fixed = run_inprocess(base_config(tiny_dir, pairs_file, tmp_path / "fixed", precompute_ref=True, **kw))
    assert max_param_diff(params_of(fixed.model), params_of(pre.model)) < 1e-6
    assert load_file(str(files[0]))["logps"].shape[0] == bad.shape[0] + 1
    assert _cache_file(tmp_path / "cache", "x") != files[0]


def test_reference_free_loss_builds_no_reference(tmp_path, tiny_dir, pairs_file, capsys):
    run_inprocess(base_config(tiny_dir, pairs_file, tmp_path, loss="simpo", max_steps=1))
    assert "reference: none (reference-free loss)" in capsys.readouterr().out


def test_metrics_jsonl_has_every_metric(tmp_path, tiny_dir, pairs_file):
    res = run_inprocess(base_config(tiny_dir, pairs_file, tmp_path, loss="mmpo", max_steps=2, eval_fraction=0.1))
    lines = [json.loads(x) for x in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    step = lines[0]
    for key in (
        "loss",
        "rewards/chosen",
        "rewards/rejected",
        "rewards/accuracies",
        "rewards/margins",
        "logps/chosen",
        "logps/rejected",
        "grad_norm",
        "lr",
        "tokens_per_second",
    ):
        assert key in step and step[key] == step[key], key  # present and not NaN
    assert any(k.startswith("loss/") for k in step)  # the loss's own metrics
    assert "eval/reward_accuracy" in lines[-1]
    card = json.loads((res.final_dir / "run_card.json").read_text())
    assert card["config"]["loss"] == "mmpo" and card["versions"]["torch"] == torch.__version__


def test_bf16_mixed_precision_trains(tmp_path, tiny_dir, pairs_file):
    res = run_inprocess(base_config(tiny_dir, pairs_file, tmp_path, mixed_precision="bf16", max_steps=2))
    assert all(h["loss"] == h["loss"] for h in res.history)


def test_tensorboard_tracker_writes_events(tmp_path, tiny_dir, pairs_file):
    pytest.importorskip("tensorboard")
    run_inprocess(base_config(tiny_dir, pairs_file, tmp_path, max_steps=2, report_to="tensorboard"))
    assert list((tmp_path / "tb").rglob("events.out.tfevents.*"))
