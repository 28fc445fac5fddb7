"""ORPO: odds-ratio preference optimization."""

from __future__ import annotations

from dataclasses import dataclass

import torch.nn.functional as F

from prefzoo.losses._common import (
    NLL_NOTE,
    average_policy_logps,
    chosen_nll,
    log1mexp,
    nll_coupled,
    nll_reduction_param,
    registers,
)
from prefzoo.spec import LossParams, LossSpec, param
from prefzoo.types import LossContext, LossOutput, Need, PreferenceBatch

# An average log-prob of exactly 0 (every token certain) has infinite odds; cap it just below.
_MAX_AVG_LOGP = -1e-6


@dataclass(frozen=True, kw_only=True)
class ORPOParams(LossParams):
    beta: float = param(0.1, r"$\lambda$ (TRL beta): weight of the odds-ratio term", gt=0.0)
    nll_reduction: str = nll_reduction_param()


def orpo_loss(batch: PreferenceBatch, p: ORPOParams, ctx: LossContext) -> LossOutput:
    """ORPO (Hong et al. 2024, arXiv:2403.07691, Eq. 6-7), per example.

    With a = log π(y|x)/|y| (average log-prob) and log odds(y) = a − log(1 − e^a):
    L = −a_w − β · log σ(log odds(y_w) − log odds(y_l))   (−a_w is TRL's batch token mean with "batch-tokens")
    """
    a_w, a_l = average_policy_logps(batch)
    a_w, a_l = a_w.clamp(max=_MAX_AVG_LOGP), a_l.clamp(max=_MAX_AVG_LOGP)  # (B,)
    log_odds = (a_w - a_l) - (log1mexp(a_w) - log1mexp(a_l))  # (B,)
    ratio = F.logsigmoid(log_odds)
    nll = chosen_nll(batch, p.nll_reduction, ctx)  # (B,) −a_w for "example" (unclamped)
    losses = nll - p.beta * ratio
    metrics = {"orpo/log_odds_ratio": log_odds.detach().mean(), "orpo/nll": nll.detach().mean()}
    return LossOutput(losses, (p.beta * a_w).detach(), (p.beta * a_l).detach(), metrics)


_SPECS: tuple[LossSpec, ...] = (
    LossSpec(
        name="orpo",
        fn=orpo_loss,
        params_cls=ORPOParams,
        family="orpo",
        formula_tex=r"-\frac{\log\pi(y_w\mid x)}{\lvert y_w\rvert} - "
                    r"\beta\cdot\log\sigma\bigl(\log\operatorname{odds}(y_w) - \log\operatorname{odds}(y_l)\bigr)",
        paper="Hong et al. 2024, arXiv:2403.07691 (ORPO)",
        scores=r"$\beta\cdot\log\pi_\theta(y\mid x)/\lvert y\rvert$ (average log-prob)",
        needs=frozenset({Need.LENGTHS}),
        batch_coupled=nll_coupled,
        description="Monolithic preference optimization: NLL plus a log odds-ratio penalty, reference-free.",
        notes="Average log-probs are capped at −1e-6 inside the odds so that they stay finite when every token "
        "is certain. TRL's NLL also covers the prompt tokens; prefzoo's covers the response, like its other "
        f"losses. {NLL_NOTE}",
    ),
)

prefzoo_register_losses = registers(_SPECS)
