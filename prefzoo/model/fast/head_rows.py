"""Per-row summed LM-head log-probs that keep each row's weight gradient instead of the (positions × vocab) softmax.

When only the rows' summed log-probs carry a gradient (no per-token output was asked for: a sequence-level loss),
every position m of row r gets the same upstream gradient g_r = ∂L/∂ log π(y|x)_r.  With q_m = p_m − e_{y_m}
(the softmax minus the target's one-hot, (V,)), log p_{y_m} = z_{y_m} − lse(z_m) and z_m = W h_m:

    ∂L/∂h_m = −g_r · q_m W                 (H,)    kept: G = q W, (M, H)
    ∂L/∂W   = −Σ_r g_r · Σ_{m∈r} q_mᵀ h_m  (V, H)  kept: A_r = Σ_{m∈r} q_mᵀ h_m, one (V, H) per row

The forward computes q chunk by chunk and folds it into G and A_r at once; the backward only scales and sums
them (no GEMM).  That is the same three GEMMs per chunk as :mod:`prefzoo.model.fast.head`'s kept path
(forward z = h Wᵀ; backward q W and qᵀ h), moved into the forward, and what is kept for backward is N·V·H floats
instead of M·V: less whenever rows are longer than the hidden size (UltraFeedback-shaped pairs on a
hidden-192 model: 8 × 49,152 × 192 × 4 B = 288 MB instead of 2,080 × 49,152 × 4 B = 409 MB, and the backward
needs no separate (V, H) weight gradient: it is summed into the first A_r).

:func:`head_row_logps` takes this path only where it keeps fewer bytes than the softmax would and the softmax
would have been kept (it fits ``MAX_KEEP_BYTES``); otherwise it returns None and the caller uses
:func:`prefzoo.model.fast.head.head_logps`.  Plain heads only: no logit transform, no entropy (which is
per-token), a trainable weight (a frozen head already keeps only (M, H) tensors).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from prefzoo.model.arch import LogitTransform
from prefzoo.model.fast.head import (
    HeadOptions,
    _acc,
    _accumulate_grad_w,
    _chunk_buffer,
    _chunk_logp_all,
    _exp_shifted,
    _HeadLogps,
    head_logps,
    row_sums,
)

__all__ = ["head_row_logps", "row_path_bytes", "weight_logps"]

_IDENTITY = LogitTransform()


def row_path_bytes(rows: int, w: Tensor, h: Tensor) -> int:
    """Bytes :func:`head_row_logps` keeps for backward: one float32 (V, H) weight gradient per row."""
    return rows * w.shape[0] * w.shape[1] * torch.empty(0, dtype=_acc(h)).element_size()


def _segments(row: Tensor, n: int) -> list[tuple[int, int, int]] | None:
    """(row, start, end) of each non-empty row's positions, or None unless positions are grouped by row in order."""
    if row.numel() > 1 and not bool((row[1:] >= row[:-1]).all()):
        return None
    counts = torch.bincount(row, minlength=n).tolist()  # (N,) positions per row
    out, start = [], 0
    for r, c in enumerate(counts):
        if c:
            out.append((r, start, start + c))
        start += c
    return out


class _HeadRowLogps(torch.autograd.Function):
    @staticmethod
    def forward(  # type: ignore[override]
        ctx: Any, h: Tensor, w: Tensor, targets: Tensor, row: Tensor, n: int, segs: list[Any], chunk_size: int
    ) -> Tensor:
        m_total, acc = h.shape[0], _acc(h)
        lp = torch.empty(m_total, dtype=acc, device=h.device)  # (M,) log π(y_m)
        lse = torch.empty_like(lp)  # (M,) kept for a second backward (recomputed)
        g_h = h.new_empty(m_total, h.shape[1], dtype=acc) if h.requires_grad else None  # (M, H) G = q W
        sums: list[Tensor | None] = [None] * n  # A_r (V, H) per row
        buf = _chunk_buffer(h, w, chunk_size)  # one (m, V) buffer for every chunk
        for r, start, end in segs:
            for s in range(start, end, chunk_size):
                m = min(chunk_size, end - s)
                h_c, tgt = h[s : s + m], targets[s : s + m]  # (m, H), (m,)
                z = _chunk_logp_all(h_c, w, _IDENTITY, None if buf is None else buf[:m])  # (m, V)
                z_y = z.gather(-1, tgt.unsqueeze(-1)).squeeze(-1)  # (m,)
                lse_c, sum_e = _exp_shifted(z, out=z)  # z now holds e = exp(z − max)
                lse[s : s + m], lp[s : s + m] = lse_c, z_y - lse_c
                q = z.div_(sum_e.unsqueeze(-1))  # (m, V) p
                q.scatter_add_(-1, tgt.unsqueeze(-1), torch.full_like(z_y, -1.0).unsqueeze(-1))  # p − e_y
                q = q.to(w.dtype)
                if g_h is not None:
                    g_h[s : s + m] = q @ w  # (m, H)
                if sums[r] is None:
                    sums[r] = (q.t() @ h_c).to(acc)  # (V, H): no zero-filled start
                else:
                    _accumulate_grad_w(sums[r], q, h_c)  # (V, H) += qᵀ h_c
        ctx.save_for_backward(h, w, targets, row, lse)
        ctx.g_h, ctx.sums, ctx.chunk_size = g_h, sums, chunk_size
        return row_sums(lp, row, n)  # (N,) as sequence_logps sums

    @staticmethod
    def backward(ctx: Any, g_rows: Tensor) -> tuple[Any, ...]:  # type: ignore[override]
        h, w, targets, row, lse = ctx.saved_tensors
        sums, ctx.sums = ctx.sums, None  # consumed in place below; a second backward recomputes
        if sums is None:
            return _HeadRowLogps._recompute(ctx, h, w, targets, lse, g_rows[row])
        neg_g = -g_rows.to(lse.dtype)  # (N,)
        grad_h = (ctx.g_h * neg_g[row].unsqueeze(-1)).to(h.dtype) if ctx.g_h is not None else None  # (M, H)
        grad_w = None
        for r, a in enumerate(sums):
            if a is None:
                continue
            sums[r] = None  # freed as it is summed
            grad_w = a.mul_(neg_g[r]) if grad_w is None else grad_w.addcmul_(a, neg_g[r])  # (V, H)
        if grad_w is None:
            grad_w = torch.zeros(w.shape, dtype=lse.dtype, device=w.device)
        return grad_h, grad_w.to(w.dtype), None, None, None, None, None

    @staticmethod
    def _recompute(ctx: Any, h: Tensor, w: Tensor, targets: Tensor, lse: Tensor, g_tok: Tensor) -> tuple[Any, ...]:
        """The per-token head's recompute backward with g_m = g_{row(m)} (after the kept sums were consumed)."""
        ctx.kept = ctx.inv_s = None
        ctx.transform = _IDENTITY
        grads = _HeadLogps._recompute_backward(ctx, h, w, targets, lse, torch.zeros_like(lse), g_tok, None)
        return grads[0], grads[1], None, None, None, None, None


def head_row_logps(
    h: Tensor, w: Tensor, targets: Tensor, row: Tensor, n: int, opts: HeadOptions = HeadOptions()
) -> Tensor | None:
    """(N,) Σ_{m∈r} log π(target_m) per row for hidden states h (M, H) under head weight w (V, H), or None where
    this path does not apply (see the module docstring; the caller then scores per token).

    ``row`` (M,) is each position's row in 0..n−1, positions grouped by row in row order (as
    :func:`prefzoo.model.logps.sequence_logps` selects them).
    """
    softmax_bytes = h.shape[0] * w.shape[0] * torch.empty(0, dtype=_acc(h)).element_size()
    if not (torch.is_grad_enabled() and w.requires_grad and opts.transform.identity):
        return None
    if h.shape[0] == 0 or not opts.keeps(softmax_bytes):
        return None
    segs = _segments(row, n)
    if segs is None or row_path_bytes(len(segs), w, h) >= softmax_bytes:
        return None
    return _HeadRowLogps.apply(h, w, targets, row, n, segs, opts.chunk(w.shape[0]))


def weight_logps(
    h: Tensor, w: Tensor, targets: Tensor, row: Tensor, n: int, per_token: bool, want_entropy: bool, opts: HeadOptions
) -> tuple[Tensor, Tensor | None, Tensor | None]:
    """(log-probs (N,) summed per row, token log-probs (M,) or None, token entropies (M,) or None) of M positions
    h (M, H) under head weight w (V, H): the fused head of the trainer's log-probs, for a weight instead of a module.

    Without per-token outputs (``per_token`` False) the rows are scored by :func:`head_row_logps` where it applies
    (the token tensors are then None), else per token by :func:`prefzoo.model.fast.head.head_logps`.
    ``opts.keep_bytes``: the most either may keep for backward instead of recomputing (default ``MAX_KEEP_BYTES``;
    0: always recompute, the least memory).
    """
    if not per_token:
        logps = head_row_logps(h, w, targets, row, n, opts)
        if logps is not None:
            return logps, None, None
    tok_lp, tok_ent = head_logps(h, w, targets, want_entropy, opts)
    return row_sums(tok_lp, row, n), tok_lp, tok_ent
