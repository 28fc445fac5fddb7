"""The shaped checks' edges that a complete mutation run of prefzoo/testing/properties_shapes.py found untested: each
score named in a finite or detached failure, a reference leaked by a little, the reference-free check's own random
draw, and the list-monotone check's worst completion, its ties and its scale."""

from __future__ import annotations

import pytest
import torch

from prefzoo.testing import properties_shapes as S
from prefzoo.testing.properties import PropertyFailure
from prefzoo.types import GroupBatch, UnpairedBatch
from tests.testing._probes import changed, probe_loss
from tests.testing.test_shape_checks import _groups, _unpaired

F = torch.float64
NAN = float("nan")


@pytest.mark.parametrize("field", ["chosen_rewards", "rejected_rewards"])
def test_finite_names_a_non_finite_score(field):
    bad = changed("dpo-pl", **{field: lambda b, o, f=field: getattr(o, f) * torch.tensor([1.0, NAN], dtype=F)})
    with pytest.raises(PropertyFailure) as e:
        S.check_shape_finite(probe_loss(bad, "dpo-pl"), _groups())
    assert str(e.value) == f"probe: {field}[1] = nan is not finite (dtype torch.float64)"


@pytest.mark.parametrize("field", ["chosen_rewards", "rejected_rewards", "rewards"])
def test_detached_names_each_score_that_keeps_the_graph(field):
    def attached(b, o, f=field):
        t = getattr(o, f)
        return t + 0.0 * (b.policy_logps if f == "rewards" else b.policy_logps[:, 0])

    with pytest.raises(PropertyFailure) as e:
        S.check_shape_detached(probe_loss(changed("dpo-pl", **{field: attached}), "dpo-pl"), _groups())
    assert str(e.value) == f"probe: {field} requires grad; return it .detach()ed"
    S.check_shape_detached(probe_loss(changed("dpo-pl", rewards=lambda b, o: None), "dpo-pl"), _groups())


def _with_lengths() -> GroupBatch:
    return _groups(lengths=torch.tensor([[3, 4, 5], [2, 6, 1]]))


def _leaky(eps: float, base: str):
    """``base`` (reference-free) plus eps·Σ tanh(reference) where one is given: it reads the reference a little."""

    def losses(b, o):
        return o.losses if b.ref_logps is None else o.losses + eps * torch.tanh(b.ref_logps).sum(1)

    return probe_loss(changed(base, losses=losses), base)


def test_reference_free_fails_a_loss_that_reads_the_reference_by_a_little():
    """rrhf (the one reference-free list loss) plus 1e-6·Σ tanh(reference): a leak far below any tolerance but 0."""
    with pytest.raises(PropertyFailure, match=r"^probe: losses changed when reference log-probs were supplied"):
        S.check_shape_reference_free(_leaky(1e-6, "rrhf"), _with_lengths())
    S.check_shape_reference_free(_leaky(0.0, "rrhf"), _with_lengths())


def test_reference_free_draws_its_fake_references_from_its_own_generator():
    seen = []

    def record(b, o):
        if b.ref_logps is not None:
            seen.append(b.ref_logps.clone())
        return o.losses

    loss = probe_loss(changed("rrhf", losses=record), "rrhf")
    state = torch.get_rng_state()
    for seed in (0, 1):
        torch.manual_seed(seed)
        S.check_shape_reference_free(loss, _with_lengths())
    torch.set_rng_state(state)
    assert len(seen) == 2 and torch.equal(seen[0], seen[1])  # the same draw under two global seeds
    assert seen[0].dtype == F and bool((seen[0] < 0).all()) and float(seen[0].min()) < -100  # log-probs, far from 0


def _tilted_worst(eps: float):
    """∂L/∂log π = −eps on every completion: the wrong way (≤ 0 is required ≥ 0) only for the worst ones."""
    return changed("dpo-pl", losses=lambda b, o: -eps * b.policy_logps.sum(1))


def test_list_monotone_names_the_worst_completion_that_is_pushed_up():
    with pytest.raises(PropertyFailure) as e:
        S.check_list_monotone(probe_loss(_tilted_worst(1e-3), "dpo-pl"), _groups())
    assert str(e.value).startswith("probe: ∂L/∂log π of group 0's worst completion (slot 2) is -0.001 with ")


def test_list_monotone_has_no_unique_worst_or_best_in_a_group_of_ties_or_a_shared_worst():
    """Two completions tied for worst, and a group all tied: none of them is a unique worst or best, so gradients
    the wrong way on them are no failure; in the first group, the unique best still is checked."""
    scores = torch.tensor([[3.0, 1.0, 1.0], [2.0, 2.0, 2.0]], dtype=F)
    g = _groups(scores=scores)
    S.check_list_monotone(probe_loss(_tilted_worst(1e-3), "dpo-pl"), g)
    up = changed("dpo-pl", losses=lambda b, o: 1e-3 * b.policy_logps.sum(1))  # every completion pushed down
    with pytest.raises(PropertyFailure, match=r"group 0's best completion \(slot 0\)"):
        S.check_list_monotone(probe_loss(up, "dpo-pl"), g)


def test_list_monotone_reads_only_real_slots_for_the_best_and_the_worst():
    """A padding slot's score is no completion's: the worst of group 0 is slot 1 once slot 2 is masked out."""
    g = GroupBatch(policy_logps=_groups().policy_logps, ref_logps=_groups().ref_logps, scores=_groups().scores,
                   mask=torch.tensor([[True, True, False], [True, True, True]]))  # fmt: skip
    with pytest.raises(PropertyFailure) as e:
        S.check_list_monotone(probe_loss(_tilted_worst(1e-3), "dpo-pl"), g)
    assert str(e.value).startswith("probe: ∂L/∂log π of group 0's worst completion (slot 1) is -0.001 with ")


def test_every_shaped_property_declares_the_shape_it_checks():
    """The kit picks a property's batches by its ``shape``: a list property without it would be drawn pairs."""
    from prefzoo.types import Shape

    assert [p.shape for p in S.LIST_PROPERTIES] == [Shape.LIST] * len(S.LIST_PROPERTIES)
    assert [p.shape for p in S.UNPAIRED_PROPERTIES] == [Shape.UNPAIRED] * len(S.UNPAIRED_PROPERTIES)


def _unpaired_tilt(eps: float):
    """Every completion's loss eps·log π: ∂L/∂log π = eps, the wrong way for desirable completions when eps > 0."""
    return changed("kto", losses=lambda b, o: eps * b.policy_logps)


def test_unpaired_monotone_names_the_completion_and_its_label():
    with pytest.raises(PropertyFailure) as e:
        S.check_unpaired_monotone(probe_loss(_unpaired_tilt(1e-3), "kto"), _unpaired())
    assert str(e.value).startswith("probe: ∂L/∂log π(y) = 0.001 for a desirable completion 0 with ")
    with pytest.raises(PropertyFailure) as e:
        S.check_unpaired_monotone(probe_loss(_unpaired_tilt(-1e-3), "kto"), _unpaired())
    assert str(e.value).startswith("probe: ∂L/∂log π(y) = -0.001 for a undesirable completion 1 with ")


def test_unpaired_monotone_tolerates_rounding_of_the_batchs_own_dtype_only():
    """As for lists: 1e-9 the wrong way fails in float64; 1e-6 in float32 is float32 rounding and passes."""
    with pytest.raises(PropertyFailure, match=r"= 1e-09 for a desirable completion 0 "):
        S.check_unpaired_monotone(probe_loss(_unpaired_tilt(1e-9), "kto"), _unpaired())
    u = _unpaired()
    b32 = type(u)(policy_logps=u.policy_logps.float(), labels=u.labels, ref_logps=u.ref_logps.float(),
                  kl_policy_logps=u.kl_policy_logps.float(), kl_ref_logps=u.kl_ref_logps.float())  # fmt: skip
    S.check_unpaired_monotone(probe_loss(_unpaired_tilt(1e-6), "kto"), b32)


def test_a_monotonicity_declared_per_params_makes_the_monotone_checks_apply():
    import dataclasses

    import prefzoo

    spec = dataclasses.replace(prefzoo.loss_spec("kto"), monotone=lambda p: p.beta < 1.0)
    assert S._monotone_possible(spec) and not S._monotone_possible(dataclasses.replace(spec, monotone=False))
    loss = prefzoo.Loss(dataclasses.replace(spec, fn=_unpaired_tilt(1e-3)), spec.params(beta=0.5))
    with pytest.raises(PropertyFailure):  # declared for β = 0.5 (read with the loss's own params)
        S.check_unpaired_monotone(loss, _unpaired())


def test_the_shaped_properties_apply_where_their_conditions_hold():
    """batch-decoupled applies to the losses not declared batch-coupled, reference-free to those that do not need
    the reference, for lists and unpaired completions alike."""
    import dataclasses

    import prefzoo

    for props, free, needs_ref in ((S.LIST_PROPERTIES, "rrhf", "dpo-pl"), (S.UNPAIRED_PROPERTIES, None, "kto")):
        by_name = {p.name.split("-", 1)[1]: p for p in props}
        spec = prefzoo.loss_spec(needs_ref)
        decoupled, coupled = (dataclasses.replace(spec, batch_coupled=c) for c in (False, True))
        assert by_name["batch-decoupled"].applies(decoupled) and not by_name["batch-decoupled"].applies(coupled)
        assert not by_name["reference-free"].applies(spec)
        if free is not None:
            assert by_name["reference-free"].applies(prefzoo.loss_spec(free))


@pytest.mark.parametrize(("name", "prop"), [("dpo-pl", "list-low-precision"), ("kto", "unpaired-low-precision")])
def test_the_kit_runs_each_shaped_low_precision_property_on_a_sound_loss(name, prop):
    from prefzoo.testing import check_loss

    report = check_loss(name, properties=[prop], max_examples=3)
    assert [(r.name, r.status) for r in report.results] == [(prop, "passed")]


def _linear_groups(w):
    """L_g = Σ_k w_gk·log π_gk per group (dpo-pl's spec, declared monotone): ∂L/∂log π = w."""
    from prefzoo.types import LossOutput

    a = torch.tensor(w, dtype=F)

    def fn(b, p, ctx):
        z = torch.zeros(b.policy_logps.shape[0], dtype=F)
        return LossOutput((a * b.policy_logps).sum(1), z, z)

    return probe_loss(fn, "dpo-pl")


def _linear_completions(w):
    """L_i = w_i·log π_i per completion (kto's spec, declared monotone): ∂L/∂log π = w."""
    from prefzoo.types import LossOutput

    a = torch.tensor(w, dtype=F)

    def fn(b, p, ctx):
        z = torch.zeros_like(b.policy_logps.detach())
        return LossOutput(a * b.policy_logps, z, z)

    return probe_loss(fn, "kto")


S45 = 2.0**-45  # 64·2⁻⁵³·(1 + max|∂L| = 1)·(1 + max|log π| = 1): the monotone bound, exactly
OVER = S45 * 65 / 64  # just past it (the bound with 65 for 64, or 2 for either 1)


@pytest.mark.parametrize("side", ["best", "worst"])
def test_list_monotone_allows_rounding_up_to_its_bound_exactly_and_no_further(side):
    """Slot 1 is neither best nor worst: its gradient of 1 is allowed and sets max|∂L| = 1; log-probs within ±1."""
    lp = torch.tensor([[-1.0, -0.5, -0.25]], dtype=F)
    g = GroupBatch(policy_logps=lp, ref_logps=lp - 3.0, scores=torch.tensor([[3.0, 2.0, 1.0]], dtype=F))
    slot, sign = (0, 1.0) if side == "best" else (2, -1.0)

    def loss(x):
        w = [0.0, 1.0, 0.0]
        w[slot] = sign * x
        return _linear_groups([w])

    S.check_list_monotone(loss(S45), g)
    with pytest.raises(PropertyFailure, match=rf"^probe: ∂L/∂log π of group 0's {side} completion \(slot {slot}\)"):
        S.check_list_monotone(loss(OVER), g)


@pytest.mark.parametrize("label", [True, False])
def test_unpaired_monotone_allows_rounding_up_to_its_bound_exactly_and_no_further(label):
    """Completion 1 carries the allowed gradient of magnitude 1 for its label; completion 0 the wrong-signed one."""
    lp = torch.tensor([-1.0, -0.5], dtype=F)
    u = UnpairedBatch(policy_logps=lp, labels=torch.tensor([label, label]), ref_logps=lp - 3.0,
                      kl_policy_logps=lp - 3.0, kl_ref_logps=lp - 4.0)  # fmt: skip
    sign = 1.0 if label else -1.0  # the wrong way: up for desirable, down for undesirable

    def loss(x):
        return _linear_completions([sign * x, -sign * 1.0])

    S.check_unpaired_monotone(loss(S45), u)
    with pytest.raises(PropertyFailure, match=r"^probe: ∂L/∂log π\(y\) = .* completion 0 with "):
        S.check_unpaired_monotone(loss(OVER), u)


def test_list_monotone_finds_the_best_among_negative_scores_beside_padding():
    """Scores all below 0 and a padding slot: the best real completion is still found (padding is no candidate)."""
    lp = torch.tensor([[-1.0, -0.5, 0.0]], dtype=F)
    g = GroupBatch(policy_logps=lp, ref_logps=lp - 3.0, scores=torch.tensor([[-1.0, -2.0, 0.0]], dtype=F),
                   mask=torch.tensor([[True, True, False]]))  # fmt: skip
    with pytest.raises(PropertyFailure, match=r"group 0's best completion \(slot 0\)"):
        S.check_list_monotone(_linear_groups([[1e-3, 0.0, 0.0]]), g)


def test_a_list_monotonicity_declared_per_params_is_read_with_the_loss_params():
    import dataclasses

    import prefzoo

    spec = dataclasses.replace(prefzoo.loss_spec("dpo-pl"), monotone=lambda p: p.beta < 1.0)
    loss = prefzoo.Loss(dataclasses.replace(spec, fn=_linear_groups([[1e-3, 0.0, 0.0], [0.0] * 3]).spec.fn),
                        spec.params(beta=0.5))  # fmt: skip
    with pytest.raises(PropertyFailure):
        S.check_list_monotone(loss, _groups())


def test_fresh_casts_every_field_after_a_missing_one():
    """A group batch without ref_logps (an earlier field): the scores after it are still cast and copied."""
    g = GroupBatch(policy_logps=torch.zeros(1, 2, dtype=F), scores=torch.tensor([[1.0, 2.0]], dtype=F))
    f = S.fresh(g, torch.float32)
    assert f.ref_logps is None and f.scores.dtype == torch.float32 and f.scores is not g.scores


def _by_position(dim: int):
    """dpo-pl plus half of each group's position in the batch (dim 0) or its first completion's slot (dim 1, read
    from the log-probs, which move with their completion): permuting the groups or the completions changes it."""

    def losses(b, o):
        if dim == 0:
            return o.losses + 0.5 * torch.arange(b.batch_size, dtype=F)
        return o.losses + 0.5 * (b.policy_logps[:, 0] == _groups().policy_logps[:, 0]).to(F)

    return probe_loss(changed("dpo-pl", losses=losses), "dpo-pl")


def test_the_shaped_permutations_are_never_the_identity_for_two_groups_or_two_completions():
    """The seeded draw for 2 is the identity, which no loss can fail: both shaped checks reverse it, as the pair check
    does.  Two groups of two completions: a loss that reads positions fails under [1, 0]."""
    two = _groups(**{n: getattr(_groups(), n)[:, :2] for n in ("policy_logps", "ref_logps", "scores")})
    with pytest.raises(PropertyFailure, match=r"^probe: losses after permuting the groups by \[1, 0\] at index 0"):
        S.check_shape_permutation(_by_position(0), two)
    with pytest.raises(PropertyFailure, match=r"^probe: losses after permuting every group's completions by \[1, 0\]"):
        S.check_within_group_permutation(_by_position(1), two)
    import prefzoo

    for check in (S.check_shape_permutation, S.check_within_group_permutation):
        check(prefzoo.get_loss("dpo-pl"), two)
