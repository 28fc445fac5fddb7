"""Liger-Kernel's five fused preference losses by name, constructor arguments and outputs, any prefzoo loss behind them.

``from prefzoo.nn import LigerFusedLinearDPOLoss`` in place of ``from liger_kernel.chunked_loss import ...``: the same
constructor (Liger 0.8.5's arguments and defaults), the same call and the same ``(loss, outputs)``, computed by
prefzoo's fused head (:class:`~prefzoo.nn.FusedLinearPreferenceLoss`): nothing of size positions × vocabulary is kept.
One more constructor argument, ``loss=``, puts any prefzoo loss of the right kind behind a class (pair losses behind the
four pair classes, unpaired losses behind KTO's): a registered name, a weighted sum (``"0.8*dpo + 0.2*bco-pair"``) or a
bound :class:`prefzoo.Loss` (``get_loss("dpo", modifiers=["ld-dpo"], beta=0.2)``).

What a class computes, as Liger: the loss's mean over pairs (or rows) of the log-probs it is given (each row's mean
per scored token with ``average_log_prob``; SimPO and ORPO average by their own definition), plus ``alpha`` · the
NLL of the chosen rows over all their scored tokens (``compute_nll_loss``; ORPO's over ``nll_target`` when given).
Without a reference model (``use_ref_model=False``) the reference log-probs are 0.  ``compiled`` and ``chunk_size``
are accepted and have no effect: the head chunks by positions and runs eagerly.

Outputs, positionally as Liger's: pair classes ``(chosen log-probs (B,), rejected (B,), mean chosen logit, mean
rejected logit, chosen NLL, chosen rewards (B,), rejected rewards (B,))`` (ORPO adds the mean log σ(log odds ratio)
and the mean log odds ratio); KTO ``(Σ chosen log-probs, Σ rejected, Σ chosen logits, Σ rejected logits, Σ chosen
rewards, Σ rejected rewards)``.  A mean or sum of logits covers every position and the whole vocabulary, as Liger's,
computed as (Σ_t h_t)·(Σ_v W_v) + T·Σ_v b_v without forming a logit.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from prefzoo.nn.layout import build_batch
from prefzoo.nn.module import FusedLinearPreferenceLoss
from prefzoo.nn.rows import FusedInputError, Positions, check_head, check_rows, positions
from prefzoo.nn.scoring import at_least_float32, policy_scores
from prefzoo.registry import get_loss
from prefzoo.spec import Loss
from prefzoo.types import Need, Shape

__all__ = [
    "DPO_LOSS_TYPES",
    "LigerFusedLinearCPOLoss",
    "LigerFusedLinearDPOLoss",
    "LigerFusedLinearKTOLoss",
    "LigerFusedLinearORPOLoss",
    "LigerFusedLinearSimPOLoss",
]

# Liger's DPO loss_type → the prefzoo loss of the same formula
DPO_LOSS_TYPES = {
    "sigmoid": "dpo", "hinge": "hinge", "exo_pair": "exo-pair", "nca_pair": "nca-pair", "robust": "robust",
    "bco_pair": "bco-pair", "sppo_hard": "sppo-hard", "apo_zero": "apo-zero", "apo_down": "apo-down",
    "discopop": "discopop",
}  # fmt: skip

# (ref_input, ref_weight, ref_bias, ref_logps) as the fused module takes the reference
# positions per head chunk: one (128, V) float32 logits buffer (25 MB at V = 49,152) besides the weight's gradient,
# where the fused module's default (1,024, capped at 16M logits) holds 64 MB; docs/results/performance-nn.md
CHUNK_POSITIONS = 128

RefArgs = tuple[Tensor | None, Tensor | None, Tensor | None, Tensor | None]
Extras = dict[str, Tensor | None] | None  # labels, scores, kl_policy_logps, kl_ref_logps


def _bound(loss: str | Loss, shape: Shape, cls: str) -> Loss:
    """``loss`` bound (a name or sum with its default parameters), checked to take ``shape``."""
    bound = loss if isinstance(loss, Loss) else get_loss(loss)
    if not bound.spec.accepts(shape):
        kind = "unpaired rows (labels)" if shape is Shape.UNPAIRED else "pairs (chosen rows over rejected rows)"
        raise FusedInputError(f"{cls} takes a loss on {kind}; loss {bound.name!r} does not take them")
    return bound


def dpo_loss_for(loss_type: str, beta: float, label_smoothing: float, discopop_tau: float) -> Loss:
    """The prefzoo loss of Liger's DPO ``loss_type`` (its ``sigmoid`` ignores ``label_smoothing``, as Liger's)."""
    if loss_type not in DPO_LOSS_TYPES:
        raise ValueError(f"Unsupported loss_type: {loss_type!r}. Supported types are: {', '.join(DPO_LOSS_TYPES)}")
    if loss_type == "exo_pair" and not label_smoothing > 0:
        raise ValueError(f"label_smoothing must be > 0 for loss_type='exo_pair' (EXO: 1e-3), got {label_smoothing}")
    if loss_type == "robust" and not 0.0 <= label_smoothing < 0.5:
        raise ValueError(f"label_smoothing must lie in [0.0, 0.5) for loss_type='robust', got {label_smoothing}")
    params: dict[str, Any] = {"beta": beta}
    if loss_type in ("robust", "exo_pair"):
        params["label_smoothing"] = label_smoothing
    if loss_type == "discopop":
        params["tau"] = discopop_tau
    return get_loss(DPO_LOSS_TYPES[loss_type], **params)


def logits_sums(lin_weight: Tensor, bias: Tensor | None, _input: Tensor) -> Tensor:
    """(R,) Σ_t Σ_v z_tv of each row's logits z = h·Wᵀ + b over every position: (Σ_t h_t)·(Σ_v W_v) + T·Σ_v b_v."""
    acc = torch.promote_types(_input.dtype, torch.float32)
    with torch.no_grad():
        s = _input.sum(1, dtype=acc) @ lin_weight.sum(0, dtype=acc)  # (R,)
        return s if bias is None else s + _input.shape[1] * bias.sum(dtype=acc)


class _LigerBase(nn.Module):
    """What the five classes share: the fused module, the reference Liger's way and the per-row averages."""

    def _setup(self, loss: Loss, ignore_index: int, use_ref_model: bool, average_log_prob: bool) -> None:
        self.fused = FusedLinearPreferenceLoss(loss, ignore_index=ignore_index, chunk_size=CHUNK_POSITIONS)
        self.ignore_index, self.use_ref_model, self.average_log_prob = ignore_index, use_ref_model, average_log_prob

    @property
    def loss_fn(self) -> Loss:
        """The prefzoo loss behind the class."""
        return self.fused.loss_fn

    def _reference(self, n_rows: int, like: Tensor, ref_input: Tensor | None, ref_weight: Tensor | None,
                   ref_bias: Tensor | None) -> RefArgs:  # fmt: skip
        """The reference as the fused module takes it: hidden states with ``use_ref_model``, else log-probs 0."""
        if Need.REFERENCE not in self.fused.needs:
            return None, None, None, None
        if self.use_ref_model:
            return ref_input, ref_weight, ref_bias, None
        return None, None, None, torch.zeros(n_rows, dtype=at_least_float32(like).dtype, device=like.device)

    def _fields(self, lin_weight: Tensor, _input: Tensor, target: Tensor, bias: Tensor | None, ref: RefArgs,
                shape: Shape, extras: Extras = None) -> tuple[dict[str, Any], Positions]:  # fmt: skip
        """The rows' fields (``sums``: the summed log-probs, kept) with the log-probs averaged per scored token when
        the loss is to see averages."""
        check_head(lin_weight, bias)
        check_rows(lin_weight, _input, target)
        pos = self.fused.scored_positions(target, lin_weight.shape[0], shape)
        fields = self.fused.row_fields(lin_weight, _input, pos, bias, ref, extras)
        fields["sums"] = fields["policy_logps"]  # (R,) differentiable
        if self.average_log_prob:
            fields["policy_logps"] = fields["policy_logps"] / pos.lengths
            if fields.get("ref_logps") is not None:
                fields["ref_logps"] = fields["ref_logps"] / pos.lengths
        return fields, pos


class _LigerPairs(_LigerBase):
    """The four pair classes: Liger's call, its NLL term and its 7 outputs (ORPO adds its odds ratios)."""

    shows_average = False  # whether the outputs show averaged log-probs whatever the loss sees (SimPO, ORPO)

    def _pair_setup(self, loss: str | Loss, ignore_index: int, alpha: float, compute_nll_loss: bool,
                    use_ref_model: bool, average_log_prob: bool) -> None:  # fmt: skip
        self._setup(_bound(loss, Shape.PAIR, type(self).__name__), ignore_index, use_ref_model, average_log_prob)
        self.alpha, self.compute_nll_loss = alpha, compute_nll_loss

    def _pairs(self, lin_weight: Tensor, _input: Tensor, target: Tensor, bias: Tensor | None,
               ref: tuple[Tensor | None, Tensor | None, Tensor | None] = (None, None, None),
               nll_target: Tensor | None = None) -> tuple[Tensor, tuple[Tensor, ...]]:  # fmt: skip
        if _input.ndim == 3 and _input.shape[0] % 2:
            raise FusedInputError(f"_input must stack chosen rows over rejected rows (2B), got R = {_input.shape[0]}")
        refs = self._reference(_input.shape[0], _input, *ref)
        f, pos = self._fields(lin_weight, _input, target, bias, refs, Shape.PAIR)
        out = self.loss_fn(build_batch(Shape.PAIR, 2, f))
        nll = self._nll(lin_weight, bias, _input, f["sums"], pos, nll_target)
        loss = out.losses.mean() + self.alpha * nll if self.compute_nll_loss else out.losses.mean()
        b = pos.n_rows // 2
        shown = (f["sums"] / pos.lengths if self.shows_average else f["policy_logps"]).detach()
        logits = logits_sums(lin_weight, bias, _input) / (_input.shape[1] * lin_weight.shape[0] * b)  # (R,)
        return loss, (shown[:b], shown[b:], logits[:b].sum(), logits[b:].sum(), nll.detach(), out.chosen_rewards,
                      out.rejected_rewards)  # fmt: skip

    def _nll(self, lin_weight: Tensor, bias: Tensor | None, _input: Tensor, sums: Tensor, pos: Positions,
             nll_target: Tensor | None) -> Tensor:  # fmt: skip
        """() −Σ log π over the chosen rows' scored tokens / their count (``nll_target``'s when given); 0 without
        ``compute_nll_loss``."""
        b = pos.n_rows // 2
        if not self.compute_nll_loss:
            return sums.new_zeros(())
        if nll_target is None:
            return -sums[:b].sum() / pos.lengths[:b].sum()
        check_rows(lin_weight, _input, nll_target)
        p = positions(nll_target[:b], self.ignore_index, lin_weight.shape[0])
        s = policy_scores(lin_weight, bias, _input[:b], p, self.fused.head_options).logps  # (B,)
        return -s.sum() / p.lengths.sum().clamp(min=1)


class LigerFusedLinearDPOLoss(_LigerPairs):
    """Liger's ``LigerFusedLinearDPOLoss``: DPO and its ``loss_type`` variants (each a prefzoo loss,
    :data:`DPO_LOSS_TYPES`), or any pair loss given as ``loss``."""

    def __init__(self, ignore_index: int = -100, beta: float = 0.1, alpha: float = 1.0, compute_nll_loss: bool = False,
                 compiled: bool = True, use_ref_model: bool = True, average_log_prob: bool = False,
                 chunk_size: int = 1, loss_type: str = "sigmoid", label_smoothing: float = 0.0,
                 discopop_tau: float = 0.05, *, loss: str | Loss | None = None) -> None:  # fmt: skip
        super().__init__()
        default = dpo_loss_for(loss_type, beta, label_smoothing, discopop_tau)
        self._pair_setup(default if loss is None else loss, ignore_index, alpha, compute_nll_loss, use_ref_model,
                         average_log_prob)  # fmt: skip
        self.beta, self.loss_type, self.label_smoothing = beta, loss_type, label_smoothing
        self.discopop_tau = discopop_tau
        self.compiled, self.chunk_size = compiled, chunk_size

    def forward(self, lin_weight: Tensor, _input: Tensor, target: Tensor, bias: Tensor | None = None,
                ref_input: Tensor | None = None, ref_weight: Tensor | None = None,
                ref_bias: Tensor | None = None) -> tuple[Tensor, tuple[Tensor, ...]]:  # fmt: skip
        return self._pairs(lin_weight, _input, target, bias, (ref_input, ref_weight, ref_bias))


class LigerFusedLinearSimPOLoss(_LigerPairs):
    """Liger's ``LigerFusedLinearSimPOLoss``: prefzoo's ``simpo`` (γ/β = ``gamma / beta``, ``label_smoothing``), or
    any pair loss given as ``loss``; the outputs show averaged log-probs, as Liger's."""

    shows_average = True

    def __init__(self, ignore_index: int = -100, beta: float = 0.1, alpha: float = 1.0, label_smoothing: float = 0.0,
                 compute_nll_loss: bool = True, compiled: bool = True, gamma: float = 0.5, chunk_size: int = 1, *,
                 loss: str | Loss | None = None) -> None:  # fmt: skip
        super().__init__()
        simpo: dict[str, Any] = {"beta": beta, "gamma_beta_ratio": gamma / beta, "label_smoothing": label_smoothing}
        bound = get_loss("simpo", **simpo) if loss is None else loss
        self._pair_setup(bound, ignore_index, alpha, compute_nll_loss, False, False)
        self.beta, self.gamma, self.label_smoothing, self.compiled, self.chunk_size = (
            beta, gamma, label_smoothing, compiled, chunk_size
        )  # fmt: skip

    def forward(self, lin_weight: Tensor, _input: Tensor, target: Tensor,
                bias: Tensor | None = None) -> tuple[Tensor, tuple[Tensor, ...]]:  # fmt: skip
        return self._pairs(lin_weight, _input, target, bias)


class LigerFusedLinearCPOLoss(_LigerPairs):
    """Liger's ``LigerFusedLinearCPOLoss``: prefzoo's ``cpo`` preference term (its own NLL weight 0: the class adds
    Liger's), or any pair loss given as ``loss``."""

    def __init__(self, ignore_index: int = -100, beta: float = 0.1, alpha: float = 1.0, label_smoothing: float = 0.0,
                 compute_nll_loss: bool = True, compiled: bool = True, average_log_prob: bool = False,
                 chunk_size: int = 1, *, loss: str | Loss | None = None) -> None:  # fmt: skip
        super().__init__()
        bound = get_loss("cpo", beta=beta, alpha=0.0, label_smoothing=label_smoothing) if loss is None else loss
        self._pair_setup(bound, ignore_index, alpha, compute_nll_loss, False, average_log_prob)
        self.beta, self.label_smoothing, self.compiled, self.chunk_size = beta, label_smoothing, compiled, chunk_size

    def forward(self, lin_weight: Tensor, _input: Tensor, target: Tensor,
                bias: Tensor | None = None) -> tuple[Tensor, tuple[Tensor, ...]]:  # fmt: skip
        return self._pairs(lin_weight, _input, target, bias)


class LigerFusedLinearORPOLoss(_LigerPairs):
    """Liger's ``LigerFusedLinearORPOLoss``: the odds-ratio term ``1*orpo + -1*sft`` (prefzoo's ``orpo`` without its
    NLL, which the class adds as Liger's, over ``nll_target`` when given), or any pair loss given as ``loss``."""

    shows_average = True

    def __init__(self, ignore_index: int = -100, beta: float = 0.1, compute_nll_loss: bool = True,
                 compiled: bool = True, chunk_size: int = 1, *, loss: str | Loss | None = None) -> None:  # fmt: skip
        super().__init__()
        odds_ratio: dict[str, Any] = {"orpo.beta": beta, "orpo.nll_reduction": "batch-tokens",
                                      "sft.nll_reduction": "batch-tokens"}  # fmt: skip
        bound = get_loss("1*orpo + -1*sft", **odds_ratio) if loss is None else loss
        self._pair_setup(bound, ignore_index, 1.0, compute_nll_loss, False, False)
        self.beta, self.compiled, self.chunk_size = beta, compiled, chunk_size

    def forward(self, lin_weight: Tensor, _input: Tensor, target: Tensor, bias: Tensor | None = None,
                nll_target: Tensor | None = None) -> tuple[Tensor, tuple[Tensor, ...]]:  # fmt: skip
        loss, out = self._pairs(lin_weight, _input, target, bias, nll_target=nll_target)
        a_w, a_l = out[0], out[1]  # (B,) average log-probs
        log_odds = (a_w - a_l) - (torch.log1p(-torch.exp(a_w)) - torch.log1p(-torch.exp(a_l)))  # (B,)
        rewards = (self.beta * a_w, self.beta * a_l)  # Liger's ORPO scores, whatever the loss
        return loss, (*out[:5], *rewards, F.logsigmoid(log_odds).mean(), log_odds.mean())


class LigerFusedLinearKTOLoss(_LigerBase):
    """Liger's ``LigerFusedLinearKTOLoss`` (``_input`` first): each reward against the ``kl`` it is given (0 without),
    which is prefzoo's ``apo-zero-unpaired`` on ρ − kl; or any unpaired loss given as ``loss``: one that estimates
    KTO's reference point itself (``kto``) takes ``kl`` as the mean of its KL rows (or ``kl_policy_logps`` and
    ``kl_ref_logps`` as keywords)."""

    def __init__(self, ignore_index: int = -100, beta: float = 0.1, compiled: bool = True,
                 use_ref_model: bool = False, average_log_prob: bool = False, chunk_size: int = 1, *,
                 loss: str | Loss | None = None) -> None:  # fmt: skip
        super().__init__()
        bound = get_loss("apo-zero-unpaired", beta=beta) if loss is None else loss
        self._setup(_bound(bound, Shape.UNPAIRED, type(self).__name__), ignore_index, use_ref_model, average_log_prob)
        self.kl_shifts_reference = loss is None
        self.beta, self.compiled, self.chunk_size = beta, compiled, chunk_size

    def forward(self, _input: Tensor, lin_weight: Tensor, target: Tensor, bias: Tensor | None = None,
                preference_labels: Tensor | None = None, ref_input: Tensor | None = None,
                ref_weight: Tensor | None = None, ref_bias: Tensor | None = None, kl: Tensor | float | None = None, *,
                kl_policy_logps: Tensor | None = None,
                kl_ref_logps: Tensor | None = None) -> tuple[Tensor, tuple[Tensor, ...]]:  # fmt: skip
        if preference_labels is None:
            raise FusedInputError("preference_labels is required: (R,) bool, True = desirable, one per row of _input")
        point = self._point(kl, _input)
        extras = {"labels": preference_labels, "kl_policy_logps": kl_policy_logps, "kl_ref_logps": kl_ref_logps}
        if point is not None and not self.kl_shifts_reference:
            extras["kl_policy_logps"], extras["kl_ref_logps"] = point, torch.zeros_like(point)
        refs = self._reference(_input.shape[0], _input, ref_input, ref_weight, ref_bias)
        f, _ = self._fields(lin_weight, _input, target, bias, refs, Shape.UNPAIRED, extras)
        if point is not None and self.kl_shifts_reference:
            f["ref_logps"] = f["ref_logps"] + point  # ρ − kl
        out = self.loss_fn(build_batch(Shape.UNPAIRED, 1, f))
        rewards = out.chosen_rewards + (self.beta * point if point is not None and self.kl_shifts_reference else 0)
        up, down = f["labels"], ~f["labels"]
        shown, logits = f["policy_logps"].detach(), logits_sums(lin_weight, bias, _input)
        return out.losses.mean(), tuple(
            (v * m).sum() for v, m in ((shown, up), (shown, down), (logits, up), (logits, down), (rewards, up),
                                       (rewards, down))
        )  # fmt: skip

    def _point(self, kl: Tensor | float | None, like: Tensor) -> Tensor | None:
        """``kl`` as (R,) constants (one number, or one per row), or None."""
        if kl is None:
            return None
        if not self.kl_shifts_reference and Need.KL_REFERENCE not in self.fused.needs:
            raise FusedInputError(f"loss {self.loss_fn.name!r} compares with no reference point: drop kl")
        t = at_least_float32(torch.as_tensor(kl, device=like.device).detach().reshape(-1))
        if t.numel() not in (1, like.shape[0]):
            raise FusedInputError(f"kl must be one number or one per row ({like.shape[0]}), got {t.numel()} values")
        return t.expand(like.shape[0]).clone()
