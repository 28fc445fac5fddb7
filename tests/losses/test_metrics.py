"""The metrics each loss logs, by hand: exact keys and values (mutation testing found no test reading them).

mmpo's are in test_mmpo.py::test_metrics_by_hand, kto's and bco's in test_unpaired.py.
"""

from __future__ import annotations

import math

import pytest
import torch

import prefzoo
from prefzoo import GroupBatch

F64 = torch.float64
LN2, LN3 = math.log(2), math.log(3)


def pairs(pw, pl, rw=None, rl=None, lw=None, ll=None):
    t = lambda xs: None if xs is None else torch.tensor(xs, dtype=F64)  # noqa: E731
    n = lambda xs: None if xs is None else torch.tensor(xs)  # noqa: E731
    return prefzoo.PreferenceBatch(t(pw), t(pl), t(rw), t(rl), n(lw), n(ll))


def metrics(name, batch, **params):
    return {k: float(v) for k, v in prefzoo.get_loss(name, **params)(batch).metrics.items()}


def assert_metrics(got, want):
    assert got.keys() == want.keys(), got
    for k, v in want.items():
        assert got[k] == pytest.approx(v, rel=1e-14, abs=1e-15), k


@pytest.mark.parametrize("name", ["cpo", "cpo-hinge", "cpo-ipo", "cpo-simpo"])
def test_cpo_family_logs_the_mean_nll_of_the_chosen_response(name):
    """log π(y_w) = (−6, −3), |y_w| = (3, 1): per example NLL (2, 3), mean 2.5; over the batch's tokens the shares
    N·(−log π(y_w))/Σ|y_w| = (3, 1.5), whose mean is TRL's token mean 9/4."""
    b = pairs([-6.0, -3.0], [-7.0, -4.0], lw=[3, 1], ll=[2, 2])
    assert_metrics(metrics(name, b), {"cpo/nll": 2.5})
    assert_metrics(metrics(name, b, nll_reduction="batch-tokens"), {"cpo/nll": 2.25})


def test_orpo_logs_the_log_odds_ratio_and_the_nll_and_scores_beta_times_the_average():
    """a_w = 2·ln ½ / 2 = ln ½, a_l = ln ¼ / 1: log odds(y_w) = ln ½ − ln ½ = 0, log odds(y_l) = ln ¼ − ln ¾ = −ln 3,
    so the log odds ratio is ln 3; the NLL −a_w = ln 2.  Second pair: y_w and y_l swapped, −ln 3 and ln 4."""
    b = pairs([2 * math.log(0.5), math.log(0.25)], [math.log(0.25), 2 * math.log(0.5)], lw=[2, 1], ll=[1, 2])
    out = prefzoo.get_loss("orpo", beta=0.1)(b)
    assert_metrics({k: float(v) for k, v in out.metrics.items()},
                   {"orpo/log_odds_ratio": 0.0, "orpo/nll": (LN2 + 2 * LN2) / 2})
    one = pairs([2 * math.log(0.5)], [math.log(0.25)], lw=[2], ll=[1])
    assert_metrics(metrics("orpo", one, beta=0.1), {"orpo/log_odds_ratio": LN3, "orpo/nll": LN2})
    # one pair: TRL's token mean over the batch is the pair's own (the gather of one process is the identity)
    assert_metrics(metrics("orpo", one, beta=0.1, nll_reduction="batch-tokens"),
                   {"orpo/log_odds_ratio": LN3, "orpo/nll": LN2})
    # the loss itself: −a_w − β·log σ(ln 3) = ln 2 + 0.1·ln(4/3)
    out = prefzoo.get_loss("orpo", beta=0.1)(one)
    assert out.losses.item() == pytest.approx(LN2 + 0.1 * math.log(4 / 3), rel=1e-14)
    # scores: β·a (the average log-probs), 0.1·ln ½ and 0.1·ln ¼
    assert out.chosen_rewards.item() == pytest.approx(-0.1 * LN2, rel=1e-14)
    assert out.rejected_rewards.item() == pytest.approx(-0.2 * LN2, rel=1e-14)


def test_dpop_logs_the_mean_penalty():
    """ρ_w = (1, −1, −3): max(0, −ρ_w) = (0, 1, 3), mean 4/3."""
    b = pairs([-2.0, -4.0, -6.0], [-4.0, -4.0, -4.0], [-3.0, -3.0, -3.0], [-3.0, -3.0, -3.0])
    assert_metrics(metrics("dpop", b, beta=0.5), {"dpop/penalty": 4 / 3})


THIRDS = [[math.log(0.5), math.log(0.25), math.log(0.25)]]  # π of the three completions sums to 1


def grp(logps, ref=None, scores=None, lengths=None):
    t = lambda xs: None if xs is None else torch.tensor(xs, dtype=F64)  # noqa: E731
    return GroupBatch(policy_logps=t(logps), ref_logps=t(ref) if ref is not None else torch.zeros(1, 3, dtype=F64),
                      scores=t(scores), lengths=None if lengths is None else torch.tensor(lengths))


def test_mml_and_mmpo_list_log_bounds_weight_of_the_best_and_pl_nll():
    """β = 1, r_ε = 1, r_rest = 0, ε = 0, log π_ref = (0, −1, −2): R = (1, −1, −2), min −2, max 1, R̂ = (1, ⅓, 0).
    s = (ln ½ + 1, ln ¼ + ⅓, ln ¼): the softmax weight of the best is ½e / (½e + ¼e^⅓ + ¼) = 2e / (2e + e^⅓ + 1).
    mmpo-list's Plackett–Luce NLL: ln((2e + e^⅓ + 1)/(2e)) + ln((e^⅓ + 1)/e^⅓) + 0."""
    b = grp(THIRDS, ref=[[0.0, -1.0, -2.0]])
    kw = dict(beta=1.0, reward_epsilon=1.0, rejected_reward=0.0, norm_eps=0.0)
    e, c = math.e, math.exp(1 / 3)
    want = {"mmpo/reward_min": -2.0, "mmpo/reward_max": 1.0, "mml/weight_best": 2 * e / (2 * e + c + 1)}
    assert_metrics(metrics("mml", b, **kw), want)
    pl = math.log((2 * e + c + 1) / (2 * e)) + math.log((c + 1) / c)
    assert_metrics(metrics("mmpo-list", b, **kw), {**want, "mmpo-list/pl_nll": pl})


def test_lipo_logs_the_sum_of_its_lambda_weights():
    """test_lists.py::test_lipo_by_hand's case: Δ_12 + Δ_13 + Δ_23 = 2(1 − a) + 3/2 + (a − ½) = 3 − a, a = 1/log₂3."""
    b = grp([[-1.0, -2.0, -3.0]], scores=[[2.0, 1.0, 0.0]])
    assert_metrics(metrics("lipo", b, beta=1.0), {"lipo/weight_sum": 3 - 1 / math.log2(3)})


def test_rrhf_logs_its_rank_and_sft_terms():
    """test_lists.py::test_rrhf_by_hand's case: rank loss ½, SFT −log π(z_1) = 2."""
    b = grp([[-2.0, -1.5, -3.0]], lengths=[[2, 3, 1]])
    assert_metrics(metrics("rrhf", b), {"rrhf/rank": 0.5, "rrhf/sft": 2.0})
