"""prefzoo/spec.py's declarations and one-line errors, matched whole, for the cases a complete mutation run of the
module found unmatched: parameter bounds declared with ``param()``, optional parameters, capabilities declared as
plain values, loss and modifier errors for classes without parameters, the shape errors of a loss taking two shapes."""

from __future__ import annotations

import dataclasses

import pytest
import torch

import prefzoo
from prefzoo.spec import (
    LossOutputError,
    LossParamError,
    LossParams,
    LossSpec,
    ModifierError,
    check_output,
    param,
    param_infos,
    parse_assignments,
    upcast,
)
from prefzoo.types import GroupBatch, LossOutput, PreferenceBatch, PreferenceBatchError, Shape, UnpairedBatch
from tests.registry.test_param_text import _spec as _param_text_spec

F = torch.float64


@dataclasses.dataclass(frozen=True, kw_only=True)
class _Bounded(LossParams):
    cap: float | None = param(None, "an optional cap, unset by default")
    rate: float = param(0.5, "a rate in [0, 1)", ge=0.0, lt=1.0)
    plain: int = 3


@dataclasses.dataclass(frozen=True, kw_only=True)
class _Empty(LossParams):
    pass


def _spec(**kw) -> LossSpec:
    return _param_text_spec(**{"params_cls": _Bounded, **kw})


def test_a_pair_without_an_equals_sign_shows_the_default_example():
    with pytest.raises(LossParamError) as e:
        parse_assignments(["beta"], "--loss-param")
    assert str(e.value) == "--loss-param 'beta': expected KEY=VALUE, e.g. --loss-param key=value"


@pytest.mark.parametrize(
    ("value", "why"),
    [(-0.5, "must be >= 0.0 and < 1.0"), (1.0, "must be >= 0.0 and < 1.0")],
)
def test_bounds_declared_with_param_are_enforced_after_an_unset_optional_parameter(value, why):
    """``ge`` and ``lt`` reach the check, and the unset optional ``cap`` declared first does not end the checks."""
    assert _Bounded(rate=0.0).rate == 0.0 and _Bounded(rate=0.999).cap is None
    with pytest.raises(LossParamError) as e:
        _Bounded(rate=value)
    assert str(e.value) == f"_Bounded: parameter 'rate' = {value!r} {why} (a rate in [0, 1))"


def test_a_field_declared_without_param_has_no_doc_and_its_annotated_type():
    info = {i.name: i for i in param_infos(_Bounded)}
    assert (info["plain"].doc, info["plain"].type, info["plain"].default) == ("", int, 3)
    assert (info["rate"].ge, info["rate"].lt, info["rate"].gt, info["rate"].le) == (0.0, 1.0, None, None)


@pytest.mark.parametrize("value", [True, False])
def test_capabilities_declared_as_plain_values_are_read_as_such(value):
    spec = _spec(reward_difference=value, permutation_equivariant=value)
    assert spec.is_reward_difference(_Bounded()) is value
    assert spec.is_permutation_equivariant(_Bounded()) is value


def test_a_loss_without_parameters_says_so():
    spec = _spec(params_cls=_Empty)
    for call in (lambda: spec.params(beta=1.0), lambda: spec.parse_param("beta", "1")):
        with pytest.raises(LossParamError) as e:
            call()
        assert str(e.value) == "loss 'x' has no parameter 'beta'; valid parameters: (none)"


def test_a_modifier_parameter_from_text_names_the_modifier_and_the_parameter():
    with pytest.raises(ModifierError) as e:
        prefzoo.modifier_spec("wpo").parse_param("alpha", "1")
    assert str(e.value) == "modifier 'wpo' has no parameter 'alpha'; valid parameters: (none)"
    with pytest.raises(LossParamError) as e:
        prefzoo.modifier_spec("tr-dpo").parse_param("sync_steps", "often")
    assert str(e.value) == "modifier 'tr-dpo': parameter 'sync_steps': cannot read 'often' as int"


def test_a_modifier_of_pairs_names_the_shapes_a_loss_takes_instead():
    wpo = prefzoo.modifier_spec("wpo")
    two = _spec(name="lu", shapes=frozenset({Shape.UNPAIRED, Shape.LIST}))
    assert wpo.why_not(two, _Bounded()) == (
        "modifier 'wpo' cannot modify loss 'lu': modifiers take pairs; lu takes list, unpaired"
    )


def _bound(spec: LossSpec) -> prefzoo.Loss:
    return prefzoo.Loss(spec, spec.params())


def test_a_batch_of_a_shape_the_loss_does_not_take_names_every_shape_it_takes():
    loss = _bound(_spec(shapes=frozenset({Shape.PAIR, Shape.UNPAIRED})))
    g = GroupBatch(policy_logps=torch.zeros(1, 2, dtype=F))
    with pytest.raises(PreferenceBatchError) as e:
        loss.check_inputs(g)
    assert str(e.value) == "loss 'x' takes a prefzoo.PreferenceBatch or UnpairedBatch, got GroupBatch"


def test_unused_density_ratio_weights_and_missing_fields_are_named_whole():
    kto = prefzoo.get_loss("kto")
    z, lab = torch.zeros(2, dtype=F), torch.tensor([True, False])
    with pytest.raises(PreferenceBatchError) as e:
        kto.check_inputs(UnpairedBatch(policy_logps=z, labels=lab, ref_logps=z, density_ratio_weights=z + 1))
    assert str(e.value) == (
        "loss 'kto' does not use density-ratio weights (LossSpec.density_ratio_weights), but "
        "UnpairedBatch.density_ratio_weights is set: drop them (or --density-ratio)"
    )
    with pytest.raises(PreferenceBatchError) as e:
        prefzoo.get_loss("dpo").check_inputs(PreferenceBatch(z, z, ref_chosen_logps=z))
    assert str(e.value) == (
        "loss 'dpo' needs reference: PreferenceBatch.ref_rejected_logps is None "
        "(required fields: ref_chosen_logps, ref_rejected_logps)"
    )


def test_a_restored_state_keeps_the_loss_state_dtype():
    loss = prefzoo.get_loss("bco")
    before = loss.state_dict()
    assert {v.dtype for v in before.values()} == {torch.float64}
    loss.load_state_dict({k: v.float() + 1 for k, v in before.items()})  # a checkpoint saved in float32
    after = loss.state_dict()
    assert {k: (v.dtype, v.tolist()) for k, v in after.items()} == {
        k: (torch.float64, (v + 1).tolist()) for k, v in before.items()
    }


def test_a_batch_with_nothing_in_half_precision_is_not_copied():
    batch = PreferenceBatch(torch.zeros(2), torch.zeros(2))
    assert upcast(batch) is batch
    half = upcast(PreferenceBatch(torch.zeros(2, dtype=torch.bfloat16), torch.zeros(2)))
    assert half.policy_chosen_logps.dtype == torch.float32


def test_rewards_that_are_not_a_tensor_are_named_by_their_type():
    z = torch.zeros(2, dtype=F)
    out = LossOutput(z, z, z, rewards=[[0.0, 0.0]] * 2)
    with pytest.raises(LossOutputError) as e:
        check_output("toy", "me", out, PreferenceBatch(z, z))
    want = "loss 'toy' (plugin 'me') returned rewards of shape list; expected (2, 2), one per completion"
    assert str(e.value) == want
