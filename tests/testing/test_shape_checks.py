"""The kit's checks for lists and unpaired completions called one by one (prefzoo/testing/properties_shapes.py): the
failures each states, the losses each must leave alone, and its helpers."""

from __future__ import annotations

import dataclasses

import pytest
import torch

import prefzoo
from prefzoo.testing import properties_shapes as S
from prefzoo.testing.properties import PropertyFailure
from prefzoo.types import GroupBatch, UnpairedBatch
from tests.testing._probes import changed, probe_loss

F = torch.float64


def _groups(**kw) -> GroupBatch:
    g = torch.tensor([[-1.0, -2.0, -3.0], [-2.0, -1.0, -4.0]], dtype=F)
    scores = torch.tensor([[3.0, 2.0, 1.0], [1.0, 3.0, 2.0]], dtype=F)
    return GroupBatch(**{"policy_logps": g, "ref_logps": g - 0.5, "scores": scores, **kw})


def _unpaired() -> UnpairedBatch:
    z = torch.tensor([-1.0, -2.0, -3.0, -1.5], dtype=F)
    return UnpairedBatch(policy_logps=z, labels=torch.tensor([True, False, True, False]), ref_logps=z - 0.5,
                         kl_policy_logps=z - 1.0, kl_ref_logps=z - 1.2)  # fmt: skip


def test_fresh_gives_leaves_and_only_the_differentiable_fields_require_grad():
    """ref_logps and scores are inputs, not parameters: fresh() makes every float field a new leaf of the dtype
    asked for, and only the GRAD_FIELDS require grad (none with requires_grad=False)."""
    for batch in (_groups(), _unpaired()):
        given = {n for n in type(batch).FLOAT_FIELDS if getattr(batch, n) is not None}
        assert {"ref_logps", "policy_logps"} <= given  # scores (groups) and KL fields (unpaired) besides
        for requires_grad in (True, False):
            f = S.fresh(batch, torch.float32, requires_grad=requires_grad)
            tensors = {n: getattr(f, n) for n in given}
            assert all(t.dtype == torch.float32 and t.grad_fn is None for t in tensors.values())
            assert {n for n, t in tensors.items() if t.requires_grad} == ({"policy_logps"} if requires_grad else set())


def test_finite_names_the_first_non_finite_entry():
    both = changed("dpo-pl", losses=lambda b, o: o.losses.abs() * torch.tensor([float("nan"), float("inf")], dtype=F))
    with pytest.raises(PropertyFailure) as e:
        S.check_shape_finite(probe_loss(both, "dpo-pl"), _groups())
    assert str(e.value) == "probe: losses[0] = nan is not finite (dtype torch.float64)"


def test_finite_names_a_non_finite_per_completion_reward_as_rewards():
    """Losses and the chosen/rejected scores finite, one entry of the per-completion ``rewards`` not: the failure
    names that field and index."""

    def one_inf(b, o):
        r = o.rewards.clone()
        r[1, 1] = float("inf")
        return r

    with pytest.raises(PropertyFailure) as e:
        S.check_shape_finite(probe_loss(changed("dpo-pl", rewards=one_inf), "dpo-pl"), _groups())
    assert str(e.value) == "probe: rewards[1, 1] = inf is not finite (dtype torch.float64)"
    S.check_shape_finite(prefzoo.get_loss("dpo-pl"), _groups())


def test_finite_passes_a_loss_that_reports_no_per_completion_rewards():
    """``rewards`` is optional: a list or unpaired loss that leaves it out (a plugin's may) passes when the rest is
    finite, and a non-finite loss is still named."""
    S.check_shape_finite(probe_loss(changed("dpo-pl", rewards=lambda b, o: None), "dpo-pl"), _groups())
    S.check_shape_finite(probe_loss(changed("kto", rewards=lambda b, o: None), "kto"), _unpaired())
    nan = changed("dpo-pl", rewards=lambda b, o: None, losses=lambda b, o: o.losses * float("nan"))
    with pytest.raises(PropertyFailure, match=r"^probe: losses\[0\] = nan is not finite"):
        S.check_shape_finite(probe_loss(nan, "dpo-pl"), _groups())


def test_shape_fails_when_the_losses_were_cut_from_the_graph():
    cut = changed("dpo-pl", losses=lambda b, o: o.losses.detach())
    with pytest.raises(PropertyFailure) as e:
        S.check_shape_shape(probe_loss(cut, "dpo-pl"), _groups())
    assert str(e.value) == "probe: losses do not require grad although policy log-probs do: the graph was cut"
    S.check_shape_shape(prefzoo.get_loss("dpo-pl"), _groups())


def test_detached_fails_on_a_metric_that_keeps_the_graph():
    leaky = changed("dpo-pl", metrics=lambda b, o: {"m": o.losses.sum()})
    with pytest.raises(PropertyFailure) as e:
        S.check_shape_detached(probe_loss(leaky, "dpo-pl"), _groups())
    assert str(e.value) == "probe: metrics['m'] requires grad; return it .detach()ed"


def test_shape_grads_is_empty_when_the_losses_do_not_require_grad():
    const = changed("dpo-pl", losses=lambda b, o: torch.zeros(2, dtype=F))
    out, g = S.shape_grads(probe_loss(const, "dpo-pl"), S.fresh(_groups()))
    assert g == {} and torch.equal(out.losses, torch.zeros(2, dtype=F))
    out, g = S.shape_grads(prefzoo.get_loss("dpo-pl"), S.fresh(_groups()))
    assert sorted(g) == ["policy_logps"]


def test_taking_groups_takes_their_ids_and_taking_completions_keeps_them():
    b = _groups(example_ids=("g0", "g1"))
    by_group = S._take(b, torch.tensor([1, 0]))
    assert by_group.example_ids == ("g1", "g0") and by_group.policy_logps[0].tolist() == [-2.0, -1.0, -4.0]
    by_slot = S._take(b, torch.tensor([2, 0, 1]), dim=1)
    assert by_slot.example_ids == ("g0", "g1") and by_slot.policy_logps[0].tolist() == [-3.0, -1.0, -2.0]


def test_decoupled_is_checked_only_for_losses_not_declared_coupled():
    coupled = changed("dpo-pl", losses=lambda b, o: o.losses + 0.1 * torch.tanh(b.policy_logps.detach().mean()))
    with pytest.raises(PropertyFailure):
        S.check_shape_decoupled(probe_loss(coupled, "dpo-pl"), _groups())
    S.check_shape_decoupled(probe_loss(coupled, "dpo-pl", batch_coupled=True), _groups())


def test_list_monotone_is_checked_only_where_it_is_declared():
    wrong_way = changed("dpo-pl", losses=lambda b, o: o.losses + 5.0 * b.policy_logps[:, 0])  # best pushed down
    with pytest.raises(PropertyFailure):
        S.check_list_monotone(probe_loss(wrong_way, "dpo-pl"), _groups())
    S.check_list_monotone(probe_loss(wrong_way, "dpo-pl", monotone=False), _groups())


def test_list_monotone_tolerates_rounding_of_the_batchs_own_dtype_only():
    """A gradient of 1e-9 the wrong way on every completion: far above float64's rounding, so a failure in float64;
    1e-6 in float32 is at float32's rounding level (the tolerance is 64 units of the dtype's roundoff, scaled), so no
    failure there. Each dtype is judged by its own unit: float32's in float64 would let the first pass, float64's in
    float32 would fail the second."""

    def tilted(eps):
        return changed("dpo-pl", losses=lambda b, o: eps * b.policy_logps.sum(1))  # ∂L/∂log π = eps everywhere

    with pytest.raises(PropertyFailure, match=r"^probe: ∂L/∂log π of group 0's best completion \(slot 0\) is 1e-09 "):
        S.check_list_monotone(probe_loss(tilted(1e-9), "dpo-pl"), _groups())
    g = _groups()
    b32 = GroupBatch(policy_logps=g.policy_logps.float(), ref_logps=g.ref_logps.float(), scores=g.scores.float())
    S.check_list_monotone(probe_loss(tilted(1e-6), "dpo-pl"), b32)


def test_unpaired_monotone_is_checked_only_where_it_is_declared():
    wrong_way = changed("kto", losses=lambda b, o: o.losses + 5.0 * b.policy_logps)  # every completion pushed down
    with pytest.raises(PropertyFailure):
        S.check_unpaired_monotone(probe_loss(wrong_way, "kto"), _unpaired())
    S.check_unpaired_monotone(probe_loss(wrong_way, "kto", monotone=False), _unpaired())


def test_permutation_is_compared_in_float64_so_float32_rounding_of_a_coupled_sum_is_not_a_failure():
    """A sound batch-coupled loss adding a running sum over the batch, in batch order: in float32 the sum of
    (−1, 1e8, −1e8, 0) is 0 in this order and −1 in the check's permutation of 4 groups (2, 1, 3, 0) (−1 + 1e8 rounds
    to 1e8), in float64 −1 in both.  The check casts to float64, so a float32 batch of this loss passes; compared in
    float32 it would fail by 1e-3."""

    def coupled(batch, p, ctx):
        out = prefzoo.loss_spec("dpo-pl").fn(batch, p, ctx)
        x = (batch.policy_logps[:, 0] - batch.policy_logps[:, 1]).detach()
        total = x[0]
        for v in x[1:]:  # in the batch's order, on purpose
            total = total + v
        return dataclasses.replace(out, losses=out.losses + 1e-3 * total)

    loss = probe_loss(coupled, "dpo-pl", batch_coupled=True)
    g = torch.tensor([[-1.0, 0.0], [0.0, -1e8], [-1e8, 0.0], [0.0, 0.0]], dtype=torch.float32)
    assert torch.randperm(4, generator=torch.Generator().manual_seed(4)).tolist() == [2, 1, 3, 0]  # the check's
    S.check_shape_permutation(loss, GroupBatch(policy_logps=g, ref_logps=g.clone()))


def test_shape_reports_an_output_of_the_wrong_shape_as_the_contracts_message():
    one_short = changed("dpo-pl", losses=lambda b, o: o.losses[:1])
    with pytest.raises(PropertyFailure) as e:
        S.check_shape_shape(probe_loss(one_short, "dpo-pl"), _groups())
    assert str(e.value) == "loss 'probe' (plugin 'tests') returned losses of shape (1,); expected (2,), one per group"
