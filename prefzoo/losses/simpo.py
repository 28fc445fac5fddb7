"""Reference-free margin losses: SimPO, CPO and its SimPO/hinge/IPO variants, SimPER and SLiC-HF."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

from prefzoo.losses._common import (
    NLL_NOTE,
    average_policy_logps,
    chosen_nll,
    nll_coupled,
    nll_reduction_param,
    registers,
    require,
)
from prefzoo.spec import LossFn, LossParams, LossSpec, param
from prefzoo.types import LossContext, LossOutput, Need, PreferenceBatch

_SMOOTHING = (
    r"$\varepsilon$: label smoothing, $-(1 - \varepsilon)\cdot\log\sigma(z) - \varepsilon\cdot\log\sigma(-z)$ "
    r"(TRL CPO and Liger label_smoothing)"
)


def _unsmoothed(p: Any) -> bool:
    """Monotone only without label smoothing: the ε·log σ(−z) term rises with the margin."""
    return bool(p.label_smoothing == 0.0)


def smoothed_logistic(z: Tensor, eps: float) -> Tensor:
    """−(1 − ε)·log σ(z) − ε·log σ(−z); −log σ(z) at ε = 0."""
    return -F.logsigmoid(z) if eps == 0.0 else -(1 - eps) * F.logsigmoid(z) - eps * F.logsigmoid(-z)


@dataclass(frozen=True, kw_only=True)
class SimPOParams(LossParams):
    beta: float = param(2.0, r"$\beta$: reward scale of the average log-prob", gt=0.0)
    gamma_beta_ratio: float = param(0.5, r"$\gamma/\beta$: target reward margin divided by $\beta$", ge=0.0)
    label_smoothing: float = param(0.0, _SMOOTHING, ge=0.0, lt=0.5)


@dataclass(frozen=True, kw_only=True)
class CPOParams(LossParams):
    beta: float = param(0.1, r"$\beta$: temperature of the preference term", gt=0.0)
    alpha: float = param(1.0, r"$\alpha$: weight of the NLL term on the chosen response (TRL cpo_alpha)", ge=0.0)
    nll_reduction: str = nll_reduction_param()


@dataclass(frozen=True, kw_only=True)
class CPOSigmoidParams(CPOParams):
    label_smoothing: float = param(0.0, _SMOOTHING, ge=0.0, lt=0.5)


@dataclass(frozen=True, kw_only=True)
class CPOSimPOParams(CPOSigmoidParams):
    beta: float = param(2.0, r"$\beta$: reward scale of the average log-prob (SimPO's; TRL CPO's beta)", gt=0.0)
    gamma_beta_ratio: float = param(0.5, r"$\gamma/\beta$: target reward margin divided by $\beta$ (TRL: simpo_gamma / "
        r"beta)", ge=0.0)


@dataclass(frozen=True, kw_only=True)
class SimPERParams(LossParams):
    pass


@dataclass(frozen=True, kw_only=True)
class SLiCParams(LossParams):
    delta: float = param(1.0, r"$\delta$: margin of the calibration hinge on $\log\pi(y_w\mid x) - \log\pi(y_l\mid "
        r"x)$", gt=0.0)
    reg_lambda: float = param(0.5, r"$\lambda$: weight of the regulariser $-\log\pi(y_w\mid x)$ (SLiC-HF direct: "
        r"$y_{\mathrm{ref}} = y_w$)", ge=0.0)


def simpo_loss(batch: PreferenceBatch, p: SimPOParams, ctx: LossContext) -> LossOutput:
    """SimPO (Meng et al. 2024, arXiv:2405.14734, Eq. 6), as the SimPO reference code.

    L = −log σ(β/|y_w| · log π(y_w|x) − β/|y_l| · log π(y_l|x) − γ),  γ = β · gamma_beta_ratio
    """
    chosen, rejected = average_policy_logps(batch)  # (B,) log π(y|x)/|y|
    logits = chosen - rejected - p.gamma_beta_ratio  # (B,)
    losses = smoothed_logistic(p.beta * logits, p.label_smoothing)
    return LossOutput(losses, (p.beta * chosen).detach(), (p.beta * rejected).detach())


def _with_nll(pref: Tensor, chosen: Tensor, rejected: Tensor, p: CPOParams, batch: PreferenceBatch,
              ctx: LossContext) -> LossOutput:
    """CPO's objective: the preference term plus α·NLL(y_w); scores β·(the log-probs the preference term saw)."""
    nll = chosen_nll(batch, p.nll_reduction, ctx)  # (B,)
    metrics = {"cpo/nll": nll.detach().mean()}
    return LossOutput(pref + p.alpha * nll, (p.beta * chosen).detach(), (p.beta * rejected).detach(), metrics)


def cpo_loss(batch: PreferenceBatch, p: CPOSigmoidParams, ctx: LossContext) -> LossOutput:
    """CPO (Xu et al. 2024, arXiv:2401.08417, Eq. 3 + NLL), as TRL's CPOTrainer with loss_type='sigmoid'.

    L = −log σ(β·(log π(y_w|x) − log π(y_l|x))) − α · log π(y_w|x)/|y_w|
    """
    require(batch, "chosen_lengths", "rejected_lengths")
    pw, pl = batch.policy_chosen_logps, batch.policy_rejected_logps  # (B,) summed log-probs
    return _with_nll(smoothed_logistic(p.beta * (pw - pl), p.label_smoothing), pw, pl, p, batch, ctx)


def cpo_hinge_loss(batch: PreferenceBatch, p: CPOParams, ctx: LossContext) -> LossOutput:
    """CPO with the hinge preference term, as TRL's CPOTrainer with loss_type='hinge' (summed log-probs).

    L = max(0, 1 − β·(log π(y_w|x) − log π(y_l|x))) − α · log π(y_w|x)/|y_w|
    """
    require(batch, "chosen_lengths", "rejected_lengths")
    pw, pl = batch.policy_chosen_logps, batch.policy_rejected_logps  # (B,)
    return _with_nll(torch.relu(1 - p.beta * (pw - pl)), pw, pl, p, batch, ctx)


def cpo_ipo_loss(batch: PreferenceBatch, p: CPOParams, ctx: LossContext) -> LossOutput:
    """CPO with IPO's squared preference term (Azar et al. 2023, Eq. 17) on average log-probs, as TRL's
    CPOTrainer with loss_type='ipo'.

    L = (log π(y_w|x)/|y_w| − log π(y_l|x)/|y_l| − 1/(2β))² − α · log π(y_w|x)/|y_w|
    """
    chosen, rejected = average_policy_logps(batch)  # (B,)
    return _with_nll((chosen - rejected - 1 / (2 * p.beta)) ** 2, chosen, rejected, p, batch, ctx)


def cpo_simpo_loss(batch: PreferenceBatch, p: CPOSimPOParams, ctx: LossContext) -> LossOutput:
    """SimPO plus CPO's NLL term (CPO-SimPO), as TRL's CPOTrainer with loss_type='simpo' and cpo_alpha > 0.

    L = −log σ(β·(log π(y_w|x)/|y_w| − log π(y_l|x)/|y_l|) − γ) − α · log π(y_w|x)/|y_w|,  γ = β · gamma_beta_ratio
    """
    chosen, rejected = average_policy_logps(batch)  # (B,)
    pref = smoothed_logistic(p.beta * (chosen - rejected - p.gamma_beta_ratio), p.label_smoothing)
    return _with_nll(pref, chosen, rejected, p, batch, ctx)


def simper_loss(batch: PreferenceBatch, p: SimPERParams, ctx: LossContext) -> LossOutput:
    """SimPER (Xiao et al. 2025, arXiv:2502.00883): inverse perplexities, no hyperparameters.

    L = −exp(log π(y_w|x)/|y_w|) + exp(log π(y_l|x)/|y_l|)
    """
    a_w, a_l = average_policy_logps(batch)  # (B,)
    p_w, p_l = torch.exp(a_w), torch.exp(a_l)  # (B,) 1/PPL(y) ∈ (0, 1]
    return LossOutput(p_l - p_w, p_w.detach(), p_l.detach())


def slic_loss(batch: PreferenceBatch, p: SLiCParams, ctx: LossContext) -> LossOutput:
    """SLiC-HF (Zhao et al. 2023, arXiv:2305.10425), direct: rank calibration plus regularisation on y_w.

    L = max(0, δ − log π(y_w|x) + log π(y_l|x)) − λ·log π(y_w|x)
    """
    pw, pl = batch.policy_chosen_logps, batch.policy_rejected_logps  # (B,) summed log-probs
    return LossOutput(torch.relu(p.delta - pw + pl) - p.reg_lambda * pw, pw.detach(), pl.detach())


_LEN = frozenset({Need.LENGTHS})


_CPO_PAPER = "Xu et al. 2024, arXiv:2401.08417 (CPO), as TRL 1.16 trl.experimental.cpo"


def _cpo(
    name: str,
    fn: LossFn,
    params_cls: type[LossParams],
    formula_tex: str,
    description: str,
    paper: str = _CPO_PAPER,
    scores: str = r"$\beta\cdot\log\pi_\theta(y\mid x)$ (summed log-prob)",
    monotone: bool | Callable[[Any], bool] = True,
) -> LossSpec:
    """A CPO-family spec: reference-free, needs lengths, coupled by the batch-token NLL when asked for."""
    return LossSpec(
        name=name,
        fn=fn,
        params_cls=params_cls,
        family="simpo",
        formula_tex=formula_tex,
        paper=paper,
        scores=scores,
        needs=_LEN,
        batch_coupled=nll_coupled,
        monotone=monotone,
        description=description,
        notes=NLL_NOTE,
    )


# every spec this module registers, in catalogue order: declarations are data
_SPECS: tuple[LossSpec, ...] = (
    LossSpec(
        name="simpo",
        fn=simpo_loss,
        params_cls=SimPOParams,
        family="simpo",
        formula_tex=r"-\log\sigma\left(\beta\cdot\frac{\log\pi(y_w\mid x)}{\lvert y_w\rvert} - "
                    r"\beta\cdot\frac{\log\pi(y_l\mid x)}{\lvert y_l\rvert} - \gamma\right)",
        paper="Meng et al. 2024, arXiv:2405.14734 (SimPO)",
        scores=r"$\beta\cdot\log\pi_\theta(y\mid x)/\lvert y\rvert$ (average log-prob)",
        needs=_LEN,
        logp_reward="average",
        monotone=_unsmoothed,
        description="Simple Preference Optimization: reference-free, length-normalized margin loss.",
    ),
    _cpo(
        "cpo",
        cpo_loss,
        CPOSigmoidParams,
        r"-\log\sigma\bigl(\beta(\log\pi(y_w\mid x) - \log\pi(y_l\mid x))\bigr) - \alpha\cdot\frac{\log\pi(y_w\mid "
        r"x)}{\lvert y_w\rvert}",
        "Contrastive Preference Optimization: a reference-free DPO plus NLL on the chosen response.",
        paper="Xu et al. 2024, arXiv:2401.08417 (CPO)",
        monotone=_unsmoothed,
    ),
    _cpo(
        "cpo-hinge",
        cpo_hinge_loss,
        CPOParams,
        r"\max\bigl(0, 1 - \beta(\log\pi(y_w\mid x) - \log\pi(y_l\mid x))\bigr) - \alpha\cdot\frac{\log\pi(y_w\mid "
        r"x)}{\lvert y_w\rvert}",
        "CPO with SLiC's hinge as the preference term (TRL CPOTrainer loss_type='hinge').",
    ),
    _cpo(
        "cpo-ipo",
        cpo_ipo_loss,
        CPOParams,
        r"\left(\frac{\log\pi(y_w\mid x)}{\lvert y_w\rvert} - \frac{\log\pi(y_l\mid x)}{\lvert y_l\rvert} - "
        r"\frac{1}{2\beta}\right)^2 - \alpha\cdot\frac{\log\pi(y_w\mid x)}{\lvert y_w\rvert}",
        "CPO with IPO's squared preference term on average log-probs (TRL CPOTrainer loss_type='ipo').",
        scores=r"$\beta\cdot\log\pi_\theta(y\mid x)/\lvert y\rvert$ (average log-prob)",
        monotone=False,
    ),
    _cpo(
        "cpo-simpo",
        cpo_simpo_loss,
        CPOSimPOParams,
        r"-\log\sigma\left(\beta\cdot\frac{\log\pi(y_w\mid x)}{\lvert y_w\rvert} - \beta\cdot\frac{\log\pi(y_l\mid "
        r"x)}{\lvert y_l\rvert} - \gamma\right) - \alpha\cdot\frac{\log\pi(y_w\mid x)}{\lvert y_w\rvert}",
        "CPO-SimPO: SimPO's length-normalized margin plus CPO's NLL on the chosen response "
        "(TRL CPOTrainer loss_type='simpo' with cpo_alpha).",
        paper="Meng et al. 2024, arXiv:2405.14734 (SimPO) + Xu et al. 2024, arXiv:2401.08417 (CPO), "
        "as TRL 1.16 trl.experimental.cpo",
        scores=r"$\beta\cdot\log\pi_\theta(y\mid x)/\lvert y\rvert$ (average log-prob)",
        monotone=_unsmoothed,
    ),
    LossSpec(
        name="simper",
        fn=simper_loss,
        params_cls=SimPERParams,
        family="simpo",
        formula_tex=r"-\exp\left(\frac{\log\pi(y_w\mid x)}{\lvert y_w\rvert}\right) + "
                    r"\exp\left(\frac{\log\pi(y_l\mid x)}{\lvert y_l\rvert}\right)",
        paper="Xiao et al. 2025, arXiv:2502.00883 (SimPER)",
        scores=r"$\exp(\log\pi_\theta(y\mid x)/\lvert y\rvert)$ (inverse perplexity)",
        needs=_LEN,
        description="Simple Preference optimization with pERplexity: hyperparameter-free and reference-free; "
        "raises the chosen response's inverse perplexity and lowers the rejected one's.",
    ),
    LossSpec(
        name="slic",
        fn=slic_loss,
        params_cls=SLiCParams,
        family="simpo",
        formula_tex=r"\max\bigl(0, \delta - \log\pi(y_w\mid x) + \log\pi(y_l\mid x)\bigr) - "
                    r"\lambda\cdot\log\pi(y_w\mid x)",
        paper="Zhao et al. 2023, arXiv:2305.10425 (SLiC-HF)",
        scores=r"$\log\pi_\theta(y\mid x)$ (summed log-prob)",
        description="Sequence Likelihood Calibration with Human Feedback, direct: a rank-calibration hinge on "
        "summed log-probs plus an NLL regulariser on the chosen response (y_ref = y_w); reference-free.",
        notes="The regulariser is the summed (sequence) NLL, as the paper; `hinge` is the reference-based "
        "variant that TRL calls SLiC.",
    ),
    )


prefzoo_register_losses = registers(_SPECS)
