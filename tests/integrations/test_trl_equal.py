"""prefzoo's losses through TRL's DPOTrainer update the model exactly as TRL's own loss types and switches do.

Plain SGD at a large rate, no clipping, the same seed and data: after 3 steps the parameter updates of
``loss=NAME`` and of TRL's ``loss_type=...`` agree to 1e-5 relative (measured: 0 to ~1e-7).
"""

from __future__ import annotations

import pytest

from tests.integrations.trl_support import assert_same_training, make_pairs, train

# (prefzoo loss, TRL loss_type, DPOConfig extras, pairs whose chosen completions all have one length)
CASES = {
    "dpo": ("dpo", "sigmoid", {}, False),
    "ipo": ("ipo", "ipo", {"beta": 0.5}, False),  # both average the log-ratio per completion token
    "hinge": ("hinge", "hinge", {}, False),
    "apo-zero": ("apo-zero", "apo_zero", {}, False),
    "robust": ("robust", "robust", {"label_smoothing": 0.2}, False),
    # TRL's sft averages over every chosen token of the batch, prefzoo's per example: equal for equal lengths
    "sft": ("sft", "sft", {}, True),
    "no-loss": (None, "sigmoid", {}, False),  # without loss= the trainer is TRL's
    "dpo-precompute": ("dpo", "sigmoid", {"precompute_ref_log_probs": True}, False),
    "dpo-lora": ("dpo", "sigmoid", {"lora": True}, False),
    # TRL's own switches, carried out by prefzoo's modifiers wpo, ld-dpo and tr-dpo (varied lengths: LD-DPO acts)
    "dpo-use_weighting": ("dpo", "sigmoid", {"use_weighting": True}, False),
    "dpo-ld_alpha": ("dpo", "sigmoid", {"ld_alpha": 0.3}, False),
    "dpo-ld_alpha-lora": ("dpo", "sigmoid", {"ld_alpha": 0.3, "lora": True}, False),  # adapter-disabled reference
    "dpo-sync_ref_model": ("dpo", "sigmoid", {"sync_ref_model": True, "ref_model_sync_steps": 1,
                                               "ref_model_mixup_alpha": 0.5}, False),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_three_sgd_steps_equal_trls_loss_type(case, trl_model_dir, start_params, tmp_path):
    loss, loss_type, extra, equal_chosen = CASES[case]
    pairs = make_pairs(24, seed=1, equal_chosen=equal_chosen)
    extra = dict(extra)
    lora = extra.pop("lora", False)
    ours, ours_log, _ = train(trl_model_dir, tmp_path / "ours", pairs, adapter=True, loss=loss, lora=lora, **extra)
    theirs, trl_log, _ = train(
        trl_model_dir, tmp_path / "trl", pairs, adapter=False, lora=lora, loss_type=loss_type, **extra
    )
    if lora:  # only the adapter trains: compare against its initial values (B = 0, A random with the seed)
        start = {k: v for k, v in train_start(trl_model_dir, tmp_path, lora=True).items() if k in theirs}
    else:
        start = {k: v for k, v in start_params.items() if k in theirs}
    assert_same_training(ours, ours_log, theirs, trl_log, start)
    keys = ["entropy", "mean_token_accuracy", "logits/chosen", "num_tokens"]
    if "ld_alpha" not in extra:  # TRL logs LD-DPO's weighted log-probs, the adapter the plain sums
        keys += ["logps/chosen", "logps/rejected"]
    if case != "sft":  # prefzoo's sft scores are its average log-probs, TRL logs β·log-ratios for every loss type
        keys += ["rewards/chosen", "rewards/rejected", "rewards/accuracies", "rewards/margins"]
    for key in keys:
        assert ours_log[-2][key] == pytest.approx(trl_log[-2][key], rel=1e-4, abs=1e-6), key


def train_start(model_dir, tmp_path, lora):
    """The trainable parameters before any step (max_steps=0 builds the same trainer and trains nothing)."""
    params, _, _ = train(model_dir, tmp_path / "start", make_pairs(4), adapter=False, lora=lora, max_steps=0)
    return params


def test_use_weighting_with_a_batch_coupled_loss_trains_with_wpo_weights(trl_model_dir, tmp_path):
    """``use_weighting=True, loss="mmpo-no-aux"``: WPO's weights on MMPO's logsumexp (TRL has no such loss type)."""
    pairs = make_pairs(24, seed=1)
    _, plain, _ = train(trl_model_dir, tmp_path / "plain", pairs, adapter=True, loss="mmpo-no-aux", max_steps=1)
    _, weighted, _ = train(trl_model_dir, tmp_path / "wpo", pairs, adapter=True, loss="mmpo-no-aux", max_steps=1,
                           use_weighting=True)  # fmt: skip
    first_plain, first = next(r for r in plain if "loss" in r), next(r for r in weighted if "loss" in r)
    assert "wpo/weight" in first and 0 < first["wpo/weight"] < 1, first  # each pair's weight w(y_w)·w(y_l)
    assert "wpo/weight" not in first_plain
    assert first["loss"] != pytest.approx(first_plain["loss"], rel=1e-3)  # the weights act on the same first batch
