"""prefzoo.nn takes losses registered by a plugin (read through their declared shapes and needs, never a name), and
refuses a malformed call with one line naming the argument."""

from __future__ import annotations

import types
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest
import torch
import torch.nn.functional as F

from prefzoo import registry
from prefzoo.hookspecs import hookimpl
from prefzoo.nn import FusedInputError, FusedLinearPreferenceLoss, fused_sequence_logps
from prefzoo.spec import LossParams, LossSpec, param
from prefzoo.types import LossOutput, Need, Shape
from tests.nn.reference import IGNORE, group_batch, pair_batch, token_scores, unpaired_batch
from tests.nn.test_fused_loss import make_rows, run_both


@dataclass(frozen=True, kw_only=True)
class _Beta(LossParams):
    beta: float = param(0.5, "reward scale", gt=0)


def _token_margin(batch: Any, p: _Beta, ctx: Any) -> LossOutput:
    """Pairs: −log σ(β·(mean_t log π(y_w,t) − mean_t log π(y_l,t)) − (log π_ref(y_w) − log π_ref(y_l)))."""
    w = (batch.policy_chosen_token_logps * batch.chosen_mask).sum(1) / batch.chosen_mask.sum(1)  # (B,)
    l = (batch.policy_rejected_token_logps * batch.rejected_mask).sum(1) / batch.rejected_mask.sum(1)
    m = p.beta * (w - l) - (batch.ref_chosen_logps - batch.ref_rejected_logps)  # (B,)
    return LossOutput(losses=-F.logsigmoid(m), chosen_rewards=w.detach(), rejected_rewards=l.detach())


def _list_softmax(batch: Any, p: _Beta, ctx: Any) -> LossOutput:
    """Lists: −log softmax(β · log π / |z|)[best] over each group's real slots (column 0 is the best)."""
    s = p.beta * batch.policy_logps / batch.lengths.clamp(min=1)  # (G, K)
    s = s.masked_fill(~batch.mask, float("-inf"))
    losses = -torch.log_softmax(s, dim=1)[:, 0]  # (G,)
    return LossOutput(losses=losses, chosen_rewards=s[:, 0].detach(), rejected_rewards=s[:, 1].detach())


def _unpaired_entropy(batch: Any, p: _Beta, ctx: Any) -> LossOutput:
    """Unpaired: −log σ(±β·(log π − log π_ref)) + 0.1 · mean_t H_t."""
    sign = batch.labels.float() * 2 - 1  # (N,)
    ent = (batch.token_entropies * batch.token_mask).sum(1) / batch.token_mask.sum(1)  # (N,)
    r = p.beta * (batch.policy_logps - batch.ref_logps)  # (N,)
    losses = -F.logsigmoid(sign * r) + 0.1 * ent  # (N,)
    return LossOutput(losses=losses, chosen_rewards=r.detach(), rejected_rewards=r.detach())


def _spec(name: str, fn: Any, needs: set[Need], shape: Shape) -> LossSpec:
    return LossSpec(name=name, fn=fn, params_cls=_Beta, family="test", formula=fn.__doc__, paper="tests",
                    scores="s", needs=frozenset(needs), shapes=frozenset({shape}))  # fmt: skip


@hookimpl
def prefzoo_register_losses() -> list[LossSpec]:
    return [
        _spec("acme-token-margin", _token_margin, {Need.TOKEN_LOGPS, Need.REFERENCE}, Shape.PAIR),
        _spec("acme-list-softmax", _list_softmax, {Need.LENGTHS}, Shape.LIST),
        _spec("acme-unpaired-entropy", _unpaired_entropy, {Need.REFERENCE, Need.TOKEN_ENTROPIES}, Shape.UNPAIRED),
    ]


@pytest.fixture
def acme() -> Iterator[None]:
    """A plugin (an extra pluggy registration, as an entry point would add) installed as the process's registry."""
    plugin = types.SimpleNamespace(prefzoo_register_losses=prefzoo_register_losses)
    registry.reset_registry(registry.build_registry(extra_plugins=[("acme", plugin)], autoload=False))
    yield
    registry.reset_registry()


def test_plugin_losses_of_every_shape_match_the_unfused_computation(acme) -> None:
    labels = torch.tensor([True, False, False, True, True])
    run_both("acme-token-margin", {"beta": 0.7}, 4, pair_batch, {})
    run_both("acme-list-softmax", {}, 9, lambda f: group_batch(f, 3), {"group_size": 3})
    run_both("acme-unpaired-entropy", {}, 5, lambda f: unpaired_batch(f, labels), {"labels": labels}, softcap=4.0)


def test_fused_sequence_logps_are_the_unfused_row_sums() -> None:
    w, x, _, target = make_rows(5)
    x = x.requires_grad_()
    got = fused_sequence_logps(w, x, target, softcap=2.0)
    want = token_scores(w, x, target, softcap=2.0)["lp"].sum(1)
    torch.testing.assert_close(got, want.float(), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(torch.autograd.grad(got.sum(), x)[0], torch.autograd.grad(want.sum(), x)[0].float())


def _call(loss: str = "dpo", rows: int = 4, **change: Any) -> None:
    w, x, ref_x, target = make_rows(rows)
    kw: dict[str, Any] = {"lin_weight": w, "_input": x, "target": target, "ref_input": ref_x}
    kw.update(change)
    FusedLinearPreferenceLoss(loss)(**kw)


def _empty_row(target: torch.Tensor) -> torch.Tensor:
    t = target.clone()
    t[2] = IGNORE
    return t


w0, x0, r0, t0 = make_rows(4)
BAD_CALLS = [
    ("lin_weight", {"lin_weight": w0[0]}),
    ("_input", {"_input": x0[0]}),
    ("_input", {"_input": x0[..., :5]}),
    ("target", {"target": t0.float()}),
    ("target", {"target": t0[:, :5]}),
    ("target", {"target": t0.clamp(min=0) + 100}),
    ("target", {"target": _empty_row(t0)}),
    ("bias", {"bias": torch.zeros(3)}),
    ("ref_input", {"ref_input": None}),
    ("ref_input", {"ref_input": r0[:, :5]}),
    ("ref_weight", {"ref_weight": w0[:, :3]}),
    ("ref_logps", {"ref_input": None, "ref_logps": torch.zeros(3)}),
    ("labels", {"labels": torch.ones(4, dtype=torch.bool)}),
    ("group_size", {"group_size": 4}),
    ("_input", {"_input": x0[:3], "target": t0[:3], "ref_input": r0[:3]}),
]


@pytest.mark.parametrize(("arg", "change"), BAD_CALLS, ids=[f"{a}-{i}" for i, (a, _) in enumerate(BAD_CALLS)])
def test_a_bad_argument_is_one_line_naming_it(arg, change) -> None:
    with pytest.raises(FusedInputError) as e:
        _call(**change)
    assert "\n" not in str(e.value) and arg in str(e.value), str(e.value)


@pytest.mark.parametrize(("loss", "arg", "change"), [
    ("kto", "labels", {}),
    ("kto", "labels", {"labels": torch.ones(3, dtype=torch.bool)}),
    ("kto", "kl_policy_logps", {"labels": torch.ones(4, dtype=torch.bool)}),
    ("dpo-pl", "scores", {"scores": torch.zeros(5)}),
    ("dpo-pl", "_input", {"group_size": 3}),
])  # fmt: skip
def test_a_shape_argument_is_one_line_naming_it(loss, arg, change) -> None:
    with pytest.raises(FusedInputError) as e:
        _call(loss, **change)
    assert "\n" not in str(e.value) and arg in str(e.value), str(e.value)
