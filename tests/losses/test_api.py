"""The public loss API: errors name the field and the fix; dtypes; extreme log-probs; combinations."""

from __future__ import annotations

import dataclasses
import re

import pytest
import torch

import prefzoo
from prefzoo import LossParamError, PreferenceBatch, PreferenceBatchError, UnknownLossError


def full_batch(B=4, dtype=torch.float32, scale=1.0, T=5):
    g = torch.Generator().manual_seed(1)
    v = lambda: (-torch.rand(B, generator=g) * scale).to(dtype).requires_grad_()  # noqa: E731
    return PreferenceBatch(
        policy_chosen_logps=v(),
        policy_rejected_logps=v(),
        ref_chosen_logps=v().detach(),
        ref_rejected_logps=v().detach(),
        chosen_lengths=torch.randint(1, 4096, (B,), generator=g),
        rejected_lengths=torch.randint(1, 4096, (B,), generator=g),
        policy_chosen_token_logps=-torch.rand(B, T, generator=g).to(dtype),
        policy_rejected_token_logps=-torch.rand(B, T, generator=g).to(dtype),
        chosen_token_entropies=torch.rand(B, T, generator=g).to(dtype),
        rejected_token_entropies=torch.rand(B, T, generator=g).to(dtype),
        chosen_mask=torch.ones(B, T, dtype=torch.bool),
        rejected_mask=torch.ones(B, T, dtype=torch.bool),
    )


def test_unknown_loss_suggests_close_names_and_lists_every_registered_one():
    with pytest.raises(UnknownLossError, match="did you mean 'mmpo'") as e:
        prefzoo.get_loss("mmop")
    listed = re.search(r"\(registered: (.*); `prefzoo losses` lists them\)$", str(e.value))
    assert listed and listed.group(1).split(", ") == prefzoo.list_losses(), str(e.value)


def test_unknown_parameter_lists_valid_ones():
    with pytest.raises(LossParamError, match=r"loss 'simpo' has no parameter 'gamma'.*gamma_beta_ratio"):
        prefzoo.get_loss("simpo", gamma=1.0)


@pytest.mark.parametrize(
    ("name", "params", "match"),
    [
        ("dpo", {"beta": 0.0}, r"loss 'dpo'.*'beta' = 0.0 must be > 0.0"),
        ("robust", {"label_smoothing": 0.5}, r"'label_smoothing' = 0.5 must be >= 0.0 and < 0.5"),
        ("dpo", {"f_divergence": "kl"}, r"'f_divergence' = 'kl' must be one of 'reverse_kl'"),
        ("mmpo", {"norm_eps": -1.0}, r"'norm_eps'"),
        ("mmpo", {"beta": float("nan")}, r"'beta' = nan must be finite"),
        ("simpo", {"beta": "2"}, r"'beta' = '2' must be a number"),
    ],
)
def test_out_of_range_parameter_names_loss_parameter_and_range(name, params, match):
    with pytest.raises(LossParamError, match=match):
        prefzoo.get_loss(name, **params)


def test_cli_strings_are_typed_by_the_params_class():
    from prefzoo.registry import parse_loss_params

    assert parse_loss_params("mmpo", ["beta=0.5", "reward_epsilon=1"]) == {"beta": 0.5, "reward_epsilon": 1.0}
    assert parse_loss_params("dpo", ["f_divergence=js_divergence"]) == {"f_divergence": "js_divergence"}
    with pytest.raises(LossParamError, match="cannot read 'abc' as float"):
        parse_loss_params("dpo", ["beta=abc"])
    with pytest.raises(LossParamError, match="KEY=VALUE"):
        parse_loss_params("dpo", ["beta"])


@pytest.mark.parametrize(
    ("field", "value", "match"),
    [
        ("ref_chosen_logps", None, r"needs reference: PreferenceBatch.ref_chosen_logps is None"),
        ("chosen_lengths", torch.tensor([3, 0, 2, 1]), r"chosen_lengths\[1\] = 0.*positive"),
        ("policy_chosen_logps", torch.tensor([0.0, float("nan"), 0.0, 0.0]), r"policy_chosen_logps\[1\].*nan.*finite"),
        ("policy_rejected_logps", torch.zeros(3), r"shape \(3,\) but policy_chosen_logps has \(4,\)"),
        ("ref_rejected_logps", torch.tensor([float("-inf"), 0.0, 0.0, 0.0]), r"ref_rejected_logps\[0\].*-inf"),
        ("policy_chosen_logps", torch.zeros(4, dtype=torch.long), r"floating-point"),
        ("policy_chosen_logps", torch.zeros(4, 2), r"shape \(B,\) with B >= 1 .*got shape \(4, 2\)$"),
        ("policy_chosen_logps", torch.zeros(0), r"shape \(B,\) with B >= 1 .*got shape \(0,\)$"),
        ("chosen_lengths", torch.ones(4, dtype=torch.bool), r"chosen_lengths must hold whole token counts"),
        ("rejected_lengths", torch.ones(4, dtype=torch.complex64), r"rejected_lengths must hold whole token counts"),
    ],
)
def test_bad_inputs_are_named(field, value, match):
    with pytest.raises(PreferenceBatchError, match=match):
        b = full_batch()
        prefzoo.get_loss("mmpo-length-norm")(b.replace(**{field: value}))


def test_missing_token_level_inputs_are_named():
    b = full_batch().replace(chosen_token_entropies=None)
    with pytest.raises(PreferenceBatchError, match=r"needs token_entropies.*chosen_token_entropies"):
        prefzoo.get_loss("mmpo-entropy")(b)


def test_not_a_batch():
    with pytest.raises(PreferenceBatchError, match=r"^loss 'dpo' takes a prefzoo\.PreferenceBatch, got dict$"):
        prefzoo.get_loss("dpo")({"policy_chosen_logps": torch.zeros(1)})  # no hint to add: the message ends there


# unpaired losses: tests/losses/test_unpaired.py
PAIRWISE = [n for n in prefzoo.list_losses() if prefzoo.loss_spec(n).accepts(prefzoo.Shape.PAIR)]


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("name", PAIRWISE)
def test_finite_at_realistic_extremes(name, dtype):
    """Summed log-probs of real completions reach −1e4: losses and gradients stay finite there."""
    b = full_batch(B=6, dtype=dtype, scale=2e4)
    out = prefzoo.get_loss(name)(b)
    assert out.losses.shape == (6,)
    assert torch.isfinite(out.losses).all(), out.losses
    grads = torch.autograd.grad(out.losses.sum(), (b.policy_chosen_logps, b.policy_rejected_logps), allow_unused=True)
    for gr in grads:
        assert gr is None or torch.isfinite(gr).all()
    assert not out.chosen_rewards.requires_grad and not out.rejected_rewards.requires_grad


def test_combination_from_string_and_api_agree_with_mpo():
    b = full_batch(dtype=torch.float64)
    s = prefzoo.get_loss("0.8*dpo + 0.2*bco-pair + 1.0*sft", beta=0.2)(b).losses
    api = prefzoo.combine([(0.8, "dpo"), (0.2, "bco-pair"), (1.0, "sft")], beta=0.2)(b).losses
    mpo = prefzoo.get_loss("mpo", beta=0.2)(b).losses
    manual = sum(
        w * prefzoo.get_loss(n, **p)(b).losses
        for w, n, p in [(0.8, "dpo", {"beta": 0.2}), (0.2, "bco-pair", {"beta": 0.2}), (1.0, "sft", {})]
    )
    for got in (s, api, mpo):
        torch.testing.assert_close(got, manual)


def test_combination_per_term_params_and_errors():
    loss = prefzoo.get_loss("dpo + 0.5*simpo", **{"simpo.beta": 3.0, "dpo.beta": 0.2})
    assert loss.terms[0][1].params.beta == 0.2 and loss.terms[1][1].params.beta == 3.0
    assert loss.needs == {prefzoo.Need.REFERENCE, prefzoo.Need.LENGTHS}
    with pytest.raises(LossParamError, match="no term of the combination has the parameter"):
        prefzoo.get_loss("dpo + simpo", tau=1.0)
    with pytest.raises(LossParamError, match="WEIGHT\\*NAME"):
        prefzoo.get_loss("dpo + 0.5**simpo")
    with pytest.raises(UnknownLossError):
        prefzoo.get_loss("dpo + 0.5*simpoo")


def test_combination_strings_read_weights_and_route_typed_params():
    from prefzoo.losses.combine import parse_params, parse_terms
    from prefzoo.registry import loss_spec, parse_loss_params

    assert parse_terms("dpo + 0.5*sft + 2e-1 * bco-pair") == [(1.0, "dpo"), (0.5, "sft"), (0.2, "bco-pair")]
    unreadable = (r"^cannot read the loss combination 'dpo \+ 0\.5\*\*sft' at '0\.5\*\*sft': "
                  r"write terms as WEIGHT\*NAME joined by '\+', e\.g\. '0\.8\*dpo \+ 0\.2\*bco-pair \+ 1\.0\*sft'$")
    with pytest.raises(LossParamError, match=unreadable):
        parse_terms("dpo + 0.5**sft")
    # a dotted key goes to its term only; a bare key to the first term that has it; strings typed by that term
    got = parse_loss_params("dpo + 0.5*simpo", ["simpo.gamma_beta_ratio=1", "dpo.beta=0.2", "beta=3"])
    assert got == {"simpo.gamma_beta_ratio": 1.0, "dpo.beta": 0.2, "beta": 3.0}
    assert all(isinstance(v, float) for v in got.values())
    # a term's name may itself hold dots (a plugin's 'org.dpo'): the key splits at its last dot
    lookup = {"org.dpo": loss_spec("dpo"), "sft": loss_spec("sft")}.__getitem__
    assert parse_params("org.dpo + sft", {"org.dpo.beta": "0.3"}, lookup) == {"org.dpo.beta": 0.3}
    with pytest.raises(LossParamError, match=r"^no term of 'dpo \+ 0\.5\*simpo' has a parameter 'tau'$"):
        parse_loss_params("dpo + 0.5*simpo", ["tau=1"])
    with pytest.raises(LossParamError, match=r"^no term of 'dpo \+ sft' has a parameter 'gamma_beta_ratio'$"):
        parse_loss_params("dpo + sft", ["dpo.gamma_beta_ratio=1"])
    with pytest.raises(LossParamError, match=r"^no term of the combination has the parameter\(s\) tau, zeta$"):
        prefzoo.get_loss("dpo + simpo", zeta=1.0, tau=1.0)


def test_broken_loss_output_is_named():
    from prefzoo import LossOutput, LossOutputError, LossSpec
    from prefzoo.losses.dpo import DPOParams
    from prefzoo.spec import Loss

    def bad(batch, p, ctx):
        return LossOutput(batch.policy_chosen_logps.sum(), batch.policy_chosen_logps, batch.policy_rejected_logps)

    spec = LossSpec(
        name="bad", fn=bad, params_cls=DPOParams, family="x", formula="", paper="", scores="", plugin="my-plugin"
    )
    with pytest.raises(LossOutputError, match=r"loss 'bad' \(plugin 'my-plugin'\) returned losses of shape \(\)"):
        Loss(spec, DPOParams())(full_batch())


def test_robust_stays_accurate_in_float32_as_label_smoothing_nears_half():
    """Regression (found by the low-precision property): the listed form divided a cancelled numerator by 1 − 2ε."""
    b = PreferenceBatch(
        policy_chosen_logps=torch.zeros(1),
        policy_rejected_logps=torch.zeros(1),
        ref_chosen_logps=torch.zeros(1),
        ref_rejected_logps=torch.zeros(1),
    )
    out = prefzoo.get_loss("robust", label_smoothing=0.49476783957680515)(b)
    assert abs(out.losses.item() - 0.6931471805599453) < 2e-7


def test_one_key_value_parser_for_cli_and_yaml():
    from prefzoo.registry import parse_loss_params
    from prefzoo.spec import parse_assignments

    assert parse_assignments(["beta=0.1", " gamma = a=b "], "--loss-param") == {"beta": "0.1", "gamma": "a=b"}
    for bad in ("beta", "=0.1"):
        with pytest.raises(LossParamError, match=r"--judge-param .*expected KEY=VALUE"):
            parse_assignments([bad], "--judge-param")
    # YAML scalars are read like the same text on the command line: 1 for a float is 1.0, not the int 1
    yaml = parse_loss_params("mmpo", {"beta": 1, "reward_epsilon": "0.5"})
    assert yaml == parse_loss_params("mmpo", ["beta=1", "reward_epsilon=0.5"]) == {"beta": 1.0, "reward_epsilon": 0.5}
    assert type(yaml["beta"]) is float
    with pytest.raises(LossParamError, match="parameter 'beta': cannot read 'True' as float"):
        parse_loss_params("mmpo", {"beta": True})
    assert parse_loss_params("dpo + simpo", {"simpo.beta": 2}) == {"simpo.beta": 2.0}


def test_mpo_keeps_no_state_across_calls_or_registries():
    """MPO is built from the dpo module's own specs per call: nothing cached that could outlive reset_registry()."""
    from prefzoo.losses import combine

    def state():
        return {k: len(v) for k, v in vars(combine).items() if isinstance(v, dict | list | set)}

    b = full_batch(dtype=torch.float64)
    before = state()
    for beta in (0.1, 0.2, 0.3):
        prefzoo.get_loss("mpo", beta=beta)(b)
    prefzoo.reset_registry()
    prefzoo.get_loss("mpo", beta=0.4)(b)
    assert state() == before


def test_combination_metrics_name_each_term_and_rewards_come_from_the_first():
    """Each term's mean loss as "<term>/loss"; a term's bare metric key is prefixed with its name, a key with a "/"
    is kept; the rewards (and per-completion rewards of list terms) are the first term's."""
    from prefzoo import GroupBatch, LossOutput, LossSpec
    from prefzoo.losses.dpo import DPOParams
    from prefzoo.spec import Loss

    def plain(batch, p, ctx):
        m = batch.policy_chosen_logps - batch.policy_rejected_logps  # (B,)
        return LossOutput(-m, m.detach(), -m.detach(), {"gap": m.detach().mean(), "x/kept": torch.tensor(7.0)})

    spec = LossSpec(name="plain", fn=plain, params_cls=DPOParams, family="x", formula="", paper="", scores="")
    b = full_batch(dtype=torch.float64)
    out = prefzoo.combine([(1.0, "dpo"), (0.5, Loss(spec, DPOParams()))])(b)
    dpo = prefzoo.get_loss("dpo")(b)
    gap = (b.policy_chosen_logps - b.policy_rejected_logps).detach()
    assert set(out.metrics) == {"dpo/loss", "plain/loss", "plain/gap", "x/kept"}
    torch.testing.assert_close(out.metrics["dpo/loss"], dpo.losses.detach().mean(), atol=0, rtol=0)
    torch.testing.assert_close(out.metrics["plain/loss"], -gap.mean(), atol=0, rtol=0)
    torch.testing.assert_close(out.metrics["plain/gap"], gap.mean(), atol=0, rtol=0)
    assert out.metrics["x/kept"].item() == 7.0
    torch.testing.assert_close(out.chosen_rewards, dpo.chosen_rewards, atol=0, rtol=0)

    g = GroupBatch(policy_logps=-torch.rand(2, 3, dtype=torch.float64),
                   ref_logps=-torch.rand(2, 3, dtype=torch.float64))
    lists = prefzoo.combine([(1.0, "lipo"), (1.0, "dpo-pl")])(g)
    assert lists.rewards is not None
    torch.testing.assert_close(lists.rewards, prefzoo.get_loss("lipo")(g).rewards, atol=0, rtol=0)


def test_combination_spec_is_derived_from_its_terms():
    """Name, formula, paper, scores and the declarations that select properties all follow the terms."""
    from prefzoo import Shape
    from prefzoo.losses.combine import CombinationParams
    from prefzoo.spec import Loss

    dpo, sft = prefzoo.loss_spec("dpo"), prefzoo.loss_spec("sft")
    a = prefzoo.combine([(1.0, "dpo"), (0.5, "sft")]).spec
    assert a.name == "1*dpo + 0.5*sft" and a.family == "combination" and a.plugin == "prefzoo.losses.combine"
    assert a.formula == f"1·[{dpo.formula}] + 0.5·[{sft.formula}]"
    assert a.paper == f"{dpo.paper}; {sft.paper}"
    assert a.scores == f"those of dpo: {dpo.scores}"
    assert a.description == "Weighted combination of registered losses."
    assert a.shapes == {Shape.PAIR} and a.builtin is True
    assert a.monotone is True and a.shift_invariant is False and a.batch_coupled is False  # sft: absolute log π
    b = prefzoo.combine([(1.0, "mmpo"), (-0.5, "simpo")]).spec
    assert b.monotone is False and b.batch_coupled is True  # a negative weight; mmpo normalises over the batch
    assert prefzoo.combine([(1.0, "dpo"), (0.0, "sft")]).spec.monotone is True  # a zero weight keeps monotonicity
    assert prefzoo.combine([(1.0, "dpo"), (1.0, "aot")], **{"aot.label_smoothing": 0.1}).spec.monotone is False
    assert prefzoo.combine([(1.0, "dpo"), (1.0, "aot")]).spec.monotone is True  # aot: monotone without smoothing
    stateless = prefzoo.combine([(1.0, "dpo"), (0.5, "sft")])
    assert stateless.state is None and not stateless.spec.stateful
    assert stateless.params == CombinationParams()
    assert prefzoo.combine([(1.0, "dpo"), (2.0, "dpo")]).spec.paper == dpo.paper  # each paper once
    assert prefzoo.combine([(1.0, "dpo"), (2.0, "ipo")]).spec.shift_invariant is True
    assert prefzoo.combine([(1.0, "lipo"), (1.0, "dpo-pl")]).spec.shapes == {Shape.LIST}
    plugin_term = Loss(dataclasses.replace(dpo, name="my-dpo", builtin=False), dpo.params())
    assert prefzoo.combine([(1.0, "dpo"), (1.0, plugin_term)]).spec.builtin is False
    no_shape = r"^cannot combine 1\*kto \+ 1\*dpo: its terms take no batch shape in common$"
    with pytest.raises(LossParamError, match=no_shape):
        prefzoo.combine([(1.0, "kto"), (1.0, "dpo")])
    with pytest.raises(LossParamError, match=r"^a loss combination needs at least one term$"):
        prefzoo.combine([])


def test_param_declares_doc_bounds_and_choices_read_back_and_enforced():
    """Built inside the test (not at import), so a broken ``param`` shows here and not only when prefzoo imports."""
    from prefzoo.spec import LossParams, param, param_infos

    @dataclasses.dataclass(frozen=True, kw_only=True)
    class Declared(LossParams):
        mode: str = param("a", "which mode", choices=["a", "b"])
        rate: float = param(0.5, "a rate in (0, 1]", gt=0.0, le=1.0)

    mode, rate = param_infos(Declared)
    assert (mode.name, mode.default, mode.doc, mode.choices) == ("mode", "a", "which mode", ("a", "b"))
    assert (rate.default, rate.doc) == (0.5, "a rate in (0, 1]")
    assert (rate.gt, rate.ge, rate.lt, rate.le) == (0.0, None, None, 1.0)
    assert Declared(mode="b", rate=1.0).rate == 1.0
    with pytest.raises(LossParamError, match="mode"):
        Declared(mode="c")
    with pytest.raises(LossParamError, match="rate"):
        Declared(rate=0.0)


def test_declarations_given_as_functions_of_the_params_are_called():
    dpo = prefzoo.loss_spec("dpo")
    spec = dataclasses.replace(dpo, permutation_equivariant=lambda p: p.beta < 1.0, monotone=lambda p: p.beta < 1.0)
    assert spec.is_permutation_equivariant(dpo.params(beta=0.5)) is True
    assert spec.is_permutation_equivariant(dpo.params(beta=2.0)) is False
    assert spec.is_monotone(dpo.params(beta=2.0)) is False
