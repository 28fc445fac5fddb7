"""The kit's public helpers and rarely taken branches: the literal logsumexp, the references' own refusals and
degenerate normalisation, reference_losses, a report's raise_if_failed, the losses' missing-field errors."""

from __future__ import annotations

import dataclasses

import pytest
import torch

import prefzoo
from prefzoo.testing import check_loss
from prefzoo.testing.reference import _dpo_family, _simple, naive_lse2, reference_losses, to_float64
from prefzoo.types import GroupBatch, GroupBatchError, UnpairedBatch, UnpairedBatchError

F = torch.float64


def _pairs() -> prefzoo.PreferenceBatch:
    t = lambda *v: torch.tensor(v, dtype=F)  # noqa: E731
    lengths = {"chosen_lengths": torch.tensor([3, 5]), "rejected_lengths": torch.tensor([4, 2])}
    return prefzoo.PreferenceBatch(t(-1.0, -4.0), t(-3.0, -1.5), t(-1.5, -3.0), t(-2.0, -2.0), **lengths)


def test_the_literal_logsumexp_underflows_where_the_stable_one_does_not():
    a, b = torch.tensor([0.5, -800.0], dtype=F), torch.tensor([-1.0, -800.0], dtype=F)
    got = naive_lse2(a, b)
    assert got[0] == torch.logaddexp(a, b)[0] and got[1] == float("-inf")
    assert torch.logaddexp(a, b)[1] == pytest.approx(-800.0 + 0.6931471805599453)


@pytest.mark.parametrize("family", [_dpo_family, _simple])
def test_a_reference_family_refuses_a_kind_it_does_not_know(family):
    with pytest.raises(KeyError) as e:
        family("no-such-kind")({k: getattr(_pairs(), k) for k in ("policy_chosen_logps", "policy_rejected_logps",
                                "ref_chosen_logps", "ref_rejected_logps", "chosen_lengths", "rejected_lengths")},
                               prefzoo.loss_spec("dpo").params())  # fmt: skip
    assert e.value.args == ("no-such-kind",)


def test_reference_losses_gives_the_float64_formula_and_whether_only_the_mean_compares():
    loss = prefzoo.get_loss("dpo", beta=0.3)
    got, mean_only = reference_losses("dpo", _pairs(), loss.params)
    assert mean_only is False and got.dtype == F
    torch.testing.assert_close(got, loss(_pairs()).losses, rtol=1e-12, atol=1e-12)


def test_mmpo_with_no_spread_in_its_rewards_normalises_them_to_zero_like_its_reference():
    """β = 0, ε = 0 and r_ε = r_l: every R is the same, the min-max range is 0 and both normalised rewards are 0."""
    spec = prefzoo.loss_spec("mmpo")
    p = spec.params(beta=0.0, norm_eps=0.0, reward_epsilon=0.5, rejected_reward=0.5)
    got = prefzoo.Loss(spec, p)(_pairs())
    want, _ = reference_losses("mmpo", _pairs(), p)
    torch.testing.assert_close(got.losses, want, rtol=1e-12, atol=1e-12)
    assert got.chosen_rewards.tolist() == _pairs().policy_chosen_logps.tolist()  # s = log π + 0


def test_raise_if_failed_raises_with_the_table_only_on_failure():
    check_loss("dpo", properties=["shape"], max_examples=3, dtypes=["float64"]).raise_if_failed()

    def int_rewards(batch, p, ctx):
        out = prefzoo.loss_spec("dpo").fn(batch, p, ctx)
        return dataclasses.replace(out, chosen_rewards=out.chosen_rewards.long())

    broken = dataclasses.replace(prefzoo.loss_spec("dpo"), name="broken", fn=int_rewards, plugin="tests")
    report = check_loss(broken, properties=["shape"], max_examples=3, dtypes=["float64"])
    assert not report.passed
    with pytest.raises(AssertionError) as e:
        report.raise_if_failed()
    assert str(e.value) == f"{report.table()}\n{report.failures_text()}" and "FAILED" in str(e.value)


def test_list_and_unpaired_losses_name_a_field_they_need_that_is_missing():
    g = torch.zeros(2, 3, dtype=F)
    rrhf = prefzoo.loss_spec("rrhf")
    with pytest.raises(GroupBatchError) as e:
        rrhf.fn(GroupBatch(policy_logps=g, scores=g), rrhf.params(), None)
    assert str(e.value).startswith("GroupBatch.") and str(e.value).endswith(" is None but this loss needs it")
    kto = prefzoo.loss_spec("kto")
    z = torch.zeros(2, dtype=F)
    with pytest.raises(UnpairedBatchError) as e:
        kto.fn(UnpairedBatch(policy_logps=z, labels=torch.tensor([True, False])), kto.params(), None)
    assert str(e.value) == "UnpairedBatch.kl_policy_logps is None but this loss needs it"


def test_a_combination_shows_its_weighted_terms():
    c = prefzoo.combine([(1.0, "dpo"), (0.5, "sft")])
    assert repr(c) == f"CombinedLoss({[(w, loss) for w, loss in c.terms]!r})"
    assert repr(c).startswith("CombinedLoss([(1.0, Loss('dpo', ") and "(0.5, Loss('sft', " in repr(c)


# f-divergences on both sides of the kit's capped-exponential branch (a·ρ > 1 and ≤ 1 with a = coef − 1 of ±)
F_DIVERGENCES = [{"f_divergence": "alpha_divergence", "alpha_divergence_coef": c} for c in (0.3, 3.0)] + [
    {"f_divergence": "forward_kl"}, {"f_divergence": "js_divergence"}]  # fmt: skip


def test_the_kits_references_agree_with_the_independent_transcriptions():
    """prefzoo.testing.reference (the property suite's float64 oracle) against tests/losses/reference.py (formulas
    transcribed from the papers and TRL apart from it), for every loss both have, with test_formulas' parameter cases
    and every f-divergence for the DPO family: a slip in either oracle fails here on fixed inputs, whatever the
    property suite's example budget draws."""
    from prefzoo.testing.reference import REFERENCES as KIT
    from tests.losses.reference import REFERENCES as TRANSCRIBED
    from tests.losses.reference import mean_only
    from tests.losses.test_formulas import PARAM_CASES, random_inputs

    names = sorted(set(KIT) & set(TRANSCRIBED))
    assert len(names) >= 30, names
    x = random_inputs(seed=0, b=16)
    rho = torch.cat([x["pw"] - x["rw"], x["pl"] - x["rl"]])
    for a in (0.3 - 1, 3.0 - 1):  # both branches of the kit's f'(ρ) = (e^{aρ} − 1)/a are taken
        assert bool((a * rho > 1).any()) and bool((a * rho <= 1).any())
    batch = prefzoo.PreferenceBatch(x["pw"], x["pl"], x["rw"], x["rl"], chosen_lengths=x["lw"],
                                    rejected_lengths=x["ll"])  # fmt: skip
    checked = compared = total = 0
    for name in names:
        spec = prefzoo.loss_spec(name)
        cases = PARAM_CASES.get(name, [{}])
        if "f_divergence" in {f.name for f in dataclasses.fields(spec.params())}:
            cases = [*cases, *F_DIVERGENCES]
        for params in cases:
            kit, kit_mean = KIT[name]
            got = kit(to_float64(batch), spec.params(**params))
            want = TRANSCRIBED[name](dict(x), params)
            if kit_mean or mean_only(name, params):
                got, want = got.mean(), want.mean()
            ok = want.isfinite()  # the transcriptions' naive exps overflow where the kit's stay finite (e^{−z}·σ(z/τ))
            torch.testing.assert_close(
                got[ok], want[ok], rtol=1e-7, atol=1e-9, msg=lambda m, n=name, p=params: f"{n} {p}: {m}"
            )
            checked, compared = checked + 1, compared + int(ok.sum())
            total += ok.numel()
    assert checked >= 60 and compared >= 0.95 * total, (checked, compared, total)


def test_to_float64_holds_every_tensor_field_and_no_example_ids():
    """The oracles' input: every tensor field of PreferenceBatch (absent ones as None, masks kept bool, the rest
    float64), and nothing else: ``example_ids`` are names, not numbers, so they are not a key at all."""
    b = prefzoo.PreferenceBatch(policy_chosen_logps=torch.tensor([-1.0]), policy_rejected_logps=torch.tensor([-2.0]),
                                example_ids=("p0",))
    got = to_float64(b)
    assert set(got) == set(prefzoo.PreferenceBatch.__dataclass_fields__) - {"example_ids"}
    assert got["policy_chosen_logps"].dtype == torch.float64 and got["ref_chosen_logps"] is None


@pytest.mark.parametrize(("rho_w", "rho_l"), [(80.5 + 1e-6, 80.5), (80.9, 80.9 - 1e-5), (90.0, 85.0)])
def test_the_kits_f_delta_past_the_cap_has_no_cancellation_just_above_it(rho_w, rho_l):
    """α-divergence (a = α − 1 = 1) with both a·ρ past 80, the first unit above the cap included: the kit's oracle
    takes the algebraic difference there, equal to the capped exponentials' difference computed exactly (Fractions
    of the same floats); subtracting the two capped values in float64 instead loses ~1e-9 of it at these gaps."""
    from fractions import Fraction
    from math import exp

    from prefzoo.testing.reference import _delta

    p = prefzoo.get_loss("dpo", f_divergence="alpha_divergence", alpha_divergence_coef=2.0).params
    zero = torch.zeros(1, dtype=F)
    x = {"policy_chosen_logps": torch.tensor([rho_w], dtype=F), "ref_chosen_logps": zero,
         "policy_rejected_logps": torch.tensor([rho_l], dtype=F), "ref_rejected_logps": zero}  # fmt: skip

    def capped(r: float) -> Fraction:  # e^80·(1 + 0.1·u/(0.1 + u)), u = r − 80, exactly
        u = Fraction(r) - 80
        return Fraction(exp(80.0)) * (1 + Fraction(1, 10) * u / (Fraction(1, 10) + u))

    want = float(capped(rho_w) - capped(rho_l))  # (e^{aρ_w} − 1 − (e^{aρ_l} − 1)) / a with a = 1
    assert float(_delta(x, p)[0]) == pytest.approx(want, rel=1e-12)
