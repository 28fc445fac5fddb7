"""Completion-position LM head + float32 log-softmax that keeps no (positions × vocab) tensor alive for backward.

``head_logps(h, W, targets)`` returns log π(target) (and optionally the entropy) of M selected positions.  The
autograd path of :mod:`prefzoo.model.logps` saves every chunk's (m, V) float32 log-softmax for backward (M·V·4 bytes,
~400 MB for 2,000 completion tokens of a 49k vocabulary) plus the temporaries of two backward kernels.  This
Function saves only h (M, H), the log-normalizer (M,) and, when the head is frozen, two (M, H) tensors:

- trainable head (full fine-tuning): backward recomputes each chunk's logits z = h W^T and uses
  ∂ log p_y / ∂z = e_y − p, ∂H / ∂z = −p ⊙ (log p + H), so one (m, V) buffer exists at a time.  When the float32
  chunks of all M positions fit in ``MAX_KEEP_BYTES`` (512 MiB) the forward keeps them instead and the backward skips
  the recomputation (one GEMM per chunk, ~9% of a DPO step measured) and works in place, without allocations.
  Without entropy or a logit transform the kept chunk is e = exp(z − max) with 1 / Σe per position (the softmax is
  e / Σe, log p_y = z_y − lse): one exp pass in all, none in backward; otherwise it is log p;
- frozen head (LoRA): the forward already holds p, so it stores E = p W and F = (p ⊙ (log p + H)) W (each (M, H));
  backward is then grad_h = g_lp · (W[y] − E) − g_H · F with no recomputation at all.

The model's logit transform (:class:`prefzoo.model.arch.LogitTransform`: a scale s and a tanh soft-cap c,
z = c · tanh(s · a / c) for a = h Wᵀ) is applied to every chunk; backward multiplies ∂/∂z by
dz/da = s · (1 − (z/c)²), and the frozen-head form stores E = (d ⊙ p) W, F = (d ⊙ p ⊙ (log p + H)) W and d_y.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, NamedTuple

import torch
from torch import Tensor, nn

from prefzoo.model.arch import FirstRows, LogitTransform

__all__ = ["MAX_CHUNK_ELEMENTS", "MAX_KEEP_BYTES", "HeadOptions", "fusable_head", "head_logps", "row_sums"]

MAX_CHUNK_ELEMENTS = 1 << 24  # at most 16M logits (64 MB float32) per chunk: 341 positions of a 49k vocabulary
MAX_KEEP_BYTES = 512 << 20  # trainable head: keep the float32 log p for backward when it fits here, else recompute


@dataclass(frozen=True)
class HeadOptions:
    """How the LM head scores selected positions: its chunking, the model's logit transform, what it may keep."""

    chunk_size: int = 1024  # positions per (chunk, V) block of logits (bounded by MAX_CHUNK_ELEMENTS // V)
    transform: LogitTransform = field(default_factory=LogitTransform)  # the model's logit transform; default none
    keep_bytes: int | None = None  # the most kept for backward instead of recomputed: None MAX_KEEP_BYTES, 0 nothing

    def chunk(self, vocab: int) -> int:
        """Positions per chunk for a vocabulary of ``vocab``: ``chunk_size``, bounding the (m, V) temporaries."""
        return max(1, min(self.chunk_size, MAX_CHUNK_ELEMENTS // vocab))

    def keeps(self, nbytes: int) -> bool:
        """Whether ``nbytes`` kept for backward fit the budget (``keep_bytes``, default ``MAX_KEEP_BYTES``)."""
        return nbytes <= (MAX_KEEP_BYTES if self.keep_bytes is None else self.keep_bytes)


def fusable_head(head: nn.Module) -> bool:
    """A plain bias-free ``nn.Linear`` with its full weight present (not a LoRA layer, not a partitioned shard), or
    the first rows of one (:class:`~prefzoo.model.arch.FirstRows`: ``head.weight`` is then those rows)."""
    inner = head.head if type(head) is FirstRows else head
    return (
        type(inner) is nn.Linear
        and inner.bias is None
        and not hasattr(inner.weight, "ds_id")
        and inner.weight.dim() == 2
        and head.weight.numel() > 0
    )


def row_sums(tok: Tensor, row: Tensor, n: int) -> Tensor:
    """(N,) Σ over each row's positions of per-position values ``tok`` (M,), ``row`` (M,) their rows in 0..n−1.

    Accumulated in float64 (M additions, nothing of vocabulary size): ``index_add`` adds a row's values one after
    another, and in float32 a sum of hundreds of log-probs of −5 to −10 each loses the last digits that a loss on
    differences of summed log-probs (a policy and a reference, SPPO's squared margin) multiplies by its gradient.
    """
    acc = torch.float32 if tok.device.type == "mps" else torch.promote_types(tok.dtype, torch.float64)  # MPS: no f64
    return torch.zeros(n, dtype=acc, device=tok.device).index_add(0, row, tok.to(acc)).to(tok.dtype)


def _acc(t: Tensor) -> torch.dtype:
    """float32, or float64 for float64 inputs (the log-softmax never runs below float32)."""
    return torch.promote_types(t.dtype, torch.float32)


def _chunk_logp_all(h_c: Tensor, w: Tensor, transform: LogitTransform, out: Tensor | None = None) -> Tensor:
    """(m, V) the model's logits of h_c in float32 (into ``out`` when given: no fresh buffer faulted in)."""
    if out is not None:
        z = torch.mm(h_c, w.t(), out=out)
    else:
        z = (h_c @ w.t()).to(_acc(h_c))  # (m, V) float32 head outputs
    return z if transform.identity else transform.apply_(z)  # (m, V) the model's logits


def _chunk_buffer(h: Tensor, w: Tensor, chunk_size: int) -> Tensor | None:
    """One (chunk, V) buffer that every chunk's logits are written into, or None where the GEMM cannot write into
    it (under autocast the GEMM's dtype is autocast's; mixed dtypes need a cast): no fresh pages per chunk."""
    if h.dtype != _acc(h) or w.dtype != h.dtype or torch.is_autocast_enabled(h.device.type):
        return None
    return h.new_empty(min(chunk_size, h.shape[0]), w.shape[0])


def _exp_shifted(z: Tensor, out: Tensor) -> tuple[Tensor, Tensor]:
    """(lse (m,), s (m,)) of logits z (m, V), leaving e = exp(z − max) in ``out`` (which may be z itself).

    torch.logsumexp would do the same passes but into a fresh (m, V) temporary, and keep no e: e / s is the
    softmax p, which the backward and the frozen-head sums need, so one exp pass serves both.
    """
    mx = z.amax(-1, keepdim=True)  # (m, 1)
    mx = mx.masked_fill_(~torch.isfinite(mx), 0.0)  # an all −∞ (or +∞) row: no nan from −∞ − (−∞), as logsumexp
    e = torch.sub(z, mx, out=out).exp_()  # (m, V) exp(z − max) ∈ [0, 1]
    s = e.sum(-1)  # (m,)
    return s.log() + mx.squeeze(-1), s


def _accumulate_grad_w(grad_w: Tensor, grad_z: Tensor, h_c: Tensor) -> None:
    """grad_w (V, H) += grad_zᵀ h_c: in the GEMM itself (no (V, H) temporary, no extra pass) when the dtypes agree."""
    if grad_z.dtype == h_c.dtype == grad_w.dtype:
        grad_w.addmm_(grad_z.t(), h_c)  # 1 thread, 49k vocabulary, 6 chunks of 341: 774 → 614 ms a step
    else:
        grad_w += (grad_z.t() @ h_c).to(grad_w.dtype)  # (V, H)


def _chunk_input_grads(
    grad_z: Tensor, w: Tensor, h_c: Tensor, grad_h: Tensor | None, grad_w: Tensor | None, s: int
) -> None:
    """From one chunk's G = ∂/∂z (m, V): grad_h[s : s + m] = G w and grad_w += Gᵀ h_c, each where it is wanted."""
    grad_z = grad_z.to(w.dtype)
    if grad_h is not None:
        grad_h[s : s + h_c.shape[0]] = (grad_z @ w).to(h_c.dtype)  # (m, H)
    if grad_w is not None:
        _accumulate_grad_w(grad_w, grad_z, h_c)


class _HeadLogps(torch.autograd.Function):
    @staticmethod
    def forward(  # type: ignore[override]
        ctx: Any,
        h: Tensor,
        w: Tensor,
        targets: Tensor,
        chunk_size: int,
        want_entropy: bool,
        keep: bool,
        transform: LogitTransform,
    ) -> tuple[Tensor, Tensor]:
        m_total = h.shape[0]
        lp = torch.empty(m_total, dtype=_acc(h), device=h.device)  # (M,)
        lse = torch.empty_like(lp)  # (M,)
        ent = torch.zeros_like(lp)  # (M,) stays 0 unless asked for
        frozen = not w.requires_grad
        need_h = h.requires_grad
        e_sum = h.new_zeros(m_total, h.shape[1], dtype=_acc(h)) if frozen and need_h else None  # (M, H)
        f_sum = h.new_zeros(m_total, h.shape[1], dtype=_acc(h)) if frozen and need_h and want_entropy else None
        kept: list[Tensor] | None = [] if keep and not frozen else None  # chunks for backward (no recompute)
        d_y = torch.ones_like(lp) if e_sum is not None and not transform.identity else None  # (M,) dz_y/da_y
        # Without entropy or a logit transform nothing needs log p over the vocabulary: the chunk's logits become
        # e = exp(z − max) in place, log p(y) = z_y − lse, and the backward's softmax is e / s (kept: e and 1 / s).
        plain = not want_entropy and transform.identity
        inv_s = torch.empty_like(lp) if plain and kept is not None else None  # (M,) 1 / Σ e per position
        buf = _chunk_buffer(h, w, chunk_size) if kept is None else None  # one (m, V) buffer for every chunk
        scratch = h.new_empty(min(chunk_size, m_total), w.shape[0], dtype=_acc(h)) if not plain else None
        for s in range(0, m_total, chunk_size):
            m = min(chunk_size, m_total - s)
            z = _chunk_logp_all(h[s : s + m], w, transform, None if buf is None else buf[:m])  # (m, V)
            tgt = targets[s : s + m]  # (m,)
            z_y = z.gather(-1, tgt.unsqueeze(-1)).squeeze(-1)  # (m,)
            if plain:
                lse_c, sum_e = _exp_shifted(z, out=z)  # z now holds e (m, V)
                lse[s : s + m] = lse_c
                lp[s : s + m] = z_y - lse_c
                if inv_s is not None and kept is not None:
                    inv_s[s : s + m] = sum_e.reciprocal()
                    kept.append(z)  # e: the backward's softmax is e / s
                if e_sum is not None:
                    e_sum[s : s + m] = z.div_(sum_e.unsqueeze(-1)).to(w.dtype) @ w  # (m, H) E = p W
                continue
            assert scratch is not None
            out = _Rows(lp, lse, ent, d_y, e_sum, f_sum, kept)
            _general_chunk(z, z_y, tgt, w, transform, want_entropy, scratch[:m], out, slice(s, s + m))
        ctx.save_for_backward(h, w, targets, lse, ent, *(t for t in (e_sum, f_sum, d_y) if t is not None))
        ctx.chunk_size, ctx.want_entropy, ctx.transform = chunk_size, want_entropy, transform
        dev = h.device.type
        ctx.autocast = (dev, torch.is_autocast_enabled(dev), torch.get_autocast_dtype(dev))
        ctx.has_e, ctx.has_f, ctx.has_d = e_sum is not None, f_sum is not None, d_y is not None
        ctx.kept, ctx.inv_s = kept, inv_s
        if not want_entropy:
            ctx.mark_non_differentiable(ent)
        return lp, ent

    @staticmethod
    def backward(ctx: Any, g_lp: Tensor | None, g_ent: Tensor | None) -> tuple[Any, ...]:  # type: ignore[override]
        h, w, targets, lse, ent, *rest = ctx.saved_tensors
        g_lp = g_lp if g_lp is not None else torch.zeros_like(lse)  # (M,)
        use_ent = ctx.want_entropy and g_ent is not None
        if ctx.has_e and not ctx.needs_input_grad[1]:  # frozen head: closed form from the stored E, F
            e_sum = rest[0]
            w_y = w[targets].to(_acc(h))  # (M, H)
            if ctx.has_d:
                w_y = w_y * rest[-1].unsqueeze(-1)  # d_y W[y]
            grad_h = g_lp.unsqueeze(-1) * (w_y - e_sum)  # (M, H)
            if g_ent is not None and use_ent and ctx.has_f:
                grad_h = grad_h - g_ent.unsqueeze(-1) * rest[1]  # (M, H)
            return grad_h.to(h.dtype), None, None, None, None, None, None
        dev, enabled, dtype = ctx.autocast
        with torch.autocast(device_type=dev, dtype=dtype, enabled=enabled):  # recompute as the forward computed
            return _HeadLogps._recompute_backward(ctx, h, w, targets, lse, ent, g_lp, g_ent if use_ent else None)

    @staticmethod
    def _recompute_backward(
        ctx: Any, h: Tensor, w: Tensor, targets: Tensor, lse: Tensor, ent: Tensor, g_lp: Tensor, g_ent: Tensor | None
    ) -> tuple[Any, ...]:
        need_h, need_w = ctx.needs_input_grad[0], ctx.needs_input_grad[1]
        m_total = h.shape[0]
        grad_h = torch.empty_like(h) if need_h else None  # (M, H)
        grad_w = torch.zeros(w.shape, dtype=_acc(h), device=w.device) if need_w else None  # (V, H)
        cs, transform = ctx.chunk_size, ctx.transform
        kept, ctx.kept = ctx.kept, None  # consumed in place below; a second backward recomputes
        inv_s, ctx.inv_s = ctx.inv_s, None
        buf = _chunk_buffer(h, w, cs) if kept is None else None  # every use of a recomputed chunk ends in its iteration
        for k, s in enumerate(range(0, m_total, cs)):
            h_c, tgt = h[s : s + cs], targets[s : s + cs]  # (m, H), (m,)
            g = g_lp[s : s + cs]  # (m,)
            if kept is not None and inv_s is not None:  # e = exp(z − max) kept: −g p = e · (−g / s), in place
                e, kept[k] = kept[k], None
                grad_z = e.mul_((-g * inv_s[s : s + cs]).unsqueeze(-1))  # (m, V)
                grad_z.scatter_add_(-1, tgt.unsqueeze(-1), g.unsqueeze(-1))  # + g e_y
                _chunk_input_grads(grad_z, w, h_c, grad_h, grad_w, s)
                continue
            if kept is not None:
                logp_all, kept[k] = kept[k], None  # (m, V) log p kept by the forward
            else:
                out = None if buf is None else buf[: h_c.shape[0]]
                logp_all = _chunk_logp_all(h_c, w, transform, out).sub_(lse[s : s + cs].unsqueeze(-1))  # (m, V)
            d = None if transform.identity else transform.derivative_(logp_all + lse[s : s + cs].unsqueeze(-1))
            if g_ent is not None:
                p = logp_all.exp()  # (m, V)
                # ∂H/∂z = −p ⊙ (log p + H);  G = g_lp (e_y − p) + g_H ∂H/∂z
                grad_z = logp_all.add_(ent[s : s + cs].unsqueeze(-1)).mul_(p).mul_(-g_ent[s : s + cs].unsqueeze(-1))
                grad_z.sub_(p.mul_(g.unsqueeze(-1)))  # (m, V)
            else:
                grad_z = logp_all.exp_().mul_(-g.unsqueeze(-1))  # (m, V) −g p
            grad_z.scatter_add_(-1, tgt.unsqueeze(-1), g.unsqueeze(-1))  # + g e_y
            if d is not None:
                grad_z.mul_(d)  # ∂/∂a = ∂/∂z ⊙ dz/da
            _chunk_input_grads(grad_z, w, h_c, grad_h, grad_w, s)
        return grad_h, (grad_w.to(w.dtype) if grad_w is not None else None), None, None, None, None, None


def head_logps(
    h: Tensor, w: Tensor, targets: Tensor, want_entropy: bool, opts: HeadOptions = HeadOptions()
) -> tuple[Tensor, Tensor | None]:
    """(log π(target) (M,), entropy (M,) or None) for hidden states h (M, H) under LM-head weight w (V, H).

    ``opts.transform`` is the model's logit transform (default: none), applied to h Wᵀ before the log-softmax.
    """
    if h.shape[0] == 0:
        empty = h.new_zeros(0, dtype=_acc(h))
        return empty, (empty if want_entropy else None)
    keep = torch.is_grad_enabled() and opts.keeps(h.shape[0] * w.shape[0] * 4)  # small: keep log p, skip recompute
    lp, ent = _HeadLogps.apply(h, w, targets, opts.chunk(w.shape[0]), want_entropy, keep, opts.transform)
    return lp, (ent if want_entropy else None)


class _Rows(NamedTuple):
    """The forward's per-position outputs, written a chunk at a time (None: not asked for)."""

    lp: Tensor  # (M,) log p(y)
    lse: Tensor  # (M,)
    ent: Tensor  # (M,)
    d_y: Tensor | None  # (M,) dz_y/da_y of the logit transform
    e_sum: Tensor | None  # (M, H) E = (d ⊙) p W, frozen head
    f_sum: Tensor | None  # (M, H) F = (p ⊙ (log p + H)) W, frozen head with entropy
    kept: list[Tensor] | None  # chunks of log p kept for backward


def _general_chunk(
    z: Tensor,
    z_y: Tensor,
    tgt: Tensor,
    w: Tensor,
    transform: LogitTransform,
    want_entropy: bool,
    scratch: Tensor,
    out: _Rows,
    rows: slice,
) -> None:
    """One chunk's log p over the vocabulary (entropy or a logit transform): ``z`` (m, V) logits, overwritten with
    log p; ``scratch`` (m, V) holds e = exp(z − max), then the softmax."""
    lse_c, sum_e = _exp_shifted(z, out=scratch)  # scratch holds e (m, V)
    out.lse[rows] = lse_c
    out.lp[rows] = z_y - lse_c
    logp_all = z.sub_(lse_c.unsqueeze(-1))  # (m, V) in place: log p
    if out.kept is not None:
        out.kept.append(logp_all)  # not modified below: the in-place entropy product is frozen-head only
    if not (want_entropy or out.e_sum is not None):
        return
    p = scratch.div_(sum_e.unsqueeze(-1))  # (m, V) the softmax, from the one exp pass
    if want_entropy:
        ent_c = -(p * logp_all).sum(-1)  # (m,)
        out.ent[rows] = ent_c
    if out.d_y is not None:  # p ← d ⊙ p, d = dz/da: the transform's factor enters E and F through p
        d = transform.derivative_(logp_all + lse_c.unsqueeze(-1))  # (m, V)
        out.d_y[rows] = d.gather(-1, tgt.unsqueeze(-1)).squeeze(-1)
        p = p.mul_(d) if not want_entropy else p * d
    if out.e_sum is not None:
        out.e_sum[rows] = p.to(w.dtype) @ w  # (m, H) E = (d ⊙) p W
    if out.f_sum is not None:
        q = logp_all.add_(ent_c.unsqueeze(-1)).mul_(p)  # (m, V) p ⊙ (log p + H)
        out.f_sum[rows] = q.to(w.dtype) @ w  # (m, H)
