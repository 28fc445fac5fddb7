"""The public strategies draw what they promise: domains, dtypes, sizes, declared parameter ranges."""

from __future__ import annotations

import torch
from hypothesis import given
from hypothesis import strategies as st

import prefzoo
from prefzoo.spec import param_infos
from prefzoo.testing import batches_for, loss_params, preference_batches
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
