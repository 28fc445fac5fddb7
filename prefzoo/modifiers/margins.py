"""Modifiers of a reward-difference loss's margin and β: ODPO (an offset from the data's scores) and β-DPO."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass

import torch
from torch import Tensor

from prefzoo.modifiers._common import REWARD_DIFFERENCE, pair_margin_inputs, registers
from prefzoo.spec import InnerLoss, LossParams, LossSpec, ModifierSpec, param
from prefzoo.types import LossContext, LossOutput, LossState, Need, PreferenceBatch, PreferenceBatchError

_MIN_BETA_SCALE = 1e-3  # β-DPO's β_batch never falls below 1e-3·β₀ (a batch far below M₀ would make it ≤ 0)


@dataclass(frozen=True, kw_only=True)
class ODPOParams(LossParams):
    alpha: float = param(1.0, r"$\alpha$: scale of the offset $\Delta_r = \alpha\cdot\log(\mathrm{score}(y_w) - "
        r"\mathrm{score}(y_l))$", ge=0.0)


def odpo_offset(chosen_scores: Tensor, rejected_scores: Tensor, alpha: float) -> Tensor:
    """Δ_r = α·log(s_w − s_l) (ODPO Sec. 4: the log-scaled score difference); a constant."""
    diff = (chosen_scores - rejected_scores).detach()  # (B,)
    if not bool((diff > 0).all()):
        i = int(torch.nonzero(diff <= 0)[0])
        raise PreferenceBatchError(
            f"odpo: chosen_scores[{i}] = {chosen_scores[i].item()} is not above rejected_scores[{i}] = "
            f"{rejected_scores[i].item()}; ODPO's offset α·log(s_w − s_l) needs the chosen response scored higher"
        )
    return alpha * torch.log(diff)


def odpo(inner: InnerLoss, batch: PreferenceBatch, p: ODPOParams, spec: LossSpec, lp: LossParams,
         ctx: LossContext) -> LossOutput:  # fmt: skip
    """ODPO (Amini et al. 2024, arXiv:2402.10571): L = ℓ(β·Δ − Δ_r), Δ_r = α·log(score(y_w) − score(y_l)).

    A reward-difference loss reads the pair only through β·Δ, so log π(y_w) is lowered by Δ_r/β.
    """
    assert batch.chosen_scores is not None and batch.rejected_scores is not None
    beta = float(getattr(lp, "beta"))  # noqa: B009 (reward-difference losses declare the parameter beta)
    offset = odpo_offset(batch.chosen_scores, batch.rejected_scores, p.alpha).to(batch.policy_chosen_logps.dtype)
    out = inner(batch.replace(policy_chosen_logps=batch.policy_chosen_logps - offset / beta), lp)
    return dataclasses.replace(out, metrics={**out.metrics, "odpo/offset": offset.mean()})


@dataclass(frozen=True, kw_only=True)
class BetaDPOParams(LossParams):
    alpha: float = param(
        0.6, r"$\alpha$: how strongly $\beta$ follows the batch's mean reward margin (paper: 0.6 on HH)", ge=0.0
    )
    momentum: float = param(
        0.9, r"$m$: momentum of the running margin statistics $M_0 \leftarrow m\cdot M_0 + (1 - m)\cdot"
        r"\text{mean } M_i$ (the authors' code: 0.9)", ge=0.0, lt=1.0,
    )  # fmt: skip
    filter_fraction: float = param(
        0.8, r"$\rho$: fraction of the gathered batch kept, sampled with weights $\exp(-(M_i - M_0)^2/2\sigma^2)$ "
        "(the authors' default: 0.8; 1 = no filtering)", gt=0.0, le=1.0,
    )  # fmt: skip
    seed: int = param(0, "seed of the filtering draws (with the step count: resume and sharding are exact)", ge=0)


def beta_dpo_initial_state(p: BetaDPOParams) -> LossState:
    """M₀ = σ = 0 before the first batch (the authors' code starts its moving averages at zero), after 0 updates."""
    z = torch.zeros((), dtype=torch.float64)
    return {"margin_mean": z, "margin_std": z.clone(), "steps": z.clone()}


def beta_dpo_update(state: Mapping[str, Tensor], margins: Tensor, momentum: float) -> LossState:
    """M₀ ← m·M₀ + (1 − m)·mean(M),  σ ← m·σ + (1 − m)·std(M) over the gathered (N,) margins (unbiased std; 0 if N = 1).

    float64; the new statistics include the current batch, as the authors' ``update_and_sync_tensor_mean`` runs
    before the loss.
    """
    m = margins.detach().to(torch.float64).cpu()  # (N,)
    std = m.std() if m.numel() > 1 else torch.zeros((), dtype=torch.float64)
    return {"margin_mean": momentum * state["margin_mean"] + (1 - momentum) * m.mean(),
            "margin_std": momentum * state["margin_std"] + (1 - momentum) * std,
            "steps": state["steps"] + 1}  # fmt: skip


def beta_dpo_sample(margins: Tensor, mean: Tensor, std: Tensor, k: int, seed: int, step: int) -> Tensor:
    """(N,) bool: k of the gathered margins drawn without replacement with weights exp(−(M_i − M₀)²/(2σ²)).

    The authors' ``torch.multinomial(weights, k, replacement=False)``, written as the Gumbel top-k of the log-weights
    (the same distribution; no underflow when every weight is tiny); σ = 0 draws uniformly.  The draws come from a
    generator seeded by (seed, step), so every process draws the same pairs and a resumed run the same as before.
    """
    m = margins.detach().to(torch.float64).cpu()  # (N,)
    logw = -0.5 * ((m - mean) / std) ** 2 if float(std) > 0 else torch.zeros_like(m)  # (N,)
    g = torch.Generator().manual_seed(seed * 1_000_003 + step)
    u = torch.rand(m.shape, generator=g, dtype=torch.float64).clamp(min=1e-300)
    keys = logw - torch.log(-torch.log(u))  # (N,) log w_i + Gumbel noise
    keep = torch.zeros_like(m, dtype=torch.bool)
    keep[torch.topk(keys, k).indices] = True
    return keep


def beta_dpo(inner: InnerLoss, batch: PreferenceBatch, p: BetaDPOParams, spec: LossSpec, lp: LossParams,
             ctx: LossContext) -> LossOutput:  # fmt: skip
    """β-DPO (Wu et al. 2024, arXiv:2407.08639, Alg. 1: dynamic β and β-guided data filtering), as the authors' code.

    M_i = Δ_i (the log-ratio margin of the pair, the code's ``A_gap``), gathered over all processes;
    M₀ ← m·M₀ + (1 − m)·mean M_i,  σ ← m·σ + (1 − m)·std M_i   (running, loss state);
    kept: ⌊ρ·N⌋ pairs drawn with weights exp(−(M_i − M₀)²/(2σ²));  β_batch = β₀·(1 + α·(mean_{kept} M_i − M₀));
    L_i = ℓ_i(β_batch)·[i kept]·N/⌊ρN⌋, so the trainer's mean over the batch is the mean over the kept pairs.
    Evaluation (ctx.update_state False) reads M₀ without moving it and keeps every pair.
    """
    if ctx.state is None:
        raise PreferenceBatchError(
            "modifier 'beta-dpo' keeps running margin statistics: call it through prefzoo.Loss (get_loss)"
        )
    beta0 = float(getattr(lp, "beta"))  # noqa: B009 (reward-difference losses declare the parameter beta)
    s_w, s_l = pair_margin_inputs(batch)
    local = (s_w - s_l).detach()  # (B,) M_i of this process
    margins = ctx.gather(local)  # (N,)
    n = margins.shape[0]
    if ctx.update_state:
        state = beta_dpo_update(ctx.state, margins, p.momentum)
        k = max(1, int(p.filter_fraction * n))
        kept = (beta_dpo_sample(margins, state["margin_mean"], state["margin_std"], k, p.seed,
                                int(state["steps"])) if k < n else torch.ones(n, dtype=torch.bool))  # fmt: skip
    else:
        state, k, kept = dict(ctx.state), n, torch.ones(n, dtype=torch.bool)
    m0 = float(state["margin_mean"])
    mean_kept = float(margins.detach().to(torch.float64).cpu()[kept].mean())
    beta = beta0 * max(1 + p.alpha * (mean_kept - m0), _MIN_BETA_SCALE)
    out = inner(batch, dataclasses.replace(lp, beta=beta))  # type: ignore[call-arg]
    start = ctx.offset(local.shape[0], local.device)
    keep = kept[start : start + local.shape[0]].to(device=out.losses.device, dtype=out.losses.dtype)  # (B,)
    metrics = {**out.metrics, "beta-dpo/beta": torch.tensor(beta, dtype=torch.float64), "beta-dpo/kept": keep.mean(),
               "beta-dpo/margin_mean": state["margin_mean"].clone(), "beta-dpo/margin_std": state["margin_std"].clone()}
    return dataclasses.replace(out, losses=out.losses * keep * (n / k), metrics=metrics, state=state)


_SPECS: tuple[ModifierSpec, ...] = (
    ModifierSpec(
        name="odpo",
        fn=odpo,
        params_cls=ODPOParams,
        paper="Amini et al. 2024, arXiv:2402.10571 (ODPO)",
        transforms_tex=r"\beta\Delta \leftarrow \beta\Delta - \alpha\cdot\log\bigl(\mathrm{score}(y_w) - "
                      r"\mathrm{score}(y_l)\bigr)",
        applies=REWARD_DIFFERENCE,
        needs=frozenset({Need.SCORES}),
        description="DPO with an offset: the larger the data's score gap between the responses, the larger "
        "the margin the policy must reach. Needs score_chosen/score_rejected columns in the data.",
        notes=r"Rewards (and reward accuracy) are those of the offset margin $\beta\cdot\Delta - \Delta_r$.",
    ),
    ModifierSpec(
        name="beta-dpo",
        fn=beta_dpo,
        params_cls=BetaDPOParams,
        paper="Wu et al. 2024, arXiv:2407.08639 (β-DPO)",
        transforms_tex=r"\beta \leftarrow \beta_0\cdot\bigl(1 + \alpha\cdot(\operatorname{mean}_{\text{kept}} "
                       r"M_i - "
                      r"M_0)\bigr)\ \text{per batch},\quad M_i = \Delta_i,\ M_0\ \text{its running mean};\quad "
                      r"\lfloor\rho "
                      r"N\rfloor\ \text{pairs sampled by}\ \exp\bigl(-(M_i - M_0)^2/2\sigma^2\bigr)",
        applies=REWARD_DIFFERENCE,
        batch_coupled=True,
        initial_state=beta_dpo_initial_state,
        permutation_equivariant=lambda p: p.filter_fraction == 1.0,  # the draw is over batch positions
        description=r"Dynamic $\beta$: each batch's $\beta$ grows with its mean margin above $M_0$, the running "
        r"mean (momentum $m$) of the margins of every training batch, gathered over all processes; $\beta$-guided "
        r"filtering trains on $\lfloor\rho N\rfloor$ pairs of the gathered batch drawn with Gaussian weights around "
        r"$M_0$ (width $\sigma$, the running std).",
        notes=r"As the authors' code: the margin $M_i$ is the log-ratio margin $\Delta_i$ (no $\beta_0$), $M_0$ and "
        r"$\sigma$ start at 0 and include the current batch, the loss is the mean over the kept pairs. $M_0$, "
        r"$\sigma$ and the step count are "
        "loss state (state_dict, checkpoints); they move on training calls only, and evaluation keeps every "
        "pair. The draws are seeded by (seed, step), so every process draws the same pairs and a resumed run "
        "draws what the uninterrupted one would. Differences: the unbiased std of a one-pair batch is taken as "
        f"0, $\\sigma = 0$ draws uniformly (the code divides by zero), and $\\beta_{{\\mathrm{{batch}}}}$ is at least "
        f"${_MIN_BETA_SCALE:g}\\cdot\\beta_0$ "
        "(the code: at least 1e-3).",
    ),
)

prefzoo_register_modifiers = registers(_SPECS)
