"""The list losses on hand-derived cases: values and gradients worked out in the docstrings."""

from __future__ import annotations

import math

import pytest
import torch

import prefzoo
from prefzoo import GroupBatch, GroupBatchError

F64 = torch.float64
LN2 = math.log(2)


def grp(logps, ref=None, scores=None, lengths=None, mask=None):
    t = lambda xs: None if xs is None else torch.tensor(xs, dtype=F64)  # noqa: E731
    return GroupBatch(policy_logps=t(logps).requires_grad_(), ref_logps=t(ref) if ref is not None else
                      torch.zeros(len(logps), len(logps[0]), dtype=F64), scores=t(scores),
                      lengths=None if lengths is None else torch.tensor(lengths),
                      mask=None if mask is None else torch.tensor(mask))


def value_and_grad(name, b, **params):
    out = prefzoo.get_loss(name, **params)(b)
    (g,) = torch.autograd.grad(out.losses.sum(), b.policy_logps)
    return out, g


FLAT = dict(beta=0.0, reward_epsilon=0.0, rejected_reward=0.0, norm_eps=0.0)  # R = 0 everywhere, so R̂ = 0, s = log π
THIRDS = [[math.log(0.5), math.log(0.25), math.log(0.25)]]  # π of the three completions sums to 1


def test_mml_is_minus_log_marginal_and_its_gradient_is_softmax():
    """s = log π = (ln ½, ln ¼, ln ¼): L = −log(½ + ¼ + ¼) = 0 and −∂L/∂log π = softmax(s) = (½, ¼, ¼)."""
    out, g = value_and_grad("mml", grp(THIRDS), **FLAT)
    assert out.losses.item() == pytest.approx(0.0, abs=1e-15)
    assert g[0].tolist() == pytest.approx([-0.5, -0.25, -0.25], abs=1e-15)
    assert out.rewards is not None and out.rewards[0].tolist() == pytest.approx(THIRDS[0])


def test_mml_weight_best_ignores_a_padding_slot():
    """s = (ln ½, ln ¼, ln ¼) plus a padding slot: softmax over the real slots only, so the best's weight is ½."""
    b = grp([THIRDS[0] + [0.0]], mask=[[True, True, True, False]])
    out = prefzoo.get_loss("mml", **FLAT)(b)
    assert out.metrics["mml/weight_best"].item() == pytest.approx(0.5, rel=1e-14)


def test_mml_rank_rewards_by_hand():
    """β = 0, r_ε = 1, r_rest = 0, ε = 0: R = (1, 0, 0), min 0, max 1, so R̂ = R and s = (ln ½ + 1, ln ¼, ln ¼).

    L = −log(½e + ¼ + ¼) = −log((e + 1)/2) = −0.6201145069582775.
    """
    out, _ = value_and_grad("mml", grp(THIRDS), beta=0.0, reward_epsilon=1.0, rejected_reward=0.0, norm_eps=0.0)
    assert out.losses.item() == pytest.approx(-0.6201145069582775, rel=1e-14)


def test_mml_score_rewards_are_scaled_over_the_whole_batch():
    """β = 0, ε = 0, reward_from='score'.  Scores over the batch: (4, 2, 0) and (2, 2, padding) → min 0, max 4,
    r = (1, ½, 0) and (½, ½); then R = r has min 0 and max 1 again, so R̂ = r.  With log π = 0:
    group 0: L = −log(e + e^½ + 1), group 1: L = −log(2e^½) (the padding slot, log π = 0 there, is left out)."""
    b = grp([[0.0, 0.0, 0.0], [0.0, 0.0, 0.0]], scores=[[4.0, 2.0, 0.0], [2.0, 2.0, 0.0]],
            mask=[[True, True, True], [True, True, False]])
    out, _ = value_and_grad("mml", b, reward_from="score", beta=0.0, norm_eps=0.0)
    want = [-math.log(math.e + math.exp(0.5) + 1), -math.log(2 * math.exp(0.5))]
    assert out.losses.tolist() == pytest.approx(want, rel=1e-14)


def test_mmpo_list_is_nll_on_the_best_plus_the_ranking_of_the_rest():
    """s = (ln ½, ln ¼, ln ¼), ranked by column.  mml term: 0.  Plackett–Luce factors: first −log(½/1) = ln 2,
    second −log(¼/½) = ln 2, last 0: L = 2 ln 2 = −s_1 + ln 2, the identity.  Gradient: −1 on the best (exactly);
    z_2: −¼ (mml) + ¼ (first factor) − ½ (second) = −½;  z_3: −¼ + ¼ + ½ = +½."""
    out, g = value_and_grad("mmpo-list", grp(THIRDS), **FLAT)
    assert out.losses.item() == pytest.approx(2 * LN2, rel=1e-14)
    assert g[0].tolist() == pytest.approx([-1.0, -0.5, 0.5], abs=1e-15)


def test_dpo_pl_by_hand_with_a_tie():
    """β = 1, π_ref = 1 (log 0): u = log π = (ln ½, ln ¼, ln ¼).  Scores (1, 0, 0) tie the last two: the first
    factor is ln 2, and each tied completion normalises over both (Breslow): ln(½/¼) = ln 2 each: L = 3 ln 2.
    Without the tie (column order) the last factor is 0: L = 2 ln 2."""
    out, _ = value_and_grad("dpo-pl", grp(THIRDS, scores=[[1.0, 0.0, 0.0]]), beta=1.0)
    assert out.losses.item() == pytest.approx(3 * LN2, rel=1e-14)
    out, _ = value_and_grad("dpo-pl", grp(THIRDS), beta=1.0)
    assert out.losses.item() == pytest.approx(2 * LN2, rel=1e-14)


def test_lipo_by_hand():
    """β = 1, log π_ref = 0, log π = (−1, −2, −3) so u = (−1, −2, −3), τ = (1, 2, 3); ψ = (2, 1, 0), G = (3, 1, 0).
    1/D(τ) = 1/log₂(1 + τ) = (1, a, ½), a = 1/log₂3 = 0.6309297535714575.
    Δ_12 = 2·(1 − a), Δ_13 = 3·½, Δ_23 = 1·(a − ½);  L = Δ_12·sp(−1) + Δ_13·sp(−2) + Δ_23·sp(−1),
    sp(x) = log(1 + eˣ): sp(−1) = 0.31326168751822286, sp(−2) = 0.1269280110429725;  L = 0.4626384285325418."""
    out, g = value_and_grad("lipo", grp([[-1.0, -2.0, -3.0]], scores=[[2.0, 1.0, 0.0]]), beta=1.0)
    assert out.losses.item() == pytest.approx(0.4626384285325418, rel=1e-14)
    assert g[0, 0] < 0 < g[0, 2]


def test_lipo_reads_u_relative_to_the_reference():
    """The case above with log π_ref = (−5, −0.5, −2) added to both log π and log π_ref: u = β(log π − log π_ref) and
    the loss do not change."""
    ref = [[-5.0, -0.5, -2.0]]
    out, _ = value_and_grad("lipo", grp([[-6.0, -2.5, -5.0]], ref=ref, scores=[[2.0, 1.0, 0.0]]), beta=1.0)
    assert out.losses.item() == pytest.approx(0.4626384285325418, rel=1e-14)
    assert out.rewards is not None and out.rewards[0].tolist() == pytest.approx([-1.0, -2.0, -3.0], rel=1e-15)


def test_lipo_weight_sum_metric_is_the_mean_over_groups():
    """Two copies of the group above: Σ Δ = 2(1 − a) + 3·½ + (a − ½) = 3 − a in each, so the mean is 3 − a."""
    b = grp([[-1.0, -2.0, -3.0]] * 2, scores=[[2.0, 1.0, 0.0]] * 2)
    out = prefzoo.get_loss("lipo", beta=1.0)(b)
    assert out.metrics["lipo/weight_sum"].item() == pytest.approx(3 - 1 / math.log2(3), rel=1e-14)


def test_lipo_tied_pair_keeps_the_weight_of_adjacent_ranks():
    """u tied at (−1, −1) with ψ = (1, 0): either order gives |1/D(1) − 1/D(2)| = 1 − a, so Δ = (2 − 1)(1 − a) and
    L = (1 − a)·log 2, not 0 (a mid-rank would give both D(1.5) and drop the pair)."""
    out, _ = value_and_grad("lipo", grp([[-1.0, -1.0]], scores=[[1.0, 0.0]]), beta=1.0)
    assert out.losses.item() == pytest.approx((1 - 1 / math.log2(3)) * LN2, rel=1e-14)


def test_rrhf_by_hand():
    """log π = (−2, −1.5, −3), |z| = (2, 3, 1): p = (−1, −½, −3), ranked by column.  Hinges: p_2 − p_1 = ½ (z_2 is
    ranked below z_1 but scores higher), the others negative → rank loss ½; SFT −log π(z_1) = 2: L = 2.5.
    Gradient: z_1: −1/2 (hinge) − 1 (SFT) = −1.5, z_2: +1/3, z_3: 0."""
    out, g = value_and_grad("rrhf", grp([[-2.0, -1.5, -3.0]], lengths=[[2, 3, 1]]))
    assert out.losses.item() == pytest.approx(2.5, rel=1e-15)
    assert g[0].tolist() == pytest.approx([-1.5, 1 / 3, 0.0], abs=1e-15)
    assert out.rewards is not None and out.rewards[0].tolist() == pytest.approx([-1.0, -0.5, -3.0])


def test_rrhf_tied_bests_share_the_sft_term():
    """Scores (1, 1, 0): both bests get half of the SFT gradient; the tied pair is not hinged."""
    out, g = value_and_grad("rrhf", grp([[-2.0, -1.0, -3.0]], scores=[[1.0, 1.0, 0.0]], lengths=[[1, 1, 1]]))
    assert out.losses.item() == pytest.approx(1.5, rel=1e-15)  # (2 + 1)/2, no violated pair
    assert g[0].tolist() == pytest.approx([-0.5, -0.5, 0.0], abs=1e-15)


def test_rewards_best_and_worst_follow_the_ranking_not_the_columns():
    b = grp([[-1.0, -2.0, -3.0]], scores=[[0.0, 5.0, 1.0]])
    out = prefzoo.get_loss("dpo-pl", beta=1.0)(b)
    assert out.chosen_rewards.item() == -2.0 and out.rejected_rewards.item() == -1.0


def test_lipo_padding_slot_changes_nothing():
    """A padding slot (filler 0, so u = 0 above every real u, score 0 tied with the worst) takes no rank and no pair."""
    full = grp([[-1.0, -2.0, -3.0]], scores=[[2.0, 1.0, 0.0]])
    padded = grp([[-1.0, -2.0, -3.0, 0.0]], scores=[[2.0, 1.0, 0.0, 0.0]], mask=[[True, True, True, False]])
    assert prefzoo.get_loss("lipo", beta=1.0)(padded).losses.item() == pytest.approx(0.4626384285325418, rel=1e-14)
    assert prefzoo.get_loss("lipo", beta=1.0)(full).losses.item() == pytest.approx(0.4626384285325418, rel=1e-14)


def test_lipo_gains_are_computed_in_the_log_probs_precision():
    """float32 scores with float64 log-probs: G = 2^ψ in float64 (in float32, 2^0.3 is off by ~1e-8 relative)."""
    from prefzoo.losses.lists import lambda_weights

    psi = torch.tensor([[0.3, 0.1]], dtype=torch.float32)
    b = GroupBatch(policy_logps=torch.tensor([[-1.0, -2.0]], dtype=F64), scores=psi)
    w = lambda_weights(b.policy_logps, b)
    a = 1 / math.log2(3)
    expected = (2 ** float(psi[0, 0]) - 2 ** float(psi[0, 1])) * (1 - a)
    assert w.dtype == F64
    assert w[0, 0, 1].item() == pytest.approx(expected, rel=1e-15) and w[0, 1, 0].item() == 0.0


def test_lipo_overflowing_gain_is_a_one_line_error():
    with pytest.raises(GroupBatchError, match=r"^GroupBatch.scores: lipo's gain 2\^score overflows; rescale the "
                       r"scores \(e\.g\. to \[0, 10\]\)$"):
        prefzoo.get_loss("lipo")(grp([[-1.0, -2.0]], scores=[[5000.0, 0.0]]))


def test_list_losses_need_their_fields():
    with pytest.raises(prefzoo.PreferenceBatchError, match=r"needs lengths: GroupBatch\.lengths is None"):
        prefzoo.get_loss("rrhf")(grp(THIRDS))
