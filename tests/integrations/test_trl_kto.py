"""prefzoo's unpaired losses through TRL's KTOTrainer: KTO and APO-zero-unpaired update the model as TRL's own loss
types do (plain SGD, float64, 3 steps), BCO as prefzoo's own log-probs and loss do, plugins and weighted sums train,
and what the adapter refuses is one line before anything loads."""

from __future__ import annotations

import dataclasses

import pytest
import torch

import prefzoo
from prefzoo.spec import LossParamError
from tests.integrations.trl_support import assert_same_training, config, make_unpaired, max_rel_diff, train

# (prefzoo loss, TRL loss_type, KTOConfig extras)
CASES = {
    "kto": ("kto", "kto", {"desirable_weight": 1.5, "beta": 0.2}),
    "apo-zero-unpaired": ("apo-zero-unpaired", "apo_zero_unpaired", {}),
    "kto-precompute": ("kto", "kto", {"precompute_ref_log_probs": True}),
    "no-loss": (None, "kto", {}),  # without loss= the trainer is TRL's
    "kto-lora": ("kto", "kto", {"lora": True}),  # the reference is the base model with the adapter disabled
}
METRICS = ["kl", "entropy", "num_tokens", "logits/chosen", "logits/rejected", "rewards/chosen", "rewards/rejected",
           "logps/chosen", "logps/rejected", "rewards/margins"]  # fmt: skip


@pytest.mark.parametrize("case", sorted(CASES))
def test_three_sgd_steps_equal_trls_kto_trainer(case, trl_model_dir, start_params, tmp_path):
    loss, loss_type, extra = CASES[case]
    rows = make_unpaired(12, seed=3)
    ours, ours_log, trainer = train(trl_model_dir, tmp_path / "ours", rows, adapter=True, loss=loss, kind="kto",
                                    **extra)  # fmt: skip
    theirs, trl_log, _ = train(trl_model_dir, tmp_path / "trl", rows, adapter=False, kind="kto", loss_type=loss_type,
                               **extra)  # fmt: skip
    if extra.get("lora"):  # only the adapter trains: compare against its initial values (B = 0, A seeded)
        start, _, _ = train(trl_model_dir, tmp_path / "start", rows, adapter=False, kind="kto", lora=True, max_steps=0)
    else:
        start = {k: v for k, v in start_params.items() if k in theirs}
    assert_same_training(ours, ours_log, theirs, trl_log, start)
    assert trainer.calculate_KL == (loss_type == "kto")  # KL completions only for a loss that needs them
    for key in METRICS:
        assert ours_log[-2][key] == pytest.approx(trl_log[-2][key], rel=1e-4, abs=1e-6), key


def test_a_plugin_unpaired_loss_trains_by_name(trl_model_dir, start_params, tmp_path):
    """A third-party loss declaring the unpaired shape (here a copy of APO-zero-unpaired under another name) is taken
    by name; it declares no KL reference, so TRL builds no KL completions, and it trains as TRL's apo_zero_unpaired."""
    from prefzoo import registry

    spec = dataclasses.replace(registry.loss_spec("apo-zero-unpaired"), name="acme-unpaired", builtin=False)

    class Acme:
        @prefzoo.hookimpl
        def prefzoo_register_losses(self):
            return [spec]

    registry.reset_registry(registry.build_registry(extra_plugins=[("acme", Acme())], autoload=False))
    try:
        rows = make_unpaired(12, seed=3)
        ours, ours_log, trainer = train(trl_model_dir, tmp_path / "ours", rows, adapter=True, loss="acme-unpaired",
                                        kind="kto")  # fmt: skip
    finally:
        registry.reset_registry()
    assert trainer.prefzoo_loss.spec.plugin == "acme" and not trainer.calculate_KL
    theirs, trl_log, _ = train(trl_model_dir, tmp_path / "trl", rows, adapter=False, kind="kto",
                               loss_type="apo_zero_unpaired")  # fmt: skip
    assert_same_training(ours, ours_log, theirs, trl_log, {k: v for k, v in start_params.items() if k in theirs})


def test_a_weighted_sum_of_unpaired_losses_is_the_sum_of_its_terms(trl_model_dir, tmp_path):
    """0.5·kto + 0.5·bco: one step's loss is the weighted sum of each term's loss on the same UnpairedBatch."""
    _, log, trainer = train(trl_model_dir, tmp_path, make_unpaired(12, seed=3), adapter=True, kind="kto",
                            loss="0.5*kto + 0.5*bco", max_steps=2)  # fmt: skip
    assert trainer.calculate_KL  # kto's KL reference is needed by the sum
    steps = [row for row in log if "loss" in row]
    assert len(steps) == 2 and all(torch.isfinite(torch.tensor(r["loss"])) for r in steps)
    assert {"kto/z0", "bco/delta", "kto/loss", "bco/loss"} <= set(log[-2])  # each term's metrics beside TRL's
    assert log[-2]["loss"] == pytest.approx(0.5 * log[-2]["kto/loss"] + 0.5 * log[-2]["bco/loss"], rel=1e-6)


def _prefzoo_bco_steps(model_dir, trainer, steps, lr):
    """``steps`` plain-SGD steps of prefzoo's own ``bco`` on prefzoo's own log-probs (``sequence_logps``), on the
    batches TRL's dataloader gave the adapter (sequential, in order): what ``prefzoo train`` computes per batch."""
    from transformers import AutoModelForCausalLM

    from prefzoo.model.logps import sequence_logps
    from prefzoo.types import UnpairedBatch

    policy = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float64)
    ref = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float64).eval()
    policy.eval()  # the tiny model has no dropout; eval only silences nothing-to-do warnings
    loss = prefzoo.get_loss("bco", beta=0.1)
    for step, batch in zip(range(steps), trainer.get_train_dataloader(), strict=False):
        rows = (batch["input_ids"], batch["attention_mask"], batch["completion_mask"])
        with torch.no_grad():
            ref_logps = sequence_logps(ref, *rows).logps
        ub = UnpairedBatch(policy_logps=sequence_logps(policy, *rows).logps, labels=batch["label"].bool(),
                           ref_logps=ref_logps)  # fmt: skip
        policy.zero_grad()
        loss(ub).losses.mean().backward()
        with torch.no_grad():
            for p in policy.parameters():
                p -= lr * p.grad
        assert step < steps
    return {n: p.detach().clone() for n, p in policy.named_parameters()}, loss.state


def test_bco_steps_equal_prefzoos_own_bco_on_the_same_batches(trl_model_dir, start_params, tmp_path):
    """TRL 1.16 has no BCO trainer (it left TRL after 1.13): the adapter's ``bco`` is compared with prefzoo's own
    log-probs and loss on the same batches, 3 SGD steps, so the running reward mean δ moves between steps."""
    rows = make_unpaired(12, seed=3)
    ours, log, trainer = train(trl_model_dir, tmp_path, rows, adapter=True, kind="kto", loss="bco")
    assert not trainer.calculate_KL  # bco declares no KL reference
    theirs, state = _prefzoo_bco_steps(trl_model_dir, trainer, 3, lr=0.5)
    assert max_rel_diff(ours, theirs, start_params) <= 1e-5
    # δ after 3 steps; TRL's fused LM head and prefzoo's sequence_logps agree to ~1e-7 relative in float64
    assert float(state["delta"]) != 0.0 and float(trainer.prefzoo_loss.state["delta"]) == pytest.approx(
        float(state["delta"]), rel=1e-5
    )
    assert log[-2]["bco/delta"] == pytest.approx(float(state["delta"]), rel=1e-6)


def test_evaluation_logs_eval_metrics_and_leaves_bcos_running_mean(trl_model_dir, tmp_path):
    """In evaluation (no gradient) the loss is computed and logged under eval_ names, and δ does not advance."""
    import datasets

    _, _, trainer = train(trl_model_dir, tmp_path, make_unpaired(12, seed=3), adapter=True, kind="kto", loss="bco",
                          max_steps=2)  # fmt: skip
    before = trainer.prefzoo_loss.state_dict()
    metrics = trainer.evaluate(datasets.Dataset.from_list(make_unpaired(4, seed=5)))
    assert trainer.prefzoo_loss.state_dict()["delta"] == before["delta"] and float(before["delta"]) != 0.0
    assert {"eval_loss", "eval_bco/delta", "eval_rewards/chosen", "eval_logps/rejected", "eval_kl"} <= set(metrics)
    assert metrics["eval_bco/delta"] == pytest.approx(float(before["delta"]), rel=1e-6)


def _construct(tmp_path, loss, loss_params=None, **cfg):
    """The adapter on a model path that does not exist: an error about the loss must come before loading."""
    import datasets

    from prefzoo.integrations.trl import KTOTrainer

    ds = datasets.Dataset.from_list([{"prompt": "a", "completion": "b", "label": True}])
    return KTOTrainer(str(tmp_path / "no-model"), None, config(tmp_path, "kto", **cfg), train_dataset=ds, loss=loss,
                      loss_params=loss_params)  # fmt: skip


@pytest.mark.parametrize(
    ("loss", "loss_params", "cfg", "expected"),
    [
        ("dpo", None, {}, "loss 'dpo' takes pair batches, but TRL's KTOTrainer gives unpaired (completion, label) "
                          "examples only: use prefzoo.integrations.trl.DPOTrainer"),
        ("mmpo-list", None, {}, "loss 'mmpo-list' takes list batches, but TRL's KTOTrainer gives unpaired"),
        ("0.5*kto + 0.5*dpo", None, {}, "cannot combine 0.5*kto + 0.5*dpo: its terms take no batch shape in common"),
        ("kto", None, {"loss_type": "apo_zero_unpaired"}, "KTOConfig.loss_type='apo_zero_unpaired' does not apply"),
        ("bco", None, {"desirable_weight": 2.0}, "KTOConfig.desirable_weight=2.0 has no meaning for loss 'bco'"),
        ("kto", {"beta": 0.5}, {"beta": 0.2}, "KTOConfig.beta=0.2 and loss_params['beta']=0.5 disagree"),
        ("kto", {"beta": -1.0}, {}, "'beta' = -1.0 must be > 0.0"),
    ],
)
def test_a_bad_loss_argument_is_one_line_before_loading(tmp_path, loss, loss_params, cfg, expected):
    with pytest.raises(LossParamError) as excinfo:
        _construct(tmp_path, loss, loss_params, **cfg)
    text = str(excinfo.value)
    assert "\n" not in text and expected in text, text


def test_kto_config_fields_of_the_same_meaning_reach_the_loss():
    from pathlib import Path

    from prefzoo.integrations.trl import resolve_unpaired_loss

    loss = resolve_unpaired_loss("kto", None, config(Path("unused"), "kto", beta=0.3, undesirable_weight=1.2))
    assert (loss.params.beta, loss.params.desirable_weight, loss.params.undesirable_weight) == (0.3, 1.0, 1.2)
    assert resolve_unpaired_loss("bco", None, config(Path("unused"), "kto")).params.beta == 0.1  # KTOConfig's β
