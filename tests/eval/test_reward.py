"""Reward accuracy with any registered loss's scores, checked against a naive log-prob computation."""

from __future__ import annotations

import pytest

from prefzoo.eval.reward import reward_accuracy

from .conftest import make_causal_lm


def _pairs(n: int = 24):
    import random

    import datasets

    rng = random.Random(0)
    rows = []
    for i in range(n):
        a, b = rng.randint(10, 49), rng.randint(10, 49)
        rows.append(
            {
                "id": str(i),
                "prompt": f"{a}+{b}=",
                "chosen": str(a + b),
                "rejected": str(a + b + rng.choice([-12, 1, 3, 105])),
            }
        )
    return datasets.Dataset.from_list(rows)


def _naive_logps(model, tok, prompt: str, completion: str) -> tuple[float, int]:
    import torch

    p = tok(prompt).input_ids
    c = [*tok(completion, add_special_tokens=False).input_ids, tok.eos_token_id]
    ids = torch.tensor([p + c])  # (1, T)
    with torch.no_grad():
        logp = model(input_ids=ids).logits[0, :-1].log_softmax(-1)  # (T-1, V)
    tok_lp = logp.gather(-1, ids[0, 1:, None]).squeeze(-1)  # (T-1,)
    return float(tok_lp[len(p) - 1 :].sum()), len(c)


def test_simpo_accuracy_matches_a_naive_computation() -> None:
    model, tok = make_causal_lm(0)
    data = _pairs()
    res = reward_accuracy(model, tok, data, "simpo", batch_size=5)
    expected = []
    for r in data:
        lw, nw = _naive_logps(model, tok, r["prompt"], r["chosen"])
        ll, nl = _naive_logps(model, tok, r["prompt"], r["rejected"])
        expected.append(lw / nw > ll / nl)  # SimPO's reward is the length-normalised log-prob (×β)
    assert res["reward_accuracy"] == pytest.approx(sum(expected) / len(expected))
    assert res["pairs"] == len(data) and res["dropped"] == 0
    assert 0 < res["reward_accuracy"] < 1  # a random model is neither always right nor always wrong here


def test_dpo_against_its_own_reference_is_all_ties_and_against_another_is_not() -> None:
    model, tok = make_causal_lm(0)
    other, _ = make_causal_lm(1)
    same = reward_accuracy(model, tok, _pairs(), "dpo", reference=model)
    assert same["reward_accuracy"] == 0.0 and same["tie_rate"] == 1.0 and same["mean_margin"] == 0.0
    diff = reward_accuracy(model, tok, _pairs(), "dpo", reference=other)
    assert diff["tie_rate"] == 0.0 and 0 < diff["reward_accuracy"] < 1


def test_reference_loss_without_reference_is_a_clear_error() -> None:
    model, tok = make_causal_lm(0)
    with pytest.raises(ValueError, match="pass reference="):
        reward_accuracy(model, tok, _pairs(), "dpo")


@pytest.mark.parametrize("loss", ["mmpo-entropy", "aot", "orpo"])
def test_token_level_and_batch_coupled_losses_work(loss: str) -> None:
    model, tok = make_causal_lm(0)
    res = reward_accuracy(model, tok, _pairs(), loss, reference=make_causal_lm(1)[0], batch_size=7)
    assert 0.0 <= res["reward_accuracy"] <= 1.0 and res["pairs"] == 24


def test_model_mode_is_restored() -> None:
    model, tok = make_causal_lm(0)
    model.train()
    reward_accuracy(model, tok, _pairs(4), "simpo")
    assert model.training
