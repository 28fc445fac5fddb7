"""Batch invariance and gradient accumulation.

Batch-decoupled losses: the mean over a batch equals the mean of equal micro-batch
means, so gradient accumulation over micro-batches gives the full-batch gradient.

Batch-coupled losses (mmpo family: min/max normalization; aot: sorting) see only
their micro-batch unless the trainer gathers across accumulation steps, so
accumulation changes them:
  * mmpo, mmpo-length-norm: the loss VALUE changes (R̂ uses the micro-batch min/max)
    but the gradient does not (it is −∇log π(y_w) whatever R̂ is);
  * mmpo-no-aux: value and gradient change (the σ(s_w − s_l) weights see a different R̂);
  * aot, aot-unpaired: value and gradient change (the sorted pairing is per micro-batch);
  * rpo (and sft, cpo, cpo-*, orpo with nll_reduction="batch-tokens"): value and gradient change (the NLL is
    divided by the micro-batch's chosen token count).
"""

from __future__ import annotations

import pytest
import torch
from hypothesis import given

import prefzoo
from prefzoo.testing import batches_for, cast_batch, grads, loss_params, shard_batch

# unpaired losses: tests/properties/test_unpaired.py
PAIRWISE = [n for n in prefzoo.list_losses() if prefzoo.loss_spec(n).accepts(prefzoo.Shape.PAIR)]
DECOUPLED = [n for n in PAIRWISE if prefzoo.loss_spec(n).batch_coupled is not True]  # for some params
COUPLED = [n for n in PAIRWISE if prefzoo.get_loss(n).batch_coupled]  # with default params


@pytest.mark.parametrize("name", DECOUPLED)
def test_mean_equals_mean_of_micro_batch_means(name):
    spec = prefzoo.loss_spec(name)

    decoupled = loss_params(spec).filter(lambda p: not spec.is_batch_coupled(p))  # e.g. nll_reduction="example"

    @given(batch=batches_for(spec, dtypes=("float64",), min_size=2), params=decoupled)
    def run(batch, params):
        loss = prefzoo.Loss(spec, params)
        n = batch.batch_size - batch.batch_size % 2
        b = cast_batch(shard_batch(batch, [n, batch.batch_size - n])[0] if n < batch.batch_size else batch)
        out, g = grads(loss, b)
        halves = shard_batch(b, [n // 2, n // 2])
        micro = [grads(loss, cast_batch(h)) for h in halves]
        mean_of_means = sum(o.losses.detach().mean() for o, _ in micro) / 2
        torch.testing.assert_close(mean_of_means, out.losses.detach().mean(), rtol=1e-12, atol=1e-12)
        for k in g:  # gradient of the mean = accumulated micro-batch mean gradients / number of micro-batches
            acc = torch.cat([gm[k] for _, gm in micro]) / 2 / (n // 2)
            torch.testing.assert_close(acc, g[k] / n, rtol=1e-12, atol=1e-15)

    run()


def _batch():
    f = lambda xs: torch.tensor(xs, dtype=torch.float64)  # noqa: E731
    return prefzoo.PreferenceBatch(
        f([-5.0, -9.0, -2.0, -7.0]), f([-6.0, -3.0, -8.0, -1.0]), f([-50.0, -1.0, -20.0, -4.0]),
        f([-10.0, -30.0, -2.0, -60.0]), torch.tensor([3, 5, 2, 7]), torch.tensor([4, 1, 6, 2]))


def _full_and_accumulated(name):
    loss = prefzoo.get_loss(name)
    full, gf = grads(loss, cast_batch(_batch()))
    parts = [grads(loss, cast_batch(p)) for p in shard_batch(_batch(), [2, 2])]
    acc_loss = torch.cat([o.losses.detach() for o, _ in parts])
    acc_grad = torch.cat([g["policy_chosen_logps"] for _, g in parts])
    return full.losses.detach(), gf["policy_chosen_logps"], acc_loss, acc_grad


@pytest.mark.parametrize("name", ["mmpo", "mmpo-length-norm", "mmpo-list"])
def test_accumulation_changes_mmpo_value_but_not_gradient(name):
    lf, gf, la, ga = _full_and_accumulated(name)
    assert float((lf - la).abs().max()) > 1e-3
    torch.testing.assert_close(ga, gf, rtol=0, atol=1e-12)


@pytest.mark.parametrize("name", ["mmpo-no-aux", "aot", "aot-unpaired", "mml", "rpo"])
def test_accumulation_changes_value_and_gradient(name):
    lf, gf, la, ga = _full_and_accumulated(name)
    assert float((lf - la).abs().max()) > 1e-6 and float((gf - ga).abs().max()) > 1e-6


def test_every_coupled_loss_is_documented_here():
    assert set(COUPLED) <= {"mmpo", "mmpo-no-aux", "mmpo-length-norm", "mmpo-entropy", "aot", "aot-unpaired", "mml",
                            "mmpo-list", "rpo"}
