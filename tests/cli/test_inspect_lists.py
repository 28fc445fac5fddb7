"""`prefzoo inspect NAME --k K` for list losses: the per-rank weights show the mmpo-list identity and Theorem 3.1."""

from __future__ import annotations

import math

import pytest

import prefzoo
from prefzoo.cli.inspect import list_summary, list_weights
from prefzoo.cli.main import main


@pytest.mark.parametrize("m", [-6.0, 0.0, 3.0])
def test_mmpo_list_weights_are_nll_on_the_best_plus_a_zero_sum_ranking(m):
    w = list_weights(prefzoo.get_loss("mmpo-list"), 4, m)
    assert w[0] == pytest.approx(1.0, abs=1e-12)
    assert sum(w[1:]) == pytest.approx(0.0, abs=1e-12) and w[-1] < 0 < w[1]


def test_mml_weights_are_a_softmax_by_hand():
    """β = 0, r = 0, ε = 0 (R̂ = 0), K = 3, margin 2 around log π = 0: log π = (1, 0, −1), weights softmax(1, 0, −1)."""
    loss = prefzoo.get_loss("mml", beta=0.0, reward_epsilon=0.0, rejected_reward=0.0, norm_eps=0.0)
    w = list_weights(loss, 3, 2.0, logp=0.0)
    z = math.e + 1 + 1 / math.e
    assert w == pytest.approx([math.e / z, 1 / z, 1 / (math.e * z)], rel=1e-12)
    assert "softmax" in list_summary([w])


def test_inspect_k_prints_the_identity(capsys):
    assert main(["inspect", "mmpo-list", "--k", "4", "--points", "3"]) == 0
    out = capsys.readouterr().out
    assert "w_4" in out and "NLL on the best completion" in out and "sum to 0" in out
    assert main(["inspect", "dpo", "--k", "3"]) == 2
    assert "--k 3: needs K >= 2 and a list loss ('dpo' takes pairs)" in capsys.readouterr().err
