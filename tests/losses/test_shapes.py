"""The three batch shapes: GroupBatch / UnpairedBatch validation, the shape declaration, lists <-> pairs."""

from __future__ import annotations

import dataclasses
import re

import pytest
import torch

import prefzoo
from prefzoo import (
    GroupBatch,
    GroupBatchError,
    LossOutput,
    LossSpec,
    PreferenceBatch,
    PreferenceBatchError,
    Shape,
    UnpairedBatch,
    UnpairedBatchError,
    group_from_pairs,
    pairs_from_lists,
)
from prefzoo.losses.shapes import pair_indices
from prefzoo.spec import Loss, LossOutputError, LossParams, check_output


def group(g=3, k=4, *, scores=None, mask=None, seed=0):
    gen = torch.Generator().manual_seed(seed)
    return GroupBatch(
        policy_logps=(-10 * torch.rand(g, k, generator=gen, dtype=torch.float64)).requires_grad_(),
        ref_logps=-10 * torch.rand(g, k, generator=gen, dtype=torch.float64),
        lengths=torch.randint(1, 50, (g, k), generator=gen),
        scores=scores,
        mask=mask,
    )


# --- validation: one line naming the field and the fix ---------------------------------------------------------


@pytest.mark.parametrize(
    ("kw", "match"),
    [
        ({"policy_logps": torch.zeros(3)}, r"GroupBatch.policy_logps must have shape \(G, K\) .*got \(3,\)"),
        ({"policy_logps": torch.zeros(3, 1)}, r"K >= 2 completions, got \(3, 1\)"),
        ({"ref_logps": torch.zeros(3, 3)}, r"GroupBatch.ref_logps has shape \(3, 3\) but policy_logps implies"),
        ({"scores": torch.tensor([[1.0, float("nan")]] * 3)}, r"GroupBatch.scores\[0, 1\] is nan: .*finite filler"),
        ({"lengths": torch.tensor([[1, 0]] * 3)}, r"GroupBatch.lengths\[0, 1\] = 0: .*positive"),
        ({"lengths": torch.full((3, 2), 1.5)}, r"GroupBatch.lengths must hold whole token counts"),
        ({"lengths": torch.ones(3, 2, dtype=torch.bool)}, r"GroupBatch.lengths must hold whole token counts"),
        ({"lengths": torch.ones(3, 2, dtype=torch.complex64)}, r"GroupBatch.lengths must hold whole token counts"),
        ({"mask": torch.ones(3, 2)}, r"GroupBatch.mask must be a bool tensor"),
        ({"mask": torch.tensor([[True, True], [True, False], [True, True]])}, r"GroupBatch.mask\[1\] leaves 1"),
        ({"token_mask": torch.ones(3, 2)}, r"^GroupBatch.token_mask must have shape \(G, K, T\) .*, got \(3, 2\)$"),
        ({"token_entropies": [[[0.0]]] * 3}, r"^GroupBatch.token_entropies must have shape \(G, K, T\) .*, got list$"),
        ({"example_ids": ("a",)}, r"GroupBatch.example_ids has 1 ids for G = 3"),
    ],
)
def test_group_batch_errors_name_the_field(kw, match):
    fields = {"policy_logps": torch.zeros(3, 2), **kw}
    with pytest.raises(GroupBatchError, match=match) as e:
        GroupBatch(**fields)
    assert "\n" not in str(e.value) and isinstance(e.value, PreferenceBatchError)


def test_group_batch_padding_may_hold_zero_lengths():
    mask = torch.tensor([[True, True, False]])
    g = GroupBatch(policy_logps=torch.zeros(1, 3), lengths=torch.tensor([[3, 4, 0]]), mask=mask)
    assert g.batch_size == 1 and g.group_size == 3 and g.valid.tolist() == [[True, True, False]]
    with pytest.raises(GroupBatchError, match=r"lengths\[0, 2\] = 0"):
        g.replace(mask=None)


@pytest.mark.parametrize(
    ("kw", "match"),
    [
        ({"labels": torch.tensor([1, 0])}, r"UnpairedBatch.labels must be a bool tensor \(True = desirable"),
        ({"labels": torch.tensor([True])}, r"UnpairedBatch.labels has shape \(1,\) but policy_logps implies \(2,\)"),
        ({"kl_ref_logps": torch.tensor([0.0, float("inf")])}, r"UnpairedBatch.kl_ref_logps\[1\] is inf"),
        ({"policy_logps": torch.zeros(2, 2)}, r"UnpairedBatch.policy_logps must have shape \(N,\)"),
        ({"token_entropies": torch.zeros(3, 4)},
         r"^UnpairedBatch.token_entropies must have shape \(N, T\) with N = 2, got \(3, 4\)$"),
    ],
)
def test_unpaired_batch_errors_name_the_field(kw, match):
    fields = {"policy_logps": torch.zeros(2), "labels": torch.tensor([True, False]), **kw}
    with pytest.raises(UnpairedBatchError, match=match):
        UnpairedBatch(**fields)


@pytest.mark.parametrize("bad", [float("nan"), float("-inf")])
def test_pair_batch_non_finite_log_prob_names_the_field_the_example_and_the_fix(bad):
    want = (rf"^PreferenceBatch.policy_rejected_logps\[1\] \(example 'q'\) is {bad}: log-probs and entropies must be "
            r"finite; check the model's outputs and the completion mask$")  # fmt: skip
    with pytest.raises(PreferenceBatchError, match=want):
        PreferenceBatch(policy_chosen_logps=torch.zeros(2), policy_rejected_logps=torch.tensor([0.0, bad]),
                        example_ids=("p", "q"))  # fmt: skip


def test_ranking_scores_are_column_order_without_scores():
    assert group(1, 3).ranking_scores.tolist() == [[2.0, 1.0, 0.0]]
    padded = group(1, 4, mask=torch.tensor([[True, False, True, True]]))
    assert padded.ranking_scores[0, [0, 2, 3]].tolist() == [2.0, 1.0, 0.0]  # padding never counts
    s = torch.tensor([[0.5, 2.0, 1.0]], dtype=torch.float64)
    assert group(1, 3, scores=s).ranking_scores.tolist() == s.tolist()


# --- lists -> pairs -----------------------------------------------------------------------------------------------


def test_reductions_by_hand():
    """Scores [[1, 3, 3, 0], [2, 2, 2, 2], [5, 1, 4, pad]]: ties never pair, padding never pairs."""
    s = torch.tensor([[1.0, 3.0, 3.0, 0.0], [2.0, 2.0, 2.0, 2.0], [5.0, 1.0, 4.0, 0.0]], dtype=torch.float64)
    mask = torch.tensor([[True] * 4, [True] * 4, [True, True, True, False]])
    b = group(scores=s, mask=mask)
    trip = lambda how: list(zip(*(t.tolist() for t in pair_indices(b, how)), strict=True))  # noqa: E731
    assert trip("best-worst") == [(0, 1, 3), (2, 0, 1)]
    assert trip("best-vs-rest") == [(0, 1, 0), (0, 1, 3), (2, 0, 1), (2, 0, 2)]
    assert trip("all-pairs") == [(0, 0, 3), (0, 1, 0), (0, 1, 3), (0, 2, 0), (0, 2, 3), (2, 0, 1), (2, 0, 2), (2, 2, 1)]


@pytest.mark.parametrize("how", prefzoo.REDUCTIONS)
def test_pairs_from_lists_gathers_fields_and_gradients(how):
    b = group(4, 3, seed=2)
    pairs, gidx = pairs_from_lists(b, how)
    g, i, j = pair_indices(b, how)
    assert torch.equal(gidx, g)
    assert torch.equal(pairs.policy_chosen_logps, b.policy_logps[g, i])
    assert torch.equal(pairs.ref_rejected_logps, b.ref_logps[g, j])
    assert torch.equal(pairs.rejected_lengths, b.lengths[g, j])
    expected = {"best-worst": 4, "best-vs-rest": 8, "all-pairs": 12}[how]
    assert pairs.batch_size == expected
    out = prefzoo.get_loss("dpo", beta=0.5)(pairs)
    (grad,) = torch.autograd.grad(out.losses.sum(), b.policy_logps)
    assert bool((grad[:, 0] < 0).all())  # the best completion is only ever chosen: DPO pushes it up


@pytest.mark.parametrize("how", prefzoo.REDUCTIONS)
def test_pairs_from_lists_takes_every_token_level_field_and_id(how):
    """Each (G, K, T) field and each id reaches its pair: the winner's as chosen, the loser's as rejected."""
    g_, k_, t_ = 3, 4, 5
    gen = torch.Generator().manual_seed(7)
    b = GroupBatch(
        policy_logps=-10 * torch.rand(g_, k_, generator=gen, dtype=torch.float64),
        lengths=torch.full((g_, k_), t_),
        policy_token_logps=-torch.rand(g_, k_, t_, generator=gen, dtype=torch.float64),
        token_entropies=torch.rand(g_, k_, t_, generator=gen, dtype=torch.float64),
        token_mask=torch.rand(g_, k_, t_, generator=gen) < 0.7,
        example_ids=("p0", "p1", "p2"),
    )
    pairs, _ = pairs_from_lists(b, how)
    g, i, j = pair_indices(b, how)
    for pair_field, group_field in [
        ("policy_chosen_token_logps", "policy_token_logps"),
        ("chosen_token_entropies", "token_entropies"),
        ("chosen_mask", "token_mask"),
    ]:
        assert torch.equal(getattr(pairs, pair_field), getattr(b, group_field)[g, i]), pair_field
        rejected = pair_field.replace("chosen", "rejected")
        assert torch.equal(getattr(pairs, rejected), getattr(b, group_field)[g, j]), rejected
    assert pairs.example_ids == tuple(
        f"p{a}[{c}>{r}]" for a, c, r in zip(g.tolist(), i.tolist(), j.tolist(), strict=True)
    )


def test_all_tied_lists_give_no_pairs():
    b = group(2, 3, scores=torch.ones(2, 3, dtype=torch.float64))
    with pytest.raises(GroupBatchError, match="no group in this batch of 2 has two completions with different"):
        pairs_from_lists(b)
    with pytest.raises(
        prefzoo.LossParamError, match=r"unknown reduction 'worst'; use one of best-worst, all-pairs, best-vs-rest$"
    ):
        pairs_from_lists(b, "worst")  # type: ignore[arg-type]


def test_k2_round_trip_pairs_to_groups_and_back():
    gen = torch.Generator().manual_seed(0)
    pb = PreferenceBatch(
        policy_chosen_logps=-torch.rand(5, generator=gen),
        policy_rejected_logps=-torch.rand(5, generator=gen),
        ref_chosen_logps=-torch.rand(5, generator=gen),
        ref_rejected_logps=-torch.rand(5, generator=gen),
        chosen_lengths=torch.tensor([1, 2, 3, 4, 5]),
        rejected_lengths=torch.tensor([5, 4, 3, 2, 1]),
        policy_chosen_token_logps=-torch.rand(5, 3, generator=gen),
        policy_rejected_token_logps=torch.zeros(5, 2),
        chosen_mask=torch.ones(5, 3, dtype=torch.bool),
        rejected_mask=torch.ones(5, 2, dtype=torch.bool),
        example_ids=tuple("abcde"),
    )
    g = group_from_pairs(pb)
    assert g.group_size == 2 and g.token_mask is not None and g.token_mask.shape == (5, 2, 3)
    back, idx = pairs_from_lists(g, "best-worst")
    assert idx.tolist() == [0, 1, 2, 3, 4] and back.example_ids == tuple(f"{c}[0>1]" for c in "abcde")
    for f in (
        "policy_chosen_logps",
        "policy_rejected_logps",
        "ref_chosen_logps",
        "ref_rejected_logps",
        "chosen_lengths",
        "rejected_lengths",
        "policy_chosen_token_logps",
        "chosen_mask",
    ):
        assert torch.equal(getattr(back, f), getattr(pb, f)), f
    assert torch.equal(back.policy_rejected_token_logps[:, :2], pb.policy_rejected_token_logps)
    assert not bool(back.rejected_mask[:, 2].any())  # the padded token column stays masked


# --- the shape declaration ----------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True, kw_only=True)
class _NoParams(LossParams):
    pass


def _list_fn(batch, p, ctx):
    assert isinstance(batch, GroupBatch)
    s = torch.where(batch.valid, batch.policy_logps, -torch.inf)
    r = batch.policy_logps.detach()
    return LossOutput(-torch.logsumexp(s, dim=1), r[:, 0], r[:, -1], rewards=r)


def _spec(shapes, fn=_list_fn):
    return LossSpec(
        name="t", fn=fn, params_cls=_NoParams, family="t", formula="", paper="", scores="", shapes=frozenset(shapes)
    )


def test_existing_losses_declare_pairs_and_list_losses_take_pairs_as_k2():
    assert all(prefzoo.loss_spec(n).shapes == {Shape.PAIR} for n in ("dpo", "mmpo", "simpo", "orpo", "mpo"))
    loss = Loss(_spec({Shape.LIST}), _NoParams())
    pb = PreferenceBatch(
        policy_chosen_logps=torch.tensor([-1.0, -2.0]), policy_rejected_logps=torch.tensor([-3.0, 0.0])
    )
    out = loss(pb)
    assert torch.allclose(out.losses, -torch.logaddexp(pb.policy_chosen_logps, pb.policy_rejected_logps))
    assert out.rewards is not None and out.rewards.shape == (2, 2)


def test_wrong_shape_is_one_line_naming_the_fix():
    with pytest.raises(PreferenceBatchError, match=r"'dpo' takes a prefzoo.PreferenceBatch, got GroupBatch; reduce"):
        prefzoo.get_loss("dpo")(group())
    lst = Loss(_spec({Shape.LIST}), _NoParams())
    with pytest.raises(PreferenceBatchError, match=r"^loss 't' takes a prefzoo\.GroupBatch, got UnpairedBatch$"):
        lst(UnpairedBatch(policy_logps=torch.zeros(2), labels=torch.tensor([True, False])))
    with pytest.raises(PreferenceBatchError, match=r"needs reference: GroupBatch.ref_logps is None"):
        Loss(dataclasses.replace(_spec({Shape.LIST}), needs=frozenset({prefzoo.Need.REFERENCE})), _NoParams())(
            GroupBatch(policy_logps=torch.zeros(2, 3))
        )
    with pytest.raises(TypeError, match="shapes must be a non-empty set"):
        _spec(set())


def test_output_contract_per_shape():
    bad = Loss(
        _spec({Shape.LIST}, fn=lambda b, p, c: dataclasses.replace(_list_fn(b, p, c), rewards=torch.zeros(3))),
        _NoParams(),
    )
    with pytest.raises(LossOutputError, match=r"rewards of shape \(3,\); expected \(3, 4\), one per completion"):
        bad(group())
    short = Loss(
        _spec({Shape.LIST}, fn=lambda b, p, c: LossOutput(torch.zeros(1), torch.zeros(1), torch.zeros(1))), _NoParams()
    )
    with pytest.raises(LossOutputError, match=r"losses of shape \(1,\); expected \(3,\), one per group"):
        short(group())
    unpaired = UnpairedBatch(policy_logps=torch.zeros(2), labels=torch.tensor([True, False]))
    one = LossOutput(torch.zeros(1), torch.zeros(1), torch.zeros(1))
    with pytest.raises(LossOutputError, match=r"losses of shape \(1,\); expected \(2,\), one per completion$"):
        check_output("u", "me", one, unpaired)  # an unpaired batch's N completions, each scored on its own


def test_combination_of_a_list_loss_and_a_pair_loss_runs_on_pairs():
    lst = Loss(_spec({Shape.LIST}), _NoParams())
    combo = prefzoo.combine([(1.0, lst), (0.5, "sft")])
    assert combo.spec.shapes == {Shape.PAIR}
    pb = PreferenceBatch(
        policy_chosen_logps=torch.tensor([-1.0]),
        policy_rejected_logps=torch.tensor([-3.0]),
        chosen_lengths=torch.tensor([2]),
        rejected_lengths=torch.tensor([2]),
    )
    want = -torch.logaddexp(torch.tensor(-1.0), torch.tensor(-3.0)) + 0.5 * 0.5
    assert torch.allclose(combo(pb).losses, want.reshape(1))


# --- the LossOutput and state contracts: one line naming the loss, its plugin, the field and what was expected ---

WHO = "loss 'toy' (plugin 'me')"


@pytest.mark.parametrize(
    ("new", "old", "match"),
    [
        ({"m": torch.zeros(())}, None, "returned a state but declares none: set LossSpec.initial_state"),
        (None, {"m": torch.zeros(())},
         r"returned no state \(LossOutput.state\); a stateful loss returns its next state"),
        ({"m": torch.zeros(()), "x": torch.zeros(())}, {"m": torch.zeros(()), "n": torch.zeros(())},
         r"returned state keys \['m', 'x'\]: unknown \['x'\], missing \['n'\]"),
        ({"m": torch.zeros(2)}, {"m": torch.zeros(())}, r"returned state 'm' of shape \(2,\); expected \(\)"),
        ({"m": 0.5}, {"m": torch.zeros(())}, r"returned state 'm' of shape float; expected \(\)"),
    ],
)  # fmt: skip
def test_a_state_that_breaks_the_contract_is_named(new, old, match):
    from prefzoo.spec import check_state

    with pytest.raises(LossOutputError, match=rf"^{re.escape(WHO)} {match}$"):
        check_state("toy", "me", new, old)


def _output(**kw) -> LossOutput:
    z = torch.zeros(2)
    return LossOutput(**{"losses": z, "chosen_rewards": z, "rejected_rewards": z, **kw})


@pytest.mark.parametrize(
    ("out", "match"),
    [
        ("not an output", r"returned str, expected prefzoo.LossOutput"),
        (_output(losses=torch.zeros(3)), r"returned losses of shape \(3,\); expected \(2,\), one per pair"),
        (_output(rejected_rewards=[0.0, 0.0]),
         r"returned rejected_rewards of shape list; expected \(2,\), one per pair"),
        (_output(metrics=[("m", 1.0)]), r"returned metrics of type list; expected a dict"),
        (_output(rewards=torch.zeros(2)), r"returned rewards of shape \(2,\); expected \(2, 2\), one per completion"),
    ],
)  # fmt: skip
def test_an_output_that_breaks_the_contract_is_named(out, match):
    from prefzoo.spec import check_output

    pb = PreferenceBatch(policy_chosen_logps=torch.zeros(2), policy_rejected_logps=torch.zeros(2))
    with pytest.raises(LossOutputError, match=rf"^{re.escape(WHO)} {match}$"):
        check_output("toy", "me", out, pb)


def test_tensors_on_another_device_or_of_an_integer_dtype_are_named_with_the_fix():
    z = torch.zeros(2)
    with pytest.raises(PreferenceBatchError, match=r"^PreferenceBatch.ref_chosen_logps is on meta but "
                       r"policy_chosen_logps is on cpu: move it with .to\(\)$"):  # fmt: skip
        PreferenceBatch(policy_chosen_logps=z, policy_rejected_logps=z, ref_chosen_logps=torch.zeros(2, device="meta"))
    with pytest.raises(UnpairedBatchError, match=r"^UnpairedBatch.policy_logps must be a floating-point tensor, got "
                       r"torch.int64$"):  # fmt: skip
        UnpairedBatch(policy_logps=torch.zeros(2, dtype=torch.long), labels=torch.tensor([True, False]))
    with pytest.raises(UnpairedBatchError, match=r"^UnpairedBatch.example_ids has 1 ids for N = 2$"):
        UnpairedBatch(policy_logps=z, labels=torch.tensor([True, False]), example_ids=("a",))


def test_restoring_a_state_that_does_not_fit_the_loss_is_one_line():
    with pytest.raises(ValueError, match=r"^loss 'dpo' has no state, but the checkpoint holds \['delta'\]$"):
        prefzoo.get_loss("dpo").load_state_dict({"delta": torch.zeros(())})
    prefzoo.get_loss("dpo").load_state_dict({})  # nothing to restore: fine
    bco = prefzoo.get_loss("bco")
    with pytest.raises(ValueError, match=r"^cannot restore the state of loss 'bco': loss 'bco' \(plugin '[^']+'\) "
                       r"returned state keys \['delta'\]: unknown \[\], missing \['count'\]$"):  # fmt: skip
        bco.load_state_dict({"delta": torch.zeros(())})
