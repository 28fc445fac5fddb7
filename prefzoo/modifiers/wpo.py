"""WPO: weighted preference optimization, as TRL 1.16's ``use_weighting``."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch
from torch import Tensor

from prefzoo.modifiers._common import ANY_PER_PAIR, registers
from prefzoo.spec import InnerLoss, LossParams, LossSpec, ModifierSpec
from prefzoo.types import LossContext, LossOutput, Need, PreferenceBatch


@dataclass(frozen=True, kw_only=True)
class WPOParams(LossParams):
    pass


def wpo_weight(token_logps: Tensor, log_sq_probs: Tensor, mask: Tensor) -> Tensor:
    """w(x, y) = exp((1/|y|) Σ_t [log π(y_t|x, y_<t) − log Σ_v π(v|x, y_<t)²]), a constant (no gradient)."""
    m = mask.to(token_logps.dtype)  # (B, T)
    aligned = ((token_logps - log_sq_probs) * m).detach()  # (B, T)
    return torch.exp(aligned.sum(-1) / m.sum(-1).clamp(min=1))  # (B,)


def wpo(
    inner: InnerLoss, batch: PreferenceBatch, p: WPOParams, spec: LossSpec, lp: LossParams, ctx: LossContext
) -> LossOutput:
    """WPO (Zhou et al. 2024, arXiv:2406.11827, Eq. 2 with weight alignment), as TRL 1.16 ``use_weighting``.

    L'_i = w(x, y_w)·w(x, y_l)·L_i
    """
    assert batch.policy_chosen_token_logps is not None and batch.chosen_token_log_sq_probs is not None
    assert batch.policy_rejected_token_logps is not None and batch.rejected_token_log_sq_probs is not None
    assert batch.chosen_mask is not None and batch.rejected_mask is not None
    out = inner(batch, lp)
    w_w = wpo_weight(batch.policy_chosen_token_logps, batch.chosen_token_log_sq_probs, batch.chosen_mask)  # (B,)
    w_l = wpo_weight(batch.policy_rejected_token_logps, batch.rejected_token_log_sq_probs, batch.rejected_mask)
    w = (w_w * w_l).to(out.losses.dtype)  # (B,)
    metrics = {**out.metrics, "wpo/weight": w.mean()}
    return dataclasses.replace(out, losses=out.losses * w, metrics=metrics)


_SPECS: tuple[ModifierSpec, ...] = (
    ModifierSpec(
        name="wpo",
        fn=wpo,
        params_cls=WPOParams,
        paper="Zhou et al. 2024, arXiv:2406.11827 (WPO)",
        transforms_tex=r"L_i \leftarrow w(y_w)\cdot w(y_l)\cdot L_i,\quad w(y) = "
                      r"\exp\Bigl(\operatorname{mean}_t\bigl[\log\pi(y_t) - \log\sum_v \pi(v)^2\bigr]\Bigr)\ "
                      r"\text{(detached)}",
        applies=ANY_PER_PAIR,
        needs=frozenset({Need.TOKEN_LOGPS, Need.TOKEN_SQUARED_PROBS}),
        trl="DPOConfig.use_weighting=True",
        description="Weighted preference optimization: each pair weighted by how likely the current policy is "
        r"to generate both responses (length-normalized, aligned by the policy's own $\sum_v \pi(v)^2$), simulating "
        "on-policy data with off-policy pairs.",
        notes="As TRL, the weights are constants (no gradient flows through them). A weight is at most about "
        r"$\sqrt{V}/2$ per response ($V$ the vocabulary size), so on f-DPO's exponential divergences (forward_kl, "
        r"alpha_divergence), whose loss already reaches $e^{80} \approx 5.5\mathrm{e}34$, the weighted loss can "
            r"overflow float32.",
    ),
)

prefzoo_register_modifiers = registers(_SPECS)
