"""Each modifier equals an independent transcription in value and gradient (fp64, fp32, bf16), and a hand case.

Transcriptions: TRL 1.16's own code where TRL has the modifier (DPOTrainer._compute_loss for use_weighting and
ld_alpha, trl.experimental.cpo's CPOTrainer.cpo_loss for alpha, SyncRefModelCallback._sync_target_model), the paper's
equation otherwise (ODPO; β-DPO, against its authors' code, is in test_beta_dpo.py).  Inputs are rounded to the
dtype once; both sides read the same rounded values.
"""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

import prefzoo
from prefzoo.types import PreferenceBatch

DTYPES = [torch.float64, torch.float32, torch.bfloat16]
TOL = {torch.float64: 1e-10, torch.float32: 2e-5, torch.bfloat16: 2e-5}  # bf16 inputs are computed in float32
GRAD_TOL = {**TOL, torch.bfloat16: 2.0**-7}  # a bf16 leaf receives its gradient rounded to bf16 (u = 2⁻⁸)


def _tokens(gen, b, t, lo=-4.0):
    lens = torch.randint(1, t + 1, (b,), generator=gen)
    mask = torch.arange(t)[None, :] < lens[:, None]  # (B, T) completion tokens first, padding after
    return lo * torch.rand(b, t, generator=gen, dtype=torch.float64) * mask, mask


def _batch(dtype, seed=0, b=6, t=7):
    """Token-level policy/reference log-probs (multiples of 1/8), WPO's log Σπ², scores, rounded to ``dtype``.

    prefzoo reads summed log-probs as inputs where TRL sums token log-probs itself: sums exact in every dtype keep
    the two sides on the same values."""
    gen = torch.Generator().manual_seed(seed)
    pw, mw = _tokens(gen, b, t)
    pl, ml = _tokens(gen, b, t)
    rw, rl = pw + 0.3 * torch.randn(b, t, generator=gen, dtype=torch.float64) * mw, pl * 0.9
    sqw = torch.maximum(2 * pw, pw - 2.0) * torch.rand(b, t, generator=gen, dtype=torch.float64)
    sql = torch.maximum(2 * pl, pl - 2.0) * torch.rand(b, t, generator=gen, dtype=torch.float64)
    sl = torch.randn(b, generator=gen, dtype=torch.float64)
    sw = sl + 0.1 + torch.rand(b, generator=gen, dtype=torch.float64)
    eighths = lambda v: (v * 8).round() / 8  # noqa: E731  (sums of ≤ 7 of them are exact in bfloat16 too)
    raw = dict(pw=pw, pl=pl, rw=rw, rl=rl, sqw=sqw, sql=sql, sw=sw, sl=sl)
    r = {k: (eighths(v) if k not in ("sw", "sl") else v).to(dtype) for k, v in raw.items()}
    r["pw"], r["pl"] = r["pw"].requires_grad_(), r["pl"].requires_grad_()
    r["mw"], r["ml"] = mw, ml
    return r


def _prefzoo_batch(x, reference=True):
    return PreferenceBatch(
        policy_chosen_logps=x["pw"].sum(-1), policy_rejected_logps=x["pl"].sum(-1),
        ref_chosen_logps=x["rw"].sum(-1) if reference else None,
        ref_rejected_logps=x["rl"].sum(-1) if reference else None,
        chosen_lengths=x["mw"].sum(-1), rejected_lengths=x["ml"].sum(-1),
        policy_chosen_token_logps=x["pw"], policy_rejected_token_logps=x["pl"],
        ref_chosen_token_logps=x["rw"] if reference else None, ref_rejected_token_logps=x["rl"] if reference else None,
        chosen_mask=x["mw"], rejected_mask=x["ml"],
        chosen_token_log_sq_probs=x["sqw"], rejected_token_log_sq_probs=x["sql"],
        chosen_scores=x["sw"], rejected_scores=x["sl"],
    )  # fmt: skip


def _f64(x):
    return {k: (v.detach().double().requires_grad_(k in ("pw", "pl")) if v.is_floating_point() else v)
            for k, v in x.items()}  # fmt: skip


def _compare(ours, theirs, x, x64, dtype):
    g = torch.autograd.grad(ours.sum(), (x["pw"], x["pl"]))
    g64 = torch.autograd.grad(theirs.sum(), (x64["pw"], x64["pl"]))
    tol, gtol = TOL[dtype], GRAD_TOL[dtype]
    torch.testing.assert_close(ours.detach().double(), theirs.detach(), rtol=tol, atol=tol)
    for a, b, m in zip(g, g64, (x["mw"], x["ml"]), strict=True):  # padding is no model output: TRL's 0 there
        torch.testing.assert_close(a.double() * m, b * m, rtol=gtol, atol=gtol)


# --- TRL 1.16 DPOTrainer._compute_loss, transcribed (batch concatenated [chosen; rejected], as TRL holds it) -------


def _trl_concat(x, key_w, key_l):
    t = max(x[key_w].shape[1], x[key_l].shape[1])
    pad = lambda v: F.pad(v, (0, t - v.shape[1]))  # noqa: E731
    return torch.cat([pad(x[key_w]), pad(x[key_l])], dim=0)


def trl_ld_logps(per_token_logps, shift_completion_mask, ld_alpha):
    comp_pos = shift_completion_mask.cumsum(dim=1)
    comp_lens = shift_completion_mask.sum(dim=1).long()
    chosen_lens, rejected_lens = comp_lens.chunk(2, dim=0)
    shared_lens = torch.minimum(chosen_lens, rejected_lens)
    shared_lens = torch.cat([shared_lens, shared_lens], dim=0)
    shared_mask = (comp_pos > 0) & (comp_pos <= shared_lens.unsqueeze(1))
    tail_mask = comp_pos > shared_lens.unsqueeze(1)
    shared_logps = (per_token_logps * shared_mask).sum(dim=1)
    tail_logps = (per_token_logps * tail_mask).sum(dim=1)
    return shared_logps + ld_alpha * tail_logps


def trl_dpo(x, beta, ld_alpha=None, use_weighting=False):
    mask = _trl_concat(x, "mw", "ml").long()
    per_token_logps = _trl_concat(x, "pw", "pl")
    ref_per_token_logps = _trl_concat(x, "rw", "rl")
    if ld_alpha is None:
        logps, ref_logps = per_token_logps.sum(dim=1), ref_per_token_logps.sum(dim=1)
    else:
        logps = trl_ld_logps(per_token_logps, mask, ld_alpha)
        ref_logps = trl_ld_logps(ref_per_token_logps, mask, ld_alpha)
    chosen_logps, rejected_logps = logps.chunk(2, dim=0)
    ref_chosen_logps, ref_rejected_logps = ref_logps.chunk(2, dim=0)
    delta_score = (chosen_logps - ref_chosen_logps) - (rejected_logps - ref_rejected_logps)
    per_sequence_loss = -F.logsigmoid(beta * delta_score)
    if use_weighting:
        log_sum_sq_probs = _trl_concat(x, "sqw", "sql")
        completion_lengths = mask.sum(dim=1).clamp_min(1)
        with torch.no_grad():
            aligned_logps = (per_token_logps - log_sum_sq_probs) * mask
        mean_logps = aligned_logps.sum(dim=1) / completion_lengths
        weights = torch.exp(mean_logps)
        chosen_weights, rejected_weights = weights.chunk(2, dim=0)
        per_sequence_loss = per_sequence_loss * chosen_weights * rejected_weights
    return per_sequence_loss


@pytest.mark.parametrize("dtype", DTYPES)
def test_wpo_equals_trl_use_weighting(dtype):
    x = _batch(dtype, seed=1)
    ours = prefzoo.get_loss("dpo", beta=0.3, modifiers=["wpo"])(_prefzoo_batch(x)).losses
    x64 = _f64(x)
    _compare(ours, trl_dpo(x64, 0.3, use_weighting=True), x, x64, dtype)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("alpha", [0.0, 0.5, 1.0])
def test_ld_dpo_equals_trl_ld_alpha(dtype, alpha):
    x = _batch(dtype, seed=2)
    ours = prefzoo.get_loss("dpo", beta=0.2, modifiers=[f"ld-dpo:alpha={alpha}"])(_prefzoo_batch(x)).losses
    x64 = _f64(x)
    _compare(ours, trl_dpo(x64, 0.2, ld_alpha=alpha), x, x64, dtype)


@pytest.mark.parametrize("dtype", DTYPES)
def test_wpo_after_ld_dpo_equals_trl_with_both(dtype):
    x = _batch(dtype, seed=3)
    ours = prefzoo.get_loss("dpo", modifiers=["ld-dpo:alpha=0.5", "wpo"])(_prefzoo_batch(x)).losses
    x64 = _f64(x)
    _compare(ours, trl_dpo(x64, 0.1, ld_alpha=0.5, use_weighting=True), x, x64, dtype)


def test_hand_derived_wpo_and_ld_dpo():
    # WPO: one token each; π over two tokens (0.8, 0.2): y_w has 0.8, y_l 0.2, Σπ² = 0.68.
    # w_w = 0.8/0.68, w_l = 0.2/0.68; DPO at Δ = 0 is log 2, so L = log 2 · 0.16/0.4624 = 0.239843...
    one = torch.ones(1, 1, dtype=torch.bool)
    lw, ll, sq = math.log(0.8), math.log(0.2), math.log(0.68)
    b = PreferenceBatch(
        policy_chosen_logps=torch.tensor([lw], dtype=torch.float64),
        policy_rejected_logps=torch.tensor([ll], dtype=torch.float64),
        ref_chosen_logps=torch.tensor([lw], dtype=torch.float64),
        ref_rejected_logps=torch.tensor([ll], dtype=torch.float64),
        policy_chosen_token_logps=torch.tensor([[lw]], dtype=torch.float64),
        policy_rejected_token_logps=torch.tensor([[ll]], dtype=torch.float64),
        chosen_token_log_sq_probs=torch.tensor([[sq]], dtype=torch.float64),
        rejected_token_log_sq_probs=torch.tensor([[sq]], dtype=torch.float64), chosen_mask=one, rejected_mask=one,
    )  # fmt: skip
    got = prefzoo.get_loss("dpo", modifiers=["wpo"])(b).losses.item()
    assert got == pytest.approx(math.log(2) * (0.8 * 0.2) / 0.68**2, rel=1e-12)
    # LD-DPO: chosen tokens (−1, −2), rejected (−1, −1, −4), reference 0: ℓ = 2, log π̂_w = −3,
    # log π̂_l = −2 + 0.5·(−4) = −4, Δ = 1, L = −log σ(0.1) = 0.644397...
    tw, tl = (
        torch.tensor([[-1.0, -2.0, 0.0]], dtype=torch.float64),
        torch.tensor([[-1.0, -1.0, -4.0]], dtype=torch.float64),
    )
    mw, ml = torch.tensor([[True, True, False]]), torch.ones(1, 3, dtype=torch.bool)
    z = torch.zeros(1, dtype=torch.float64)
    b = PreferenceBatch(policy_chosen_logps=tw.sum(-1), policy_rejected_logps=tl.sum(-1), ref_chosen_logps=z,
                        ref_rejected_logps=z, policy_chosen_token_logps=tw, policy_rejected_token_logps=tl,
                        ref_chosen_token_logps=tw * 0, ref_rejected_token_logps=tl * 0, chosen_mask=mw,
                        rejected_mask=ml)  # fmt: skip
    got = prefzoo.get_loss("dpo", modifiers=["ld-dpo:alpha=0.5"])(b).losses.item()
    assert got == pytest.approx(-math.log(1 / (1 + math.exp(-0.1))), rel=1e-12)


# --- TRL 1.16 trl.experimental.cpo CPOTrainer.cpo_loss, loss_type="simpo" with alpha, transcribed --------------------


def trl_cpo_simpo_alpha(chosen_avg, rejected_avg, beta, simpo_gamma, alpha, label_smoothing=0.0):
    chosen_probs = torch.exp(chosen_avg)  # TRL passes average log-probs for simpo (average_log_prob=True)
    rejected_probs = torch.exp(rejected_avg)
    policy_chosen_rewards = (1 - chosen_probs.pow(-alpha)) / alpha
    policy_rejected_rewards = (1 - rejected_probs.pow(-alpha)) / alpha
    logits = policy_chosen_rewards - policy_rejected_rewards
    gamma_logratios = simpo_gamma / beta
    logits = logits - gamma_logratios
    return -F.logsigmoid(beta * logits) * (1 - label_smoothing) - F.logsigmoid(-beta * logits) * label_smoothing


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("alpha", [0.25, -0.5, 1e-3])
def test_alphapo_equals_trl_cpo_alpha(dtype, alpha):
    x = _batch(dtype, seed=4)
    ours = prefzoo.get_loss("simpo", beta=2.0, gamma_beta_ratio=0.5, modifiers=[f"alphapo:alpha={alpha}"])
    out = ours(_prefzoo_batch(x, reference=False)).losses
    x64 = _f64(x)
    n_w, n_l = x64["mw"].sum(-1), x64["ml"].sum(-1)
    theirs = trl_cpo_simpo_alpha(x64["pw"].sum(-1) / n_w, x64["pl"].sum(-1) / n_l, 2.0, 2.0 * 0.5, alpha)
    _compare(out, theirs, x, x64, dtype)


def test_hand_derived_alphapo():
    # ū_w = 0 → r_w = 0; ū_l = −2, α = 0.5 → r_l = (1 − e)/0.5 = −3.436564; logits = 3.436564 − 0.5 (γ/β);
    # L = −log σ(2 · 2.936564) = log(1 + e^−5.873127) = 0.002805...
    b = PreferenceBatch(policy_chosen_logps=torch.tensor([0.0], dtype=torch.float64),
                        policy_rejected_logps=torch.tensor([-4.0], dtype=torch.float64),
                        chosen_lengths=torch.tensor([3]), rejected_lengths=torch.tensor([2]))  # fmt: skip
    got = prefzoo.get_loss("simpo", modifiers=["alphapo:alpha=0.5"])(b).losses.item()
    logits = 0 - (1 - math.e) / 0.5 - 0.5
    assert got == pytest.approx(math.log1p(math.exp(-2 * logits)), rel=1e-12)


# --- the papers' equations -------------------------------------------------------------------------------------------


def paper_odpo(x, beta, alpha):
    """ODPO: L = −log σ(β(log π_w/π_ref,w − log π_l/π_ref,l) − α·log(s_w − s_l))."""
    d = (x["pw"].sum(-1) - x["rw"].sum(-1)) - (x["pl"].sum(-1) - x["rl"].sum(-1))
    return -F.logsigmoid(beta * d - alpha * torch.log(x["sw"] - x["sl"]))


@pytest.mark.parametrize("dtype", DTYPES)
def test_odpo_equals_the_paper(dtype):
    x = _batch(dtype, seed=5)
    out = prefzoo.get_loss("dpo", beta=0.5, modifiers=["odpo:alpha=0.7"])(_prefzoo_batch(x)).losses
    x64 = _f64(x)
    _compare(out, paper_odpo(x64, 0.5, 0.7), x, x64, dtype)


def test_hand_derived_odpo():
    # Δ = 0, s_w − s_l = e, α = 1: offset 1, L = −log σ(−1) = log(1 + e) = 1.313262
    z = torch.zeros(1, dtype=torch.float64)
    b = PreferenceBatch(policy_chosen_logps=z - 3, policy_rejected_logps=z - 3, ref_chosen_logps=z - 3,
                        ref_rejected_logps=z - 3, chosen_scores=z + math.e, rejected_scores=z)  # fmt: skip
    assert prefzoo.get_loss("dpo", modifiers=["odpo"])(b).losses.item() == pytest.approx(math.log1p(math.e), rel=1e-12)


# --- TR-DPO: TRL 1.16 SyncRefModelCallback._sync_target_model ---------------------------------------------------------


def trl_sync_target_model(model, target_model, alpha):
    for target_param, copy_param in zip(target_model.parameters(), model.parameters(), strict=True):
        target_param.data.mul_(1.0 - alpha).add_(copy_param.data, alpha=alpha)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("alpha", [0.6, 1.0])
def test_tr_dpo_sync_equals_trl(dtype, alpha):
    from prefzoo.train.callbacks.ref_sync import mix_into

    torch.manual_seed(0)
    policy, ref = torch.nn.Linear(4, 3).to(dtype), torch.nn.Linear(4, 3).to(dtype)
    ours, theirs = torch.nn.Linear(4, 3).to(dtype), torch.nn.Linear(4, 3).to(dtype)
    ours.load_state_dict(ref.state_dict())
    theirs.load_state_dict(ref.state_dict())
    mix_into(ours, policy, alpha)
    trl_sync_target_model(policy, theirs, alpha)
    for a, b in zip(ours.parameters(), theirs.parameters(), strict=True):
        assert torch.equal(a, b)
    if alpha == 1.0:  # the hard update copies the policy
        assert all(torch.equal(a, b) for a, b in zip(ours.parameters(), policy.parameters(), strict=True))
