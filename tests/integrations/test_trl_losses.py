"""Losses TRL does not have, through the adapter: MMPO's per-example loss, declared needs, metrics beside TRL's."""

from __future__ import annotations

import pytest
import torch

import prefzoo
from prefzoo.types import Need
from tests.integrations.trl_support import make_pairs, train


class Recording:
    """Wraps a bound prefzoo loss: keeps every batch it was called on and what it returned."""

    def __init__(self, loss):
        self.loss, self.calls = loss, []

    def __getattr__(self, name):
        return getattr(self.loss, name)

    def __call__(self, batch, gather=None):
        out = self.loss(batch, gather=gather)
        self.calls.append((batch, out))
        return out


def _recorded_run(model_dir, tmp_path, loss, **cfg):
    from prefzoo.integrations.trl import dpo as integration

    recorders = []
    real = integration.resolve_loss

    def recording_resolve(*a, **k):
        recorders.append(Recording(real(*a, **k)))
        return recorders[-1]

    mp = pytest.MonkeyPatch()
    mp.setattr(integration, "resolve_loss", recording_resolve)
    try:
        _, log, trainer = train(model_dir, tmp_path, make_pairs(8, seed=2), adapter=True, loss=loss, **cfg)
    finally:
        mp.undo()
    return recorders[0], log, trainer


def test_mmpo_per_example_loss_is_prefzoos_on_prefzoos_log_probs(trl_model_dir, tmp_path):
    """One step of loss='mmpo': TRL's forward gives prefzoo's own log-probs, and the loss is prefzoo's on them."""
    from transformers import AutoModelForCausalLM

    from prefzoo.model.logps import sequence_logps

    rec, log, trainer = _recorded_run(trl_model_dir, tmp_path / "run", "mmpo", max_steps=1, beta=0.3)
    batch, out = rec.calls[0]
    assert rec.loss.params.beta == 0.3  # DPOConfig.beta, the same meaning
    # prefzoo's log-prob function on the same collated rows, with the untrained model (policy = reference at step 1)
    inputs = trainer.data_collator([trainer.train_dataset[i] for i in range(len(trainer.train_dataset))])
    model = AutoModelForCausalLM.from_pretrained(trl_model_dir, dtype=torch.float64)
    with torch.no_grad():
        ours = sequence_logps(model, inputs["input_ids"], inputs["attention_mask"], inputs["completion_mask"]).logps
    seen = torch.cat([batch.policy_chosen_logps, batch.policy_rejected_logps]).detach()  # (2B,)
    # each of TRL's log-probs is one of prefzoo's (the trainer shuffled the rows)
    gap = (seen[:, None] - ours.to(seen.dtype)[None, :]).abs().min(dim=1).values / seen.abs()
    assert float(gap.max()) < 1e-6, gap
    assert torch.allclose(batch.ref_chosen_logps, batch.policy_chosen_logps.detach(), rtol=1e-10)
    # prefzoo's mmpo on those log-probs (the trainer's reduction: the mean) is the step's loss
    expected = prefzoo.get_loss("mmpo", beta=0.3)(batch)
    assert torch.allclose(out.losses, expected.losses, rtol=1e-10)
    assert log[0]["loss"] == pytest.approx(float(expected.losses.mean()), rel=1e-6)
    # MMPO's diagnostics and gradient weight, logged beside TRL's metrics under the loss's own prefix
    for key in ("mmpo/weight_chosen", "mmpo/reward_min", "mmpo/reward_max"):
        assert log[0][key] == pytest.approx(float(expected.metrics[key]), rel=1e-6), key
    assert {"rewards/chosen", "logps/chosen", "entropy", "mean_token_accuracy"} <= log[0].keys()
    ev = trainer.evaluate(trainer.train_dataset)  # eval: TRL's eval_ prefix on prefzoo's metrics too
    assert {"eval_mmpo/weight_chosen", "eval_rewards/margins", "eval_loss"} <= ev.keys()


@pytest.mark.parametrize("loss", ["mmpo-entropy", "simpo", "mmpo-list"])  # mmpo-list: pairs as K = 2 groups
def test_the_batch_holds_what_the_loss_declares(trl_model_dir, tmp_path, loss):
    """Token-level tensors only for a loss that needs them, the reference only for one that needs it."""
    rec, log, _ = _recorded_run(trl_model_dir, tmp_path / loss, loss, max_steps=1)
    batch, _ = rec.calls[0]
    needs = prefzoo.loss_spec(loss).needs
    assert (batch.policy_chosen_token_logps is not None) == (Need.TOKEN_LOGPS in needs)
    assert (batch.chosen_token_entropies is not None) == (Need.TOKEN_ENTROPIES in needs)
    assert batch.has_reference == (Need.REFERENCE in needs)
    assert (batch.chosen_lengths is not None) == (Need.LENGTHS in needs)
    if Need.TOKEN_LOGPS in needs:  # TRL's per-token log-probs sum to its sequence log-probs; the mask marks y
        assert torch.allclose(batch.policy_chosen_token_logps.sum(-1), batch.policy_chosen_logps)
        assert bool((batch.policy_chosen_token_logps[~batch.chosen_mask] == 0).all())
        assert batch.chosen_token_entropies.requires_grad  # the entropy term trains the model
    if Need.LENGTHS in needs:  # completion token counts, as TRL's mask
        assert bool((batch.chosen_lengths > 0).all())
    assert torch.isfinite(torch.tensor(log[0]["loss"]))


def test_a_weighted_sum_and_a_loss_object(trl_model_dir, tmp_path):
    """'0.8*dpo + 0.2*sft' and a bound prefzoo.Loss are accepted; each term's loss is logged beside TRL's."""
    rec, log, _ = _recorded_run(trl_model_dir, tmp_path / "sum", "0.8*dpo + 0.2*sft", max_steps=1)
    batch, out = rec.calls[0]
    dpo, sft = (prefzoo.get_loss(n)(batch).losses.mean() for n in ("dpo", "sft"))
    assert float(out.losses.mean()) == pytest.approx(float(0.8 * dpo + 0.2 * sft), rel=1e-10)
    assert log[0]["dpo/loss"] == pytest.approx(float(dpo), rel=1e-6)
    assert log[0]["sft/loss"] == pytest.approx(float(sft), rel=1e-6)
    rec2, _, _ = _recorded_run(trl_model_dir, tmp_path / "obj", prefzoo.get_loss("simpo", beta=2.5), max_steps=1)
    assert rec2.loss.params.beta == 2.5 and rec2.calls
