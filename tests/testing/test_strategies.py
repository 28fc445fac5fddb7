"""The public strategies draw what they promise: domains, dtypes, sizes, declared parameter ranges."""

from __future__ import annotations

import math
import typing

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import prefzoo
from prefzoo.spec import param_infos
from prefzoo.testing import batches_for, group_batches, loss_params, preference_batches, unpaired_batches
from prefzoo.testing.strategies import LOGP_MIN, MAX_LENGTH


@given(batch=preference_batches())
def test_batches_respect_the_domain(batch):
    assert 1 <= batch.batch_size <= 64
    assert batch.policy_chosen_logps.dtype in (torch.float64, torch.float32, torch.bfloat16)
    for n in ("policy_chosen_logps", "policy_rejected_logps", "ref_chosen_logps", "ref_rejected_logps"):
        t = getattr(batch, n)
        if t is not None:
            assert bool((t <= 0).all()) and bool((t >= LOGP_MIN - 64).all())  # bf16 rounds −1e4 to a multiple of 64
    if batch.chosen_lengths is not None:
        assert bool((batch.chosen_lengths >= 1).all()) and bool((batch.chosen_lengths <= MAX_LENGTH).all())


@given(batch=preference_batches(dtypes=("bfloat16",), reference=False, lengths=True, min_size=3, max_size=3))
def test_batches_honour_the_switches(batch):
    assert batch.batch_size == 3 and batch.policy_chosen_logps.dtype == torch.bfloat16
    assert batch.ref_chosen_logps is None and batch.chosen_lengths is not None


@given(batch=batches_for(prefzoo.loss_spec("mmpo-entropy")))
def test_batches_for_a_spec_carry_its_needs(batch):
    prefzoo.get_loss("mmpo-entropy").check_inputs(batch)
    assert batch.chosen_mask is not None and bool(batch.chosen_mask[:, 0].all())


@given(data=st.data())
def test_params_stay_in_declared_ranges(data):
    for name in prefzoo.list_losses():
        spec = prefzoo.loss_spec(name)
        p = data.draw(loss_params(spec))
        for info in param_infos(spec.params_cls):
            v = getattr(p, info.name)
            if v is not None:
                assert info.check(v) is None, (name, info.name, v)


def test_ties_are_drawn():
    """Ties between chosen and rejected log-probs are where 0/0 bugs live: the strategy must reach them."""
    seen = []

    @given(batch=preference_batches(dtypes=("float64",)))
    def run(batch):
        seen.append(bool((batch.policy_chosen_logps == batch.policy_rejected_logps).any()))

    run()
    assert any(seen)


def _int_info():
    from dataclasses import dataclass

    @dataclass(frozen=True, kw_only=True)
    class IntParams(prefzoo.LossParams):
        k: int = prefzoo.param(1, "k", ge=1, lt=4)

    (info,) = param_infos(IntParams)
    return info


@given(k=st.data())
def test_an_int_param_with_an_exclusive_upper_bound_is_drawn_below_it(k):
    """The draw itself respects lt (loss_params would otherwise silently retry, then fall back to the defaults)."""
    from prefzoo.testing.strategies import param_strategy

    assert 1 <= k.draw(param_strategy(_int_info())) < 4


def test_an_int_param_with_an_exclusive_lower_bound_is_drawn_above_it_up_to_its_upper_bound():
    """k > 0.5 and k ≤ 3: the integers 1, 2 and 3, each drawn, and nothing else (no int parameter of a built-in loss
    has an exclusive lower bound, so only this test reaches that branch)."""
    from dataclasses import dataclass

    from prefzoo.testing.strategies import param_strategy

    @dataclass(frozen=True, kw_only=True)
    class GtParams(prefzoo.LossParams):
        k: int = prefzoo.param(2, "k", gt=0.5, le=3)

    (info,) = param_infos(GtParams)
    assert _outcomes(param_strategy(info), lambda k: k) == {1, 2, 3}


@pytest.mark.parametrize(("gt", "lt", "lo", "hi"), [(2.0, 3.0, 2.002, 2.997), (-5.0, 0.5, -4.995, 0.499)])
def test_a_float_param_with_open_bounds_is_drawn_right_next_to_them(gt, lt, lo, hi):
    """x > gt and x < lt: draws reach within max(1e-3, |bound|·1e-3) of each open bound, never the bound itself
    (a margin that grows with the bound, e.g. |gt|·1.001, would leave [gt, 2·gt] undrawn)."""
    from dataclasses import dataclass

    from hypothesis import find

    from prefzoo.testing.strategies import param_strategy

    @dataclass(frozen=True, kw_only=True)
    class OpenParams(prefzoo.LossParams):
        x: float = prefzoo.param(0.0 if gt < 0 else 2.5, "x", gt=gt, lt=lt)

    (info,) = param_infos(OpenParams)
    strategy = param_strategy(info)
    assert find(strategy, lambda v: v <= lo) == lo
    assert find(strategy, lambda v: v >= hi) == hi


@given(batch=preference_batches(dtypes=("float64",), token_level=None, min_size=2, max_size=4))
def test_token_level_fields_are_drawn_or_not_when_left_open(batch):
    """token_level=None: a drawn switch; when on, each response gets (B, T) log-probs zero past its mask."""
    if batch.policy_chosen_token_logps is None:
        assert batch.chosen_mask is None
        return
    assert batch.chosen_mask is not None and bool(batch.chosen_mask[:, 0].all())
    assert bool((batch.policy_chosen_token_logps.masked_fill(batch.chosen_mask, 0.0) == 0).all())


def _outcomes(strategy, of) -> set:
    """Every value of ``of(x)`` over 50 derandomized draws ``x`` of ``strategy`` (the same draws in every run)."""
    seen = set()

    @settings(max_examples=50, derandomize=True, database=None)
    @given(x=strategy)
    def run(x):
        seen.add(of(x))

    run()
    return seen


def test_token_level_none_reaches_both_outcomes():
    batches = preference_batches(dtypes=("float64",), token_level=None, max_size=3)
    assert _outcomes(batches, lambda b: b.policy_chosen_token_logps is not None) == {True, False}


def _token_fields_agree(logps, ents, mask, lead: tuple[int, ...]) -> None:
    assert mask.dtype == torch.bool and tuple(mask.shape[:-1]) == lead and logps.shape == ents.shape == mask.shape
    counts = mask.sum(-1)
    assert bool((counts >= 1).all()) and bool((counts <= mask.shape[-1]).all())
    assert bool(mask[..., 0].all())  # each completion's tokens come first, then padding
    assert bool((logps.masked_fill(mask, 0.0) == 0).all()) and bool((ents.masked_fill(mask, 0.0) == 0).all())
    assert bool((logps <= 0).all()) and bool((ents >= 0).all()) and bool((ents <= math.log(50_000)).all())


@given(batch=group_batches(dtypes=("float64",), token_level=True, max_size=3, max_k=3, requires_grad=True))
def test_group_batches_draw_token_fields_per_completion(batch):
    g, k = batch.policy_logps.shape
    _token_fields_agree(batch.policy_token_logps, batch.token_entropies, batch.token_mask, (g, k))
    assert batch.policy_token_logps.requires_grad and batch.token_entropies.requires_grad


@given(batch=unpaired_batches(dtypes=("float64",), token_level=True, max_size=5, requires_grad=True))
def test_unpaired_batches_draw_token_fields_per_completion(batch):
    _token_fields_agree(batch.policy_token_logps, batch.token_entropies, batch.token_mask, (batch.batch_size,))
    assert batch.policy_token_logps.requires_grad


def test_unpaired_reference_none_reaches_both_outcomes():
    batches = unpaired_batches(dtypes=("float64",), reference=None, max_size=3)
    assert _outcomes(batches, lambda b: b.ref_logps is not None) == {True, False}


def test_unpaired_batches_for_a_density_ratio_loss_come_with_and_without_the_weights():
    """bco declares density_ratio_weights: its batches reach both outcomes (the weights are optional input);
    a loss that does not declare them never gets any."""
    bco = batches_for(prefzoo.loss_spec("bco"), prefzoo.Shape.UNPAIRED, dtypes=("float64",), max_size=3)
    assert _outcomes(bco, lambda b: b.density_ratio_weights is not None) == {True, False}
    kto = batches_for(prefzoo.loss_spec("kto"), prefzoo.Shape.UNPAIRED, dtypes=("float64",), max_size=3)
    assert _outcomes(kto, lambda b: b.density_ratio_weights is not None) == {False}


def _infos():
    from dataclasses import dataclass

    @dataclass(frozen=True, kw_only=True)
    class Mixed(prefzoo.LossParams):
        flag: bool = prefzoo.param(False, "a switch")
        name: str = prefzoo.param("x", "free text: not drawn")
        cap: float | None = prefzoo.param(None, "optional", gt=0.0, le=2.0)
        mode: typing.Literal["a", "b"] = prefzoo.param("a", "a choice")

    return {i.name: i for i in param_infos(Mixed)}, Mixed


@given(data=st.data())
def test_bool_text_optional_and_choice_params_are_drawn_as_declared(data):
    from prefzoo.testing.strategies import param_strategy

    infos, _ = _infos()
    assert isinstance(data.draw(param_strategy(infos["flag"])), bool)
    assert data.draw(param_strategy(infos["name"])) == "x"  # a type without a range: its default
    cap = data.draw(param_strategy(infos["cap"]))
    assert cap is None or 0.0 < cap <= 2.0
    assert data.draw(param_strategy(infos["mode"])) in ("a", "b")


def test_an_optional_param_is_drawn_as_none_and_as_a_value_in_its_range():
    """``cap: float | None`` (gt 0, le 2): None is one of the draws, so a loss's ``None`` branch (no cap, no clip) is
    tested too, and so is a value; a strategy for the value alone would leave the ``None`` branch untested."""
    from prefzoo.testing.strategies import param_strategy

    infos, _ = _infos()
    assert _outcomes(param_strategy(infos["cap"]), lambda c: c is None or 0.0 < c <= 2.0) == {True}
    assert _outcomes(param_strategy(infos["cap"]), lambda c: c is None) == {True, False}


def test_params_whose_cross_check_always_fails_fall_back_to_the_defaults():
    """loss_params retries a draw the params' check refuses; a spec whose non-default draws all fail gets defaults."""
    import dataclasses as dc

    @dc.dataclass(frozen=True, kw_only=True)
    class OnlyDefault(prefzoo.LossParams):
        beta: float = prefzoo.param(0.1, "β", gt=0.0, le=1.0)

        def check(self) -> None:
            if self.beta != 0.1:
                self.fail("beta must stay 0.1")

    spec = dc.replace(prefzoo.loss_spec("dpo"), name="only-default", params_cls=OnlyDefault)
    seen = []

    @given(p=loss_params(spec, defaults_weight=0.0))
    def run(p):
        seen.append(p.beta)

    run()
    assert seen and set(seen) == {0.1}


def test_open_switches_and_short_completions_reach_every_outcome():
    """Each drawn switch is seen both ways, and one-token completions are drawn beside longer rows (a mask built
    with ``<=`` instead of ``<`` would never give one token where T > 1)."""
    seen: dict[str, set] = {"flag": set(), "group_tokens": set(), "group_one": set(), "unpaired_one": set()}
    from prefzoo.testing.strategies import param_strategy

    infos, _ = _infos()

    @settings(max_examples=50, derandomize=True, database=None)  # the same draws in every run
    @given(data=st.data())
    def run(data):
        seen["flag"].add(data.draw(param_strategy(infos["flag"])))
        g = data.draw(group_batches(dtypes=("float64",), token_level=None, max_size=3, max_k=3))
        seen["group_tokens"].add(g.token_mask is not None)
        if g.token_mask is not None:
            seen["group_one"].add(bool(((g.token_mask.sum(-1) == 1) & (g.token_mask.shape[-1] > 1)).any()))
        u = data.draw(unpaired_batches(dtypes=("float64",), token_level=True, max_size=4))
        seen["unpaired_one"].add(bool(((u.token_mask.sum(-1) == 1) & (u.token_mask.shape[-1] > 1)).any()))

    run()
    assert seen["flag"] == {True, False} and seen["group_tokens"] == {True, False}
    assert True in seen["group_one"] and True in seen["unpaired_one"]


def test_batches_for_a_loss_draw_the_inputs_it_does_not_need_either_way():
    """simpo needs lengths, not a reference: its pairs come with and without one and always with lengths; dpo needs
    a reference, not lengths: always a reference, lengths either way."""
    simpo = batches_for(prefzoo.loss_spec("simpo"), dtypes=("float64",), max_size=3)
    assert _outcomes(simpo, lambda b: (b.ref_chosen_logps is not None, b.chosen_lengths is not None)) == {
        (True, True),
        (False, True),
    }
    dpo = batches_for(prefzoo.loss_spec("dpo"), dtypes=("float64",), max_size=3)
    assert _outcomes(dpo, lambda b: (b.ref_chosen_logps is not None, b.chosen_lengths is not None)) == {
        (True, True),
        (True, False),
    }


def test_batches_for_a_loss_without_token_or_kl_needs_draws_none_and_kl_either_way():
    """dpo reads no token-level input: its pairs never carry any; bco needs no KL reference point: its unpaired
    batches come with and without one, while kto's always have it."""
    dpo = batches_for(prefzoo.loss_spec("dpo"), dtypes=("float64",), max_size=3)
    assert _outcomes(dpo, lambda b: b.policy_chosen_token_logps is not None) == {False}
    unpaired = prefzoo.Shape.UNPAIRED
    bco = batches_for(prefzoo.loss_spec("bco"), unpaired, dtypes=("float64",), max_size=3)
    assert _outcomes(bco, lambda b: b.kl_policy_logps is not None) == {True, False}
    kto = batches_for(prefzoo.loss_spec("kto"), unpaired, dtypes=("float64",), max_size=3)
    assert _outcomes(kto, lambda b: b.kl_policy_logps is not None) == {True}


def test_list_batches_for_a_loss_keep_a_smaller_max_size_and_cap_a_larger_one_at_sixteen():
    from hypothesis import find
    from hypothesis.errors import NoSuchExample

    spec, lists = prefzoo.loss_spec("dpo-pl"), prefzoo.Shape.LIST
    assert _outcomes(batches_for(spec, lists, dtypes=("float64",), max_size=2), lambda g: g.batch_size <= 2) == {True}
    quick = settings(max_examples=300, derandomize=True, database=None)
    for kw in ({}, {"max_size": 64}):  # the default, and a larger one asked for
        groups = batches_for(spec, lists, dtypes=("float64",), max_k=2, **kw)
        assert find(groups, lambda g: g.batch_size == 16, settings=quick).batch_size == 16
        with pytest.raises(NoSuchExample):
            find(groups, lambda g: g.batch_size > 16, settings=quick)


def test_int_params_reach_every_value_their_bounds_allow():
    """ge=1, lt=4: 1, 2 and 3 (3 = ⌈lt⌉ − 1 included); only le=2: −8..2; no bounds: −10..0."""
    from dataclasses import dataclass

    from prefzoo.testing.strategies import param_strategy

    @dataclass(frozen=True, kw_only=True)
    class Ints(prefzoo.LossParams):
        upper: int = prefzoo.param(0, "only an upper bound", le=2)
        free: int = prefzoo.param(0, "no bounds")

    infos = {i.name: i for i in param_infos(Ints)}
    assert _outcomes(param_strategy(_int_info()), lambda k: k) == {1, 2, 3}
    assert _outcomes(param_strategy(infos["upper"]), lambda k: -8 <= k <= 2) == {True}
    assert {-8, 2} <= _outcomes(param_strategy(infos["upper"]), lambda k: k)
    assert {-10, 0} <= _outcomes(param_strategy(infos["free"]), lambda k: k) <= set(range(-10, 1))


def test_dtypes_may_be_given_as_torch_dtypes():
    batches = preference_batches(dtypes=(torch.float32,), max_size=2)
    assert _outcomes(batches, lambda b: b.policy_chosen_logps.dtype) == {torch.float32}


def test_float_params_reach_a_closed_bound_and_the_span_above_an_open_one():
    """ge=1, le=2: 1.0 itself is drawn and nothing below it; gt=2 alone: draws go up to 2 + 10 (a span of 10 above
    the bound, not above 0); le=−20 or lt=−20 alone: down to −30; no bounds: −10..10; ge=0 alone: 0..10."""
    from dataclasses import dataclass

    from hypothesis import find

    from prefzoo.testing.strategies import param_strategy

    @dataclass(frozen=True, kw_only=True)
    class Floats(prefzoo.LossParams):
        closed: float = prefzoo.param(1.5, "closed", ge=1.0, le=2.0)
        open_below: float = prefzoo.param(3.0, "open, unbounded above", gt=2.0)
        upper: float = prefzoo.param(-25.0, "closed above, unbounded below", le=-20.0)
        open_upper: float = prefzoo.param(-25.0, "open above, unbounded below", lt=-20.0)
        free: float = prefzoo.param(0.0, "no bounds")
        non_negative: float = prefzoo.param(1.0, "closed below at 0, unbounded above", ge=0.0)

    infos = {i.name: i for i in param_infos(Floats)}
    quick = settings(max_examples=300, derandomize=True, database=None)
    closed = param_strategy(infos["closed"])
    assert _outcomes(closed, lambda v: 1.0 <= v <= 2.0) == {True}
    assert find(closed, lambda v: v == 1.0, settings=quick) == 1.0
    assert find(param_strategy(infos["open_below"]), lambda v: v > 11.0, settings=quick) <= 12.0
    for name, lo, hi in (("free", -10.0, 10.0), ("non_negative", 0.0, 10.0)):  # no bounds: ±10; ge=0: 0..10
        drawn = param_strategy(infos[name])
        assert _outcomes(drawn, lambda v, lo=lo, hi=hi: lo <= v <= hi) == {True}
        assert find(drawn, lambda v, lo=lo: v < lo + 1.0, settings=quick) >= lo
        assert find(drawn, lambda v, hi=hi: v > hi - 1.0, settings=quick) <= hi
    for name in ("upper", "open_upper"):  # a span of 10 below an upper bound alone
        below = param_strategy(infos[name])
        assert _outcomes(below, lambda v: -30.0 <= v <= -20.0) == {True}
        assert find(below, lambda v: v < -29.0, settings=quick) >= -30.0
