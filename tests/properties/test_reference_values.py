"""Hand-derived values: a few worked cases per loss, each computed here with the math module from the formula.

Common case unless stated: log-ratios ρ_w = log π(y_w) − log π_ref(y_w) = 1 and ρ_l = −1
(policy −2 and −4 against reference −3 and −3), so Δ = ρ_w − ρ_l = 2; β = 0.5 makes βΔ = 1.
"""

from __future__ import annotations

import math

import pytest
import torch

import prefzoo

sig = lambda x: 1 / (1 + math.exp(-x))  # noqa: E731
nls = lambda x: math.log1p(math.exp(-x))  # −log σ(x)  # noqa: E731


def run(name, pw=-2.0, pl=-4.0, rw=-3.0, rl=-3.0, lw=1, ll=1, **params):
    f = lambda x: torch.tensor([x], dtype=torch.float64)  # noqa: E731
    b = prefzoo.PreferenceBatch(f(pw), f(pl), f(rw), f(rl), torch.tensor([lw]), torch.tensor([ll]))
    return prefzoo.get_loss(name, **params)(b).losses.item()


CASES = [
    # (loss, params, batch overrides, expected, derivation)
    ("dpo", {"beta": 0.5}, {}, nls(1.0), "−log σ(βΔ) = log(1 + e^{−1})"),
    ("dpo", {"beta": 0.1}, {"pw": -3.0, "pl": -3.0}, math.log(2), "policy = reference: −log σ(0) = log 2"),
    ("cdpo", {"beta": 0.5, "label_smoothing": 0.1}, {}, 0.9 * nls(1) + 0.1 * nls(-1),
     "0.9·log(1+e^{−1}) + 0.1·log(1+e)"),
    ("robust", {"beta": 0.5, "label_smoothing": 0.1}, {}, (0.9 * nls(1) - 0.1 * nls(-1)) / 0.8,
     "(0.9·log(1+e^{−1}) − 0.1·log(1+e)) / 0.8"),
    ("hinge", {"beta": 0.5}, {}, 0.0, "max(0, 1 − 1) = 0"),
    ("hinge", {"beta": 0.25}, {}, 0.5, "max(0, 1 − 0.5) = 0.5"),
    ("ipo", {"beta": 0.5}, {}, 1.0, "(Δ̄ − 1/(2β))² = (2 − 1)² = 1 with |y| = 1"),
    ("ipo", {"beta": 0.5}, {"lw": 2, "ll": 2}, 0.0, "Δ̄ = 1/2 + 1/2 = 1: (1 − 1)² = 0"),
    ("exo-pair", {"beta": 0.5, "label_smoothing": 1e-3}, {},
     sig(1) * (math.log(sig(1)) - math.log(0.999)) + sig(-1) * (math.log(sig(-1)) - math.log(1e-3)),
     "KL([σ(1), σ(−1)] ‖ [0.999, 0.001])"),
    ("nca-pair", {"beta": 0.5}, {}, nls(0.5) + 0.5 * nls(-0.5) + 0.5 * nls(0.5),
     "−log σ(0.5) − ½log σ(−0.5) − ½log σ(0.5)"),
    ("bco-pair", {"beta": 0.5}, {}, 2 * nls(0.5), "−log σ(0.5) − log σ(0.5)"),
    ("sppo-hard", {"beta": 0.5}, {}, 0.0, "(1 − 1)² + (−1 + 1)² = 0"),
    ("sppo-hard", {"beta": 0.5}, {"pw": -1.0, "pl": -3.0}, 2.0, "ρ = (2, 0): (2 − 1)² + (0 + 1)² = 2"),
    ("apo-zero", {"beta": 0.5}, {}, 2 * sig(-0.5), "1 − σ(0.5) + σ(−0.5) = 2σ(−0.5)"),
    ("apo-down", {"beta": 0.5}, {}, sig(0.5) + 1 - sig(1.0), "σ(0.5) + 1 − σ(1)"),
    ("discopop", {"beta": 0.5, "tau": 0.05}, {}, nls(1) * (1 - sig(20)) + math.exp(-1) * sig(20),
     "−log σ(1)(1 − σ(20)) + e^{−1}σ(20)"),
    ("sigmoid-norm", {"beta": 0.5}, {"lw": 2, "ll": 4}, nls(0.375), "β(1/2 + 1/4) = 0.375"),
    ("rdpo", {"beta": 0.5, "alpha": 0.01}, {"lw": 3, "ll": 1}, nls(1.02), "βΔ + α(3 − 1) = 1.02"),
    ("sft", {}, {"pw": -6.0, "lw": 3}, 2.0, "−(−6)/3"),
    ("simpo", {"beta": 2.0, "gamma_beta_ratio": 0.5}, {"pw": -6.0, "pl": -12.0, "lw": 3, "ll": 4}, nls(1.0),
     "β(−2 − (−3) − 0.5) = 1"),
    ("cpo", {"beta": 0.1, "alpha": 1.0}, {"pw": -6.0, "pl": -12.0, "lw": 3}, nls(0.6) + 2.0, "−log σ(0.6) + 6/3"),
    ("mpo", {"beta": 0.5}, {"lw": 2},
     0.8 * nls(1.0) + 0.2 * 2 * nls(0.5) + 1.0 * 1.0, "0.8·dpo + 0.2·bco-pair + sft (−(−2)/2 = 1)"),
    ("aot", {"beta": 0.5}, {}, nls(1.0), "one pair: the sorted pairing is the pair itself, = dpo"),
    ("mmpo", {"beta": 0.1}, {"pw": -5.0, "pl": -6.0, "rw": -10.0, "rl": -12.0}, 4.0, "−s_w = −(−5 + 1) = 4"),
]


def _orpo_expected():
    a_w, a_l = -2.0, -3.0  # −6/3 and −12/4
    lo = lambda a: a - math.log(1 - math.exp(a))  # noqa: E731
    return 2.0 + 0.1 * nls(lo(a_w) - lo(a_l))


CASES.append(("orpo", {"beta": 0.1}, {"pw": -6.0, "pl": -12.0, "lw": 3, "ll": 4}, _orpo_expected(),
              "−a_w − β·log σ(log odds_w − log odds_l), a = (−2, −3)"))


@pytest.mark.parametrize(("name", "params", "over", "expected", "why"), CASES,
                         ids=[f"{c[0]}-{i}" for i, c in enumerate(CASES)])
def test_hand_derived(name, params, over, expected, why):
    assert run(name, **over, **params) == pytest.approx(expected, rel=1e-12, abs=1e-12), why


def test_aot_two_pairs_sorted_pairing():
    """Margins (1, 3) against reference margins (2, 0): sorted (1, 3) − (0, 2) = (1, 1): mean = −log σ(β)."""
    f = lambda xs: torch.tensor(xs, dtype=torch.float64)  # noqa: E731
    b = prefzoo.PreferenceBatch(f([-1.0, -1.0]), f([-2.0, -4.0]), f([-1.0, -2.0]), f([-3.0, -2.0]))
    out = prefzoo.get_loss("aot", beta=0.5)(b)
    assert out.losses.mean().item() == pytest.approx(nls(0.5), rel=1e-12)
