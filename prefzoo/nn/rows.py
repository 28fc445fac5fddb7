"""The rows of a fused call: its arguments checked, and the positions that are scored (target ≠ ``ignore_index``).

``_input`` (R, T, H) holds one completion per row; ``target`` (R, T) the token each position predicts (already
shifted, as Liger takes it), ``ignore_index`` where nothing is scored (prompt, padding).  Only the scored positions
reach the LM head, in row order, so the per-token tensors a loss may need are laid out as the trainer lays them out:
(R, T_c), a row's scored tokens first, T_c the longest row's count.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

__all__ = ["FusedInputError", "Positions", "check_head", "check_rows", "positions"]


class FusedInputError(ValueError):
    """An argument of a fused call with the wrong shape, dtype or layout; the message names the argument."""


def _shape(t: Tensor) -> tuple[int, ...]:
    return tuple(t.shape)


def check_head(lin_weight: Tensor, bias: Tensor | None, name: str = "lin_weight", bias_name: str = "bias") -> None:
    """``lin_weight`` is (V, H) floating point and ``bias`` None or (V,), else a one-line :class:`FusedInputError`."""
    if not isinstance(lin_weight, Tensor) or lin_weight.ndim != 2 or not lin_weight.is_floating_point():
        got: object = _shape(lin_weight) if isinstance(lin_weight, Tensor) else type(lin_weight).__name__
        raise FusedInputError(f"{name} must be a floating-point (V, H) LM-head weight, got {got}")
    if bias is not None and (not isinstance(bias, Tensor) or _shape(bias) != (lin_weight.shape[0],)):
        got = _shape(bias) if isinstance(bias, Tensor) else type(bias).__name__
        raise FusedInputError(f"{bias_name} must have shape (V,) = ({lin_weight.shape[0]},) like {name}, got {got}")


def check_rows(
    lin_weight: Tensor, _input: Tensor, target: Tensor, name: str = "_input", weight_name: str = "lin_weight"
) -> None:
    """``_input`` (R, T, H) with H = the weight's, ``target`` (R, T) integer, else a one-line error naming one."""
    if not isinstance(_input, Tensor) or _input.ndim != 3 or not _input.is_floating_point():
        got: object = _shape(_input) if isinstance(_input, Tensor) else type(_input).__name__
        raise FusedInputError(f"{name} must be floating-point hidden states of shape (R, T, H), got {got}")
    if _input.shape[-1] != lin_weight.shape[1]:
        raise FusedInputError(
            f"{name} has hidden size {_input.shape[-1]} but {weight_name} is {_shape(lin_weight)}: H must agree"
        )
    if not isinstance(target, Tensor) or target.is_floating_point() or target.dtype == torch.bool:
        got = str(target.dtype) if isinstance(target, Tensor) else type(target).__name__
        raise FusedInputError(f"target must be an integer tensor of token ids (R, T), got {got}")
    if _shape(target) != _shape(_input)[:2]:
        raise FusedInputError(f"target must have shape (R, T) = {_shape(_input)[:2]} like {name}, got {_shape(target)}")


@dataclass(frozen=True)
class Positions:
    """The scored positions of R rows, grouped by row in row order (M of them)."""

    row: Tensor  # (M,) the row of each scored position
    t: Tensor  # (M,) its position in the row, 0..T-1
    col: Tensor  # (M,) its index among the row's scored positions, 0..lengths[row]-1
    targets: Tensor  # (M,) the token it predicts
    lengths: Tensor  # (R,) scored positions per row: |y|
    n_rows: int  # R
    seq_len: int  # T

    @property
    def width(self) -> int:
        """T_c: the longest row's scored positions (at least 1), the width of the per-token grid."""
        return max(int(self.lengths.max()), 1) if self.n_rows else 1

    def select(self, x: Tensor) -> Tensor:
        """(M, ...) the scored positions of ``x`` (R, T, ...); differentiable in ``x``."""
        return x.reshape(self.n_rows * self.seq_len, *x.shape[2:]).index_select(0, self.row * self.seq_len + self.t)

    def grid(self, values: Tensor) -> Tensor:
        """(R, T_c) of per-position ``values`` (M,), zero elsewhere; differentiable in ``values``."""
        return values.new_zeros(self.n_rows, self.width).index_put((self.row, self.col), values)

    def mask(self) -> Tensor:
        """(R, T_c) bool, True on the scored tokens."""
        return self.grid(torch.ones_like(self.row, dtype=torch.bool))


def positions(target: Tensor, ignore_index: int, vocab: int) -> Positions:
    """The positions of ``target`` (R, T) that are scored; a target outside [0, V) is a one-line error."""
    keep = target != ignore_index  # (R, T)
    row, t = torch.nonzero(keep, as_tuple=True)  # (M,) each, row-major: grouped by row in order
    tokens = target[row, t]  # (M,)
    if tokens.numel() and bool(((tokens < 0) | (tokens >= vocab)).any()):
        bad = int(tokens[(tokens < 0) | (tokens >= vocab)][0])
        raise FusedInputError(
            f"target holds token id {bad}, outside the vocabulary [0, {vocab}) of lin_weight and not ignore_index "
            f"({ignore_index})"
        )
    col = (keep.cumsum(1) - 1)[row, t]  # (M,)
    lengths = keep.sum(1)  # (R,)
    return Positions(row, t, col, tokens, lengths, int(target.shape[0]), int(target.shape[1]))
