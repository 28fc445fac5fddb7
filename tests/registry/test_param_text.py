"""Reading hyperparameters from text and YAML, and the one-line errors of specs and params (prefzoo/spec.py)."""

from __future__ import annotations

import dataclasses
import typing

import pytest
import torch

import prefzoo
from prefzoo.registry import modifier_spec, parse_loss_params
from prefzoo.spec import LossParamError, LossParams, LossSpec, ModifierError, param_infos, read_literal, read_scalar


@pytest.mark.parametrize("text", ["1", "true", "TRUE", "Yes", "on"])
def test_true_words_read_as_true(text):
    assert read_scalar(text, bool) is True


@pytest.mark.parametrize("text", ["0", "false", "No", "OFF"])
def test_false_words_read_as_false(text):
    assert read_scalar(text, bool) is False


def test_other_words_are_not_booleans():
    with pytest.raises(ValueError) as e:
        read_scalar("maybe", bool)
    assert str(e.value) == "maybe"


def test_numbers_and_strings_read_as_their_type_and_other_types_keep_the_text():
    assert read_scalar("3", int) == 3 and type(read_scalar("3", int)) is int
    assert read_scalar("0.25", float) == 0.25 and read_scalar("x y", str) == "x y"
    assert read_scalar("[1, 2]", list) == "[1, 2]"


def test_a_literal_is_json_when_it_is_json_else_the_text():
    assert read_literal("3") == 3 and read_literal("0.5") == 0.5 and read_literal("true") is True
    assert read_literal("[1, 2]") == [1, 2] and read_literal("sigmoid") == "sigmoid"


def test_loss_parameters_from_text_and_yaml_scalars():
    spec = prefzoo.loss_spec("dpo")
    assert spec.parse_param("beta", "0.3") == 0.3
    assert spec.parse_param("beta", 1) == 1.0 and type(spec.parse_param("beta", 1)) is float  # YAML's 1 for a float
    assert spec.parse_param("f_divergence", "js_divergence") == "js_divergence"  # a choice stays text
    assert spec.parse_param("beta", [0.1]) == [0.1]  # neither text nor a number: left for the params to refuse
    with pytest.raises(LossParamError) as e:
        spec.parse_param("beta", "high")
    assert str(e.value) == "loss 'dpo': parameter 'beta': cannot read 'high' as float"
    with pytest.raises(LossParamError) as e:
        spec.parse_param("gamma", "1")
    assert (
        str(e.value)
        == "loss 'dpo' has no parameter 'gamma'; valid parameters: alpha_divergence_coef, beta, f_divergence"
    )


def test_an_optional_parameter_reads_a_number_or_none_from_text_and_yaml():
    """``entropy_beta: float | None`` (mmpo-entropy): ``--loss-param entropy_beta=0.5`` is the float 0.5 (it was kept
    as the text '0.5', which the params then refused: the flag could not set it), ``none`` / ``null`` is None, a YAML
    1 is 1.0 and a YAML null None; other text is one line naming the type."""
    spec = prefzoo.loss_spec("mmpo-entropy")
    assert spec.parse_param("entropy_beta", "0.5") == 0.5 and type(spec.parse_param("entropy_beta", "0.5")) is float
    assert spec.parse_param("entropy_beta", "none") is None and spec.parse_param("entropy_beta", " NULL ") is None
    assert spec.parse_param("entropy_beta", 1) == 1.0 and type(spec.parse_param("entropy_beta", 1)) is float
    assert spec.parse_param("entropy_beta", None) is None
    with pytest.raises(LossParamError) as e:
        spec.parse_param("entropy_beta", "high")
    assert str(e.value) == "loss 'mmpo-entropy': parameter 'entropy_beta': cannot read 'high' as float or none"
    params = parse_loss_params("mmpo-entropy", ["entropy_beta=0.25", "beta=0.5"])
    assert prefzoo.get_loss("mmpo-entropy", **params).params.entropy_beta == 0.25


def test_value_type_unwraps_one_optional_type_only():
    from prefzoo.spec import value_type

    assert value_type(float) == (float, False) and value_type(float | None) == (float, True)
    assert value_type(typing.Optional[int]) == (int, True)  # noqa: UP045 (the spelling older plugins use)
    assert value_type(int | str) == (typing.Any, False) and value_type(int | str | None) == (typing.Any, True)


def test_modifier_parameters_from_text_and_their_errors():
    spec = modifier_spec("tr-dpo")
    assert spec.parse_param("sync_steps", "64") == 64 and spec.parse_param("mixup_alpha", "0.5") == 0.5
    with pytest.raises(ModifierError) as e:
        spec.parse_param("tau", "1")
    assert str(e.value) == "modifier 'tr-dpo' has no parameter 'tau'; valid parameters: mixup_alpha, sync_steps"
    with pytest.raises(ModifierError) as e:
        spec.params(tau=1, rate=2)
    assert str(e.value) == "modifier 'tr-dpo' has no parameter 'rate', 'tau'; valid parameters: mixup_alpha, sync_steps"
    with pytest.raises(ModifierError) as e:  # a modifier without parameters says so, rather than an empty list
        modifier_spec("wpo").params(alpha=1.0)
    assert str(e.value) == "modifier 'wpo' has no parameter 'alpha'; valid parameters: (none)"
    with pytest.raises(ModifierError) as e:
        spec.params(mixup_alpha=-1.0)
    assert str(e.value) == (
        "modifier 'tr-dpo': TRDPOParams: parameter 'mixup_alpha' = -1.0 must be > 0.0 and <= 1.0 (α: θ_ref ← α·θ + "
        "(1 − α)·θ_ref at each sync (1 = hard update; TRL ref_model_mixup_alpha))"
    )
    with pytest.raises(ModifierError) as e:
        spec.params(mixup_alpha="x")
    assert str(e.value).startswith("modifier 'tr-dpo': ")
    assert "parameter 'mixup_alpha' = 'x' must be a number, got str 'x'" in str(e.value)


def test_an_integer_for_a_float_parameter_is_stored_as_a_float():
    p = prefzoo.loss_spec("dpo").params(beta=1)
    assert p.beta == 1.0 and type(p.beta) is float


def test_an_optional_parameter_set_is_range_checked_and_none_is_only_for_optional_ones():
    # entropy_beta defaults to None (use β); a value given must still be in range, and β (default 0.1) is no option
    assert prefzoo.get_loss("mmpo-entropy", entropy_beta=None).params.entropy_beta is None
    with pytest.raises(LossParamError, match=r"'entropy_beta' = -1.0 must be >= 0.0 \(weight of the entropy bonus"):
        prefzoo.get_loss("mmpo-entropy", entropy_beta=-1.0)
    with pytest.raises(LossParamError, match=r"'beta' = None must be a number, got NoneType None"):
        prefzoo.get_loss("mmpo-entropy", beta=None)


def test_loss_params_errors_name_the_class_and_the_loss():
    spec = prefzoo.loss_spec("dpo")
    with pytest.raises(LossParamError) as e:
        spec.params(beta=float("nan"))
    assert str(e.value) == (
        "loss 'dpo': FDPOParams: parameter 'beta' = nan must be finite (β: inverse temperature of the implicit reward "
        "β·log(π/π_ref))"
    )
    with pytest.raises(LossParamError) as e:
        spec.params(beta=0.1, nope=1, also=2)
    msg = "loss 'dpo' has no parameter 'also', 'nope'; valid parameters: alpha_divergence_coef, beta, f_divergence"
    assert str(e.value) == msg


@dataclasses.dataclass(frozen=True, kw_only=True)
class _Params(LossParams):
    def check(self) -> None:
        self.fail("always wrong, on purpose")


def test_fail_names_the_params_class():
    with pytest.raises(LossParamError) as e:
        _Params()
    assert str(e.value) == "_Params: always wrong, on purpose"


def test_param_infos_refuse_a_class_that_is_not_a_dataclass():
    with pytest.raises(TypeError) as e:
        param_infos(int)
    assert str(e.value) == "<class 'int'> is not a dataclass"


@dataclasses.dataclass(frozen=True, kw_only=True)
class _Typed(LossParams):
    mode: typing.Literal["a", "b"] = "a"
    rate: float = 0.5


def test_only_literal_types_give_choices():
    assert [(i.name, i.choices) for i in param_infos(_Typed)] == [("mode", ("a", "b")), ("rate", None)]
    assert [i.choices for i in param_infos(prefzoo.loss_spec("mmpo").params_cls)] == [None] * 4


@dataclasses.dataclass(frozen=True)
class _NotParams:
    beta: float = 0.1


def _spec(**kw) -> LossSpec:
    base = dict(name="x", fn=lambda b, p, c: None, params_cls=prefzoo.loss_spec("dpo").params_cls, family="x",
                formula="x", paper="x", scores="x")  # fmt: skip
    return LossSpec(**{**base, **kw})


@pytest.mark.parametrize(
    ("kw", "message"),
    [
        ({"params_cls": dict}, "loss 'x': params_cls must be a LossParams dataclass, got <class 'dict'>"),
        ({"params_cls": _NotParams}, f"loss 'x': params_cls must be a LossParams dataclass, got {_NotParams!r}"),
        ({"fn": 3}, "loss 'x': fn is not callable"),
        ({"needs": frozenset({"reference"})}, "loss 'x': needs must hold prefzoo.Need values, got 'reference'"),
        ({"shapes": frozenset()}, "loss 'x': shapes must be a non-empty set of prefzoo.Shape, got frozenset()"),
        ({"shapes": frozenset({"pair"})}, "loss 'x': shapes must be a non-empty set of prefzoo.Shape, got "
                                          "frozenset({'pair'})"),
    ],
)  # fmt: skip
def test_a_malformed_loss_spec_is_one_line_naming_the_field(kw, message):
    with pytest.raises(TypeError) as e:
        _spec(**kw)
    assert str(e.value) == message


def test_a_bound_loss_shows_its_name_and_params():
    loss = prefzoo.get_loss("dpo", beta=0.2)
    assert repr(loss) == f"Loss('dpo', {loss.params!r})" and "beta=0.2" in repr(loss)


def test_a_need_the_batch_kind_cannot_carry_is_named():
    spec = prefzoo.loss_spec("kto")
    loss = prefzoo.Loss(dataclasses.replace(spec, needs=frozenset({prefzoo.Need.SCORES})), spec.params())
    z = torch.zeros(2, dtype=torch.float64)
    batch = prefzoo.UnpairedBatch(policy_logps=z, ref_logps=z, labels=torch.tensor([True, False]))
    with pytest.raises(prefzoo.PreferenceBatchError) as e:
        loss.check_inputs(batch)
    assert str(e.value) == "loss 'kto' needs scores, which a UnpairedBatch cannot carry"


def test_a_modifier_whose_params_are_a_dataclass_but_not_loss_params_is_refused():
    with pytest.raises(TypeError) as e:
        dataclasses.replace(modifier_spec("ld-dpo"), params_cls=_NotParams)
    assert str(e.value) == "modifier 'ld-dpo': params_cls must be a LossParams dataclass"


@dataclasses.dataclass(frozen=True, kw_only=True)
class _Checked(LossParams):
    beta: float = 0.1

    def check(self) -> None:
        if self.beta > 1:
            raise ValueError("beta above 1 is not supported here")


def test_a_value_error_from_the_params_is_one_line_naming_the_loss_or_modifier_and_the_values():
    with pytest.raises(LossParamError) as e:
        _spec(params_cls=_Checked).params(beta=2.0)
    assert str(e.value) == "loss 'x': invalid parameters {'beta': 2.0}: beta above 1 is not supported here"
    mod = dataclasses.replace(modifier_spec("ld-dpo"), params_cls=_Checked)
    with pytest.raises(ModifierError) as e:
        mod.params(beta=2.0)
    assert str(e.value) == "modifier 'ld-dpo': invalid parameters {'beta': 2.0}: beta above 1 is not supported here"
