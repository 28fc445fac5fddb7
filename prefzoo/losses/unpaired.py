"""Losses on unpaired feedback (``Shape.UNPAIRED``): one completion per example, labelled desirable or undesirable.

With the log-ratio of completion i, ρ_i = log π_θ(y_i|x_i) − log π_ref(y_i|x_i), and its implicit reward β·ρ_i:

* ``kto`` (TRL 1.16 KTOTrainer, loss_type="kto"): desirable λ_D·(1 − σ(β(ρ − z₀))), undesirable
  λ_U·(1 − σ(β(z₀ − ρ))), with the reference point z₀ = max(0, mean(log π_θ(y'|x) − log π_ref(y'|x))) over the
  mismatched (KL) completions y' of the whole gathered batch.
* ``apo-zero-unpaired`` (TRL 1.16 KTOTrainer, loss_type="apo_zero_unpaired"): z₀ = 0 and no KL completions:
  desirable λ_D·(1 − σ(βρ)), undesirable λ_U·σ(βρ).
* ``bco`` (TRL's BCOTrainer): desirable −log σ(βρ − δ), undesirable −log σ(−(βρ − δ)), where δ is the running mean
  of every implicit reward β·ρ seen in training so far.  δ is the loss's *state*
  (:attr:`prefzoo.LossSpec.initial_state`): it advances once per training call, from the rewards of the whole gathered
  batch, so every process holds the same δ; ``Loss.state_dict()`` carries it into checkpoints.  With
  ``UnpairedBatch.density_ratio_weights`` (the trainer's ``--density-ratio``: BCO's underlying-distribution matching,
  :mod:`prefzoo.losses.density_ratio`) each example's loss is multiplied by its weight, as TRL's ``bco_loss`` does.

z₀ and δ are constants (no gradient flows through them), as in TRL.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

from prefzoo.losses._common import registers
from prefzoo.spec import LossParams, LossSpec, param
from prefzoo.types import LossContext, LossOutput, LossState, Need, Shape, UnpairedBatch, UnpairedBatchError

KTO_PAPER = "Ethayarajh et al. 2024, arXiv:2402.01306 (KTO), as TRL 1.16's KTOTrainer"
APO_PAPER = "D'Oosterlinck et al. 2024, arXiv:2408.06266 (APO), unpaired as TRL 1.16's KTOTrainer"
BCO_PAPER = "Jung et al. 2024, arXiv:2404.04656 (BCO), as TRL's BCOTrainer (1.13)"
UNPAIRED = frozenset({Shape.UNPAIRED})


@dataclass(frozen=True, kw_only=True)
class KTOParams(LossParams):
    beta: float = param(0.1, r"$\beta$: inverse temperature of the implicit reward "
        r"$\beta\cdot\log(\pi/\pi_{\mathrm{ref}})$", gt=0.0)
    desirable_weight: float = param(1.0, r"$\lambda_D$: weight of each desirable example's loss", gt=0.0)
    undesirable_weight: float = param(1.0, r"$\lambda_U$: weight of each undesirable example's loss", gt=0.0)


@dataclass(frozen=True, kw_only=True)
class BCOParams(LossParams):
    beta: float = param(0.1, r"$\beta$: inverse temperature of the implicit reward "
        r"$\beta\cdot\log(\pi/\pi_{\mathrm{ref}})$", gt=0.0)


def _field(batch: UnpairedBatch, name: str) -> Tensor:
    t = getattr(batch, name)
    if t is None:
        raise UnpairedBatchError(f"UnpairedBatch.{name} is None but this loss needs it")
    return t


def _rho(batch: UnpairedBatch) -> Tensor:
    """ρ = log π_θ(y|x) − log π_ref(y|x), (N,); the reference is a constant."""
    return batch.policy_logps - _field(batch, "ref_logps").detach()


def kto_reference_point(batch: UnpairedBatch, ctx: LossContext) -> Tensor:
    """z₀ = max(0, mean over the gathered batch of log π_θ(y'|x) − log π_ref(y'|x)), a detached scalar.

    TRL 1.16 averages each process's mean (``gather_for_metrics(mean).mean()``); that is this mean when the shards
    are equal, and this one does not depend on how an uneven batch is split.
    """
    kl = (_field(batch, "kl_policy_logps") - _field(batch, "kl_ref_logps")).detach()  # (N,)
    return ctx.gather(kl).mean().clamp(min=0)  # ()


def _prospect(batch: UnpairedBatch, p: KTOParams, z0: Tensor) -> Tensor:
    """λ_D·(1 − σ(β(ρ − z₀))) where desirable, λ_U·(1 − σ(β(z₀ − ρ))) where not; 1 − σ(x) written σ(−x)."""
    rho = _rho(batch)  # (N,)
    margin = torch.where(batch.labels, rho - z0, z0 - rho)  # (N,)
    weight = torch.where(batch.labels, rho.new_tensor(p.desirable_weight), rho.new_tensor(p.undesirable_weight))
    return weight * torch.sigmoid(-p.beta * margin)


def _output(batch: UnpairedBatch, losses: Tensor, point: Tensor, beta: float, **metrics: Tensor) -> LossOutput:
    """Scores: the completion's β·ρ against the point it is compared with (a scalar, broadcast)."""
    reward = (beta * _rho(batch)).detach()  # (N,)
    return LossOutput(losses, reward, point.detach().to(reward.dtype).expand_as(reward), metrics, rewards=reward)


def kto_loss(batch: UnpairedBatch, p: KTOParams, ctx: LossContext) -> LossOutput:
    """KTO (Ethayarajh et al. 2024, Eq. 7) as TRL 1.16.  L = λ_y·(1 − σ(β·s_y·(ρ − z₀))), s_y = ±1 by label."""
    z0 = kto_reference_point(batch, ctx)  # ()
    return _output(batch, _prospect(batch, p, z0), p.beta * z0, p.beta, **{"kto/z0": z0})


def apo_zero_unpaired_loss(batch: UnpairedBatch, p: KTOParams, ctx: LossContext) -> LossOutput:
    """APO-zero on unpaired data (TRL 1.16).  L = λ_D·(1 − σ(βρ)) desirable, λ_U·σ(βρ) undesirable."""
    z0 = torch.zeros((), dtype=batch.policy_logps.dtype, device=batch.policy_logps.device)
    return _output(batch, _prospect(batch, p, z0), z0, p.beta)


def bco_initial_state(p: BCOParams) -> LossState:
    """δ = 0 before any reward was seen (TRL's RunningMoments starts at mean 0), after 0 rewards."""
    return {"delta": torch.zeros((), dtype=torch.float64), "count": torch.zeros((), dtype=torch.float64)}


def running_mean(state: Mapping[str, Tensor], rewards: Tensor) -> LossState:
    """The running mean after ``rewards`` (every process's, gathered): δ ← δ + (mean(r) − δ)·n/(count + n).

    TRL's RunningMoments.update, for the mean (its variance is not used by the loss), in float64.
    """
    r = rewards.detach().to(torch.float64)  # (M,)
    delta, count = state["delta"].to(r.device), state["count"].to(r.device)
    total = count + r.numel()
    return {"delta": delta + (r.mean() - delta) * (r.numel() / total), "count": total}


def bco_loss(batch: UnpairedBatch, p: BCOParams, ctx: LossContext) -> LossOutput:
    """BCO (Jung et al. 2024, Eq. 9) as TRL.  L = −log σ(s_y·(βρ − δ)), s_y = ±1 by label, δ the running reward mean."""
    if ctx.state is None:
        raise UnpairedBatchError("loss 'bco' keeps a running reward mean δ: call it through prefzoo.Loss (get_loss)")
    r = p.beta * _rho(batch)  # (N,) implicit rewards
    state = running_mean(ctx.state, ctx.gather(r.detach())) if ctx.update_state else dict(ctx.state)
    delta = state["delta"].to(r)  # ()
    sign = torch.where(batch.labels, r.new_tensor(1.0), r.new_tensor(-1.0))  # (N,) +1 desirable, −1 undesirable
    losses = F.softplus(-sign * (r - delta))  # −log σ(s·(r − δ))
    metrics = {"bco/delta": delta.detach()}
    if batch.density_ratio_weights is not None:  # UDM: w = 1 desirable, clamp(p(x|D)/p(x|U)) undesirable, constant
        w = batch.density_ratio_weights.detach().to(losses)  # (N,)
        losses = w * losses
        metrics["bco/density_ratio_weight"] = w.mean()
    out = _output(batch, losses, delta, p.beta, **metrics)
    out.state = state
    return out


_SCORES = (
    r"$\beta\cdot\rho$ of the completion (chosen_rewards) against the point it is compared with "
    r"(rejected_rewards)"
)

_COMMON: dict[str, Any] = dict(family="unpaired", shapes=UNPAIRED, shift_invariant=True)


# every spec this module registers, in catalogue order: declarations are data
_SPECS: tuple[LossSpec, ...] = (
    LossSpec(
        name="kto",
        fn=kto_loss,
        params_cls=KTOParams,
        formula_tex=r"\lambda_D\cdot\bigl(1 - \sigma(\beta(\rho - z_0))\bigr)\ \text{desirable},\quad "
                    r"\lambda_U\cdot\bigl(1 - \sigma(\beta(z_0 - \rho))\bigr)\ \text{undesirable};\quad z_0 = "
                    r"\max\bigl(0, \operatorname{mean}_{\text{batch}}(\log\pi_\theta(y'\mid x) - "
                    r"\log\pi_{\mathrm{ref}}(y'\mid x))\bigr)",
        paper=KTO_PAPER,
        scores=_SCORES + r": $\beta\cdot z_0$",
        needs=frozenset({Need.REFERENCE, Need.KL_REFERENCE}),
        batch_coupled=True,
        description="Kahneman–Tversky Optimization on thumbs-up/down data: each completion's implicit reward "
        r"is compared with a reference point $z_0$, an estimate of "
            r"$\mathrm{KL}(\pi_\theta\,\Vert\,\pi_{\mathrm{ref}})$ "
        "from mismatched "
        "prompt/completion pairs, averaged over the whole gathered batch (all processes).",
        notes=r"$z_0$ is a constant (no gradient), as in TRL. TRL averages the per-process means of the KL "
        "estimate; prefzoo takes the mean over the gathered batch, equal for equal shards and independent of "
        r"how an uneven batch is split. Set $\lambda_D n_D/(\lambda_U n_U)$ in $[1, 4/3]$ when the classes are "
        "imbalanced "
        "(KTO paper, Eq. 8).",
        **_COMMON,
    ),
    LossSpec(
        name="apo-zero-unpaired",
        fn=apo_zero_unpaired_loss,
        params_cls=KTOParams,
        formula_tex=r"\lambda_D\cdot\bigl(1 - \sigma(\beta\rho)\bigr)\ \text{desirable},\quad "
                    r"\lambda_U\cdot\sigma(\beta\rho)\ \text{undesirable}",
        paper=APO_PAPER,
        scores=_SCORES + ": $0$",
        needs=frozenset({Need.REFERENCE}),
        description="Anchored Preference Optimization (zero anchor) on unpaired data: raise the likelihood "
        "of desirable and lower that of undesirable completions relative to the reference, for data better "
        r"than the model's own outputs. KTO with $z_0 = 0$ and no KL completions.",
        **_COMMON,
    ),
    LossSpec(
        name="bco",
        fn=bco_loss,
        params_cls=BCOParams,
        formula_tex=r"-\log\sigma(\beta\rho - \delta)\ \text{desirable},\quad -\log\sigma\bigl(-(\beta\rho - "
                    r"\delta)\bigr)\ \text{undesirable};\quad \delta = \text{running mean of every } \beta\rho "
                    r"\text{ trained on}",
        paper=BCO_PAPER,
        scores=_SCORES + r": $\delta$",
        needs=frozenset({Need.REFERENCE}),
        batch_coupled=True,
        initial_state=bco_initial_state,
        density_ratio_weights=True,
        description="Binary Classifier Optimization: a logistic classifier of desirable vs undesirable on the "
        r"implicit reward, shifted by $\delta$, the running mean of the rewards of every training batch (gathered over "
        r"all processes, updated before the loss as in TRL). $\delta$ is loss state: it advances on training calls "
        "only, every process holds the same value, and the bound loss's state_dict() carries it into checkpoints.",
        notes="TRL's underlying-distribution matching is `prefzoo train --density-ratio` (off by default, as in "
        "TRL, where it needs an embedding_func): at the start the trainer embeds a seeded sample of up to "
        "--density-ratio-prompts desirable and as many undesirable prompts (mean-pooled last hidden states of "
        "the frozen reference), fits prefzoo.losses.density_ratio.DensityRatioClassifier (sklearn's balanced "
        "LogisticRegression, in torch) on the embeddings gathered from every process, and passes each batch's "
        "weights 1 (desirable) and clamp(P/(1 − P + 1e-8), --min-density-ratio, --max-density-ratio) "
        "(undesirable) in UnpairedBatch.density_ratio_weights; the loss multiplies each example's loss by its "
        r"weight. $\delta$ is kept in float64 (TRL: float32).",
        **_COMMON,
    ),
    )


prefzoo_register_losses = registers(_SPECS)
