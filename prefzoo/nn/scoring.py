"""Log-probs of the scored positions under an LM-head weight: the trainer's fused head, for hidden states given.

The policy's go through :func:`prefzoo.model.weight_logps` (summed per row where no per-token output is needed, so
no (positions × vocab) tensor is kept for backward); the reference's are computed without gradient, or taken as
given.  A bias is folded into the weight: h·Wᵀ + b = [h, 1]·[W, b]ᵀ, exactly, with gradients for both.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from prefzoo.model import HeadOptions, token_log_sq_probs, weight_logps
from prefzoo.nn.rows import FusedInputError, Positions
from prefzoo.types import Need

__all__ = ["PolicyScores", "at_least_float32", "given_reference", "policy_scores", "reference_scores"]


@dataclass(frozen=True)
class PolicyScores:
    """The policy's log-probs of R rows: per row, and per scored position where the loss needs them."""

    logps: Tensor  # (R,) Σ_t log π(y_t | x, y_<t), differentiable
    token_logps: Tensor | None = None  # (M,) log π(y_t | ...), differentiable
    token_entropies: Tensor | None = None  # (M,) H(π(·| ...)), differentiable
    token_log_sq_probs: Tensor | None = None  # (M,) log Σ_v π(v | ...)², constant


def _fold_bias(h: Tensor, w: Tensor, bias: Tensor | None) -> tuple[Tensor, Tensor]:
    """(h, w) with the bias as one more hidden unit: h (M, H+1) = [h, 1], w (V, H+1) = [W, b]."""
    if bias is None:
        return h, w
    h = torch.cat((h, h.new_ones(h.shape[0], 1)), dim=1)  # (M, H+1)
    return h, torch.cat((w, bias.to(w.dtype).unsqueeze(1)), dim=1)  # (V, H+1)


def policy_scores(
    lin_weight: Tensor,
    bias: Tensor | None,
    _input: Tensor,
    pos: Positions,
    opts: HeadOptions,
    needs: frozenset[Need] = frozenset(),
) -> PolicyScores:
    """The policy's :class:`PolicyScores` of the scored positions of ``_input`` (R, T, H), gradients included; the
    per-position ones where ``needs`` asks for them (``TOKEN_LOGPS``, ``TOKEN_ENTROPIES``, ``TOKEN_SQUARED_PROBS``)."""
    h, w = _fold_bias(pos.select(_input), lin_weight, bias)  # (M, H), (V, H)
    token_logps, token_entropies = Need.TOKEN_LOGPS in needs, Need.TOKEN_ENTROPIES in needs
    per_token = token_logps or token_entropies
    logps, tok_lp, tok_ent = weight_logps(h, w, pos.targets, pos.row, pos.n_rows, per_token, token_entropies, opts)
    sq = None
    if Need.TOKEN_SQUARED_PROBS in needs:
        w_const = w.detach()
        sq = token_log_sq_probs(lambda a: a @ w_const.t(), h.detach(), opts)  # (M,)
    return PolicyScores(logps, tok_lp if token_logps else None, tok_ent, sq)


def at_least_float32(t: Tensor) -> Tensor:
    """``t`` in float32, or in its own dtype when that is wider (float64 inputs are computed in float64)."""
    return t.to(torch.promote_types(t.dtype, torch.float32))


def given_reference(pos: Positions, ref_logps: Tensor) -> tuple[Tensor, Tensor | None]:
    """(log π_ref per row (R,), per scored position (M,) or None), constants, from ``ref_logps`` given per row (R,)
    or per position (R, T, aligned with ``target``; only then is a per-position reference available)."""
    ref_logps = ref_logps.detach()
    if tuple(ref_logps.shape) == (pos.n_rows,):
        return at_least_float32(ref_logps), None
    if tuple(ref_logps.shape) != (pos.n_rows, pos.seq_len):
        raise FusedInputError(
            f"ref_logps must have shape (R,) = ({pos.n_rows},) per row or (R, T) = ({pos.n_rows}, {pos.seq_len}) "
            f"per position like target, got {tuple(ref_logps.shape)}"
        )
    tok = at_least_float32(ref_logps[pos.row, pos.t])  # (M,)
    return torch.zeros(pos.n_rows, dtype=tok.dtype, device=tok.device).index_add(0, pos.row, tok), tok


def reference_scores(
    pos: Positions, opts: HeadOptions, ref_input: Tensor, ref_weight: Tensor, ref_bias: Tensor | None
) -> tuple[Tensor, Tensor | None]:
    """(log π_ref per row (R,), per scored position (M,)), constants, from the reference's hidden states
    ``ref_input`` (R, T, H_ref) under ``ref_weight`` and ``ref_bias``."""
    with torch.no_grad():
        h, w = _fold_bias(pos.select(ref_input), ref_weight, ref_bias)
        logps, ref_tok, _ = weight_logps(h, w, pos.targets, pos.row, pos.n_rows, True, False, opts)
    return at_least_float32(logps), (at_least_float32(ref_tok) if ref_tok is not None else None)
