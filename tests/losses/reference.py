"""Naive float64 transcriptions of each loss's paper/TRL formula, written independently of prefzoo.losses.

They use exp/log directly (no stabilisation), so they are only valid on moderate inputs:
the tests feed log-probs in [-40, 0].
"""

from __future__ import annotations

import math

import torch

T = torch.Tensor


def sig(x: T) -> T:
    return 1.0 / (1.0 + torch.exp(-x))


def logsig(x: T) -> T:
    # the softplus primitive rather than log(sig(x)): f-divergence margins reach ±1e12 in these tests
    return -torch.nn.functional.softplus(-x)


def fdiv(rho: T, kind: str, a: float) -> T:
    if kind == "forward_kl":
        return 1 - torch.exp(-rho)
    if kind == "js_divergence":
        return math.log(2) + logsig(rho)
    if kind == "alpha_divergence":
        return (torch.exp((a - 1) * rho) - 1) / (a - 1)
    return rho


def mmpo_scores(x, p, normalize=True, average=False):
    pw, pl, rw, rl = x["pw"], x["pl"], x["rw"], x["rl"]
    if average:
        pw, pl, rw, rl = pw / x["lw"], pl / x["ll"], rw / x["lw"], rl / x["ll"]
    Rw = p.get("reward_epsilon", 0.6) + p.get("beta", 0.1) * rw
    Rl = p.get("rejected_reward", 0.1) + p.get("beta", 0.1) * rl
    if normalize:
        eps = p.get("norm_eps", 1e-6)
        allr = torch.cat([Rw, Rl])
        lo, hi = allr.min(), allr.max()
        Rw, Rl = (Rw + eps - lo) / (hi + eps - lo), (Rl + eps - lo) / (hi + eps - lo)
    return pw + Rw, pl + Rl


def mml(sw, sl, aux=True):
    out = -torch.log(torch.exp(sw) + torch.exp(sl))
    return out - logsig(sw - sl) if aux else out


def ref_mmpo(x, p):
    return mml(*mmpo_scores(x, p))


def ref_mmpo_no_aux(x, p):
    return mml(*mmpo_scores(x, p), aux=False)


def ref_mmpo_no_norm(x, p):
    return mml(*mmpo_scores(x, p, normalize=False))


def ref_mmpo_length_norm(x, p):
    return mml(*mmpo_scores(x, p, average=True))


def _delta(x, p):
    k, a = p.get("f_divergence", "reverse_kl"), p.get("alpha_divergence_coef", 0.5)
    return fdiv(x["pw"] - x["rw"], k, a) - fdiv(x["pl"] - x["rl"], k, a)


def ref_dpo(x, p):
    return -logsig(p.get("beta", 0.1) * _delta(x, p))


def ref_cdpo(x, p):
    b, e = p.get("beta", 0.1), p.get("label_smoothing", 0.1)
    d = _delta(x, p)
    return -(1 - e) * logsig(b * d) - e * logsig(-b * d)


def ref_hinge(x, p):
    return torch.clamp(1 - p.get("beta", 0.1) * _delta(x, p), min=0)


def ref_ipo(x, p):
    k, a = p.get("f_divergence", "reverse_kl"), p.get("alpha_divergence_coef", 0.5)
    d = fdiv(x["pw"] - x["rw"], k, a) / x["lw"] - fdiv(x["pl"] - x["rl"], k, a) / x["ll"]
    return (d - 1 / (2 * p.get("beta", 0.1))) ** 2


def ref_robust(x, p):
    b, e = p.get("beta", 0.1), p.get("label_smoothing", 0.1)
    d = _delta(x, p)
    return (-(1 - e) * logsig(b * d) + e * logsig(-b * d)) / (1 - 2 * e)


def ref_exo_pair(x, p):
    b, e = p.get("beta", 0.1), p.get("label_smoothing", 1e-3)
    z = b * _delta(x, p)
    return sig(z) * (logsig(z) - math.log(1 - e)) + sig(-z) * (logsig(-z) - math.log(e))


def ref_nca_pair(x, p):
    b = p.get("beta", 0.1)
    a, c = b * (x["pw"] - x["rw"]), b * (x["pl"] - x["rl"])
    return -logsig(a) - 0.5 * logsig(-a) - 0.5 * logsig(-c)


def ref_bco_pair(x, p):
    b = p.get("beta", 0.1)
    return -logsig(b * (x["pw"] - x["rw"])) - logsig(-b * (x["pl"] - x["rl"]))


def ref_sppo_hard(x, p):
    b = p.get("beta", 0.1)
    return (x["pw"] - x["rw"] - 0.5 / b) ** 2 + (x["pl"] - x["rl"] + 0.5 / b) ** 2


def _aot_mean(a, c, p):
    b, e = p.get("beta", 0.1), p.get("label_smoothing", 0.0)
    d = torch.sort(a).values - torch.sort(c).values  # TRL: losses per sorted slot
    return (-(1 - e) * logsig(b * d) - e * logsig(-b * d)).mean()


def ref_aot(x, p):  # returns the batch MEAN (TRL's per-slot losses have no per-example meaning)
    return _aot_mean(x["pw"] - x["pl"], x["rw"] - x["rl"], p)


def ref_aot_unpaired(x, p):
    return _aot_mean(x["pw"] - x["rw"], x["pl"] - x["rl"], p)


def ref_apo_zero(x, p):
    b = p.get("beta", 0.1)
    return 1 - sig(b * (x["pw"] - x["rw"])) + sig(b * (x["pl"] - x["rl"]))


def ref_apo_down(x, p):
    b = p.get("beta", 0.1)
    cw, cl = x["pw"] - x["rw"], x["pl"] - x["rl"]
    return sig(b * cw) + 1 - sig(b * (cw - cl))


def ref_discopop(x, p):
    b, tau = p.get("beta", 0.1), p.get("tau", 0.05)
    z = b * _delta(x, p)
    m = sig(z / tau)
    return -logsig(z) * (1 - m) + torch.exp(-z) * m


def ref_sigmoid_norm(x, p):
    k, a = p.get("f_divergence", "reverse_kl"), p.get("alpha_divergence_coef", 0.5)
    d = fdiv(x["pw"] - x["rw"], k, a) / x["lw"] - fdiv(x["pl"] - x["rl"], k, a) / x["ll"]
    return -logsig(p.get("beta", 0.1) * d)


def ref_rdpo(x, p):
    return -logsig(p.get("beta", 0.1) * _delta(x, p) + p.get("alpha", 0.01) * (x["lw"] - x["ll"]))


def nll(x, p, default="example"):
    """NLL of y_w: per example, or TRL's mean over every chosen token of the batch (the same value for each)."""
    if p.get("nll_reduction", default) == "batch-tokens":
        return (-x["pw"].sum() / x["lw"].sum()).expand(x["pw"].shape)
    return -x["pw"] / x["lw"]


def ref_sft(x, p):
    return nll(x, p)


def ref_simpo(x, p):
    b, g = p.get("beta", 2.0), p.get("gamma_beta_ratio", 0.5)
    return -logsig(b * (x["pw"] / x["lw"] - x["pl"] / x["ll"] - g))


def ref_cpo(x, p):
    b, a = p.get("beta", 0.1), p.get("alpha", 1.0)
    return -logsig(b * (x["pw"] - x["pl"])) + a * nll(x, p)


def ref_cpo_hinge(x, p):
    b, a = p.get("beta", 0.1), p.get("alpha", 1.0)
    return torch.clamp(1 - b * (x["pw"] - x["pl"]), min=0) + a * nll(x, p)


def ref_cpo_ipo(x, p):
    b, a = p.get("beta", 0.1), p.get("alpha", 1.0)
    return (x["pw"] / x["lw"] - x["pl"] / x["ll"] - 1 / (2 * b)) ** 2 + a * nll(x, p)


def ref_cpo_simpo(x, p):
    b, g, a = p.get("beta", 2.0), p.get("gamma_beta_ratio", 0.5), p.get("alpha", 1.0)
    return -logsig(b * (x["pw"] / x["lw"] - x["pl"] / x["ll"]) - b * g) + a * nll(x, p)


def ref_orpo(x, p):
    aw, al = x["pw"] / x["lw"], x["pl"] / x["ll"]
    log_odds = (aw - torch.log(1 - torch.exp(aw))) - (al - torch.log(1 - torch.exp(al)))
    return nll(x, p) - p.get("beta", 0.1) * logsig(log_odds)


def ref_dpop(x, p):
    # Smaug (Pal et al. 2024): −log σ(β(ρ_w − ρ_l − λ·max(0, log π_ref(y_w) − log π(y_w))))
    b, lam = p.get("beta", 0.1), p.get("dpop_lambda", 50.0)
    penalty = torch.clamp(x["rw"] - x["pw"], min=0)
    return -logsig(b * ((x["pw"] - x["rw"]) - (x["pl"] - x["rl"]) - lam * penalty))


def ref_simper(x, p):
    return -torch.exp(x["pw"] / x["lw"]) + torch.exp(x["pl"] / x["ll"])


def ref_slic(x, p):
    return torch.clamp(p.get("delta", 1.0) - x["pw"] + x["pl"], min=0) - p.get("reg_lambda", 0.5) * x["pw"]


def ref_rpo(x, p):  # TRL: loss_type=["sigmoid", "sft"], loss_weights=[1, α]; the sft term is a batch token mean
    return ref_dpo(x, {"beta": p.get("beta", 0.1)}) + p.get("alpha", 1.0) * nll(x, p, default="batch-tokens")


def ref_mpo(x, p):
    b = p.get("beta", 0.1)
    q = {"beta": b}
    return (
        p.get("dpo_weight", 0.8) * ref_dpo(x, q)
        + p.get("bco_weight", 0.2) * ref_bco_pair(x, q)
        + p.get("sft_weight", 1.0) * ref_sft(x, q)
    )


# --- list losses on pairs (K = 2, the chosen ranked first): their paper formulas written for two completions ---


def ref_mml(x, p):
    """Eq. 4 with n = 2: −log(e^{s_w} + e^{s_l}); reward_from='score' ranks the pair (1, 0), scaled to r = (1, 0)."""
    q = {**p, "reward_epsilon": 1.0, "rejected_reward": 0.0} if p.get("reward_from") == "score" else p
    return mml(*mmpo_scores(x, q), aux=False)


def ref_mmpo_list(x, p):
    """K = 2: Plackett–Luce of (w, l) is σ(s_w − s_l), so the loss is the listing's."""
    q = {**p, "reward_epsilon": 1.0, "rejected_reward": 0.0} if p.get("reward_from") == "score" else p
    return mml(*mmpo_scores(x, q))


def ref_lipo(x, p):
    """K = 2, ψ = (1, 0): Δ = |2¹ − 2⁰|·|1/log₂2 − 1/log₂3| for the one pair, times −log σ(u_w − u_l)."""
    return (1 - 1 / math.log2(3)) * ref_dpo(x, p)


def ref_rrhf(x, p):
    """K = 2: max(0, log π_l/|y_l| − log π_w/|y_w|) − sft_weight·log π_w."""
    return torch.clamp(x["pl"] / x["ll"] - x["pw"] / x["lw"], min=0) - p.get("sft_weight", 1.0) * x["pw"]


REFERENCES = {
    "mml": ref_mml,
    "mmpo-list": ref_mmpo_list,
    "dpo-pl": ref_dpo,  # DPO appendix A.3 with K = 2 is Eq. 7
    "lipo": ref_lipo,
    "rrhf": ref_rrhf,
    "mmpo": ref_mmpo,
    "mmpo-no-aux": ref_mmpo_no_aux,
    "mmpo-no-norm": ref_mmpo_no_norm,
    "mmpo-length-norm": ref_mmpo_length_norm,
    "dpo": ref_dpo,
    "cdpo": ref_cdpo,
    "hinge": ref_hinge,
    "ipo": ref_ipo,
    "robust": ref_robust,
    "exo-pair": ref_exo_pair,
    "nca-pair": ref_nca_pair,
    "bco-pair": ref_bco_pair,
    "sppo-hard": ref_sppo_hard,
    "aot": ref_aot,
    "aot-unpaired": ref_aot_unpaired,
    "apo-zero": ref_apo_zero,
    "apo-down": ref_apo_down,
    "discopop": ref_discopop,
    "sigmoid-norm": ref_sigmoid_norm,
    "rdpo": ref_rdpo,
    "sft": ref_sft,
    "simpo": ref_simpo,
    "cpo": ref_cpo,
    "orpo": ref_orpo,
    "mpo": ref_mpo,
    "dpop": ref_dpop,
    "simper": ref_simper,
    "slic": ref_slic,
    "cpo-simpo": ref_cpo_simpo,
    "cpo-hinge": ref_cpo_hinge,
    "cpo-ipo": ref_cpo_ipo,
    "rpo": ref_rpo,
}
MEAN_ONLY = {"aot", "aot-unpaired"}  # per-slot losses: compare the batch mean and its gradient


def mean_only(name, params):
    """Whether only the batch mean has a reference meaning: sorted slots, or TRL's batch token mean NLL."""
    coupled = params.get("nll_reduction", "batch-tokens" if name == "rpo" else "example") == "batch-tokens"
    return name in MEAN_ONLY or coupled
