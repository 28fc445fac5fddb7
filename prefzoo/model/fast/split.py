"""Shared-prompt attention in two causal parts, so the kernel skips the blocks the [x, y_w, y_l] mask hides.

With the mask of :mod:`prefzoo.model.fast.prompt` every query of a (B, T) shared row is scored against every key:
SDPA's CPU flash kernel (and the GPU ones) skip blocks only for ``is_causal``, never for a custom mask, so the
hidden y_w → y_l and y_l → y_w blocks and the causal upper triangle cost as much as the visible ones.  This module
computes the same attention as two SDPA calls per layer:

1. the rows' first L₁ = max_b(|x_b| + |y_w,b|) positions with ``is_causal=True`` and no mask: right-padded rows
   start at position 0, so every x and y_w query of row b sees exactly its own x, y_w prefix (the y_l and padding
   queries that fall inside L₁ for shorter rows are computed and then replaced);
2. the y_l queries of each row, gathered into (B, max|y_l|), against their keys gathered as [x, y_l] (B, max(|x| +
   |y_l|)), with the causal mask shifted by |x_b|: query t of y_l sees the prompt and y_l up to t.

Attention work falls from T² per row (T = max(|x| + |y_w| + |y_l|)) to about L₁²/2 + |y_l|·(|x| + |y_l|): 1.6–2×
on UltraFeedback- and Orca-shaped pairs.  The result is the masked attention's up to the order of the softmax sums
(float rounding, tested against the masked path and the plain rows).

**Padding-free rows** (:mod:`prefzoo.model.fast.packing`, one row): the decoder runs on every sequence laid end to end,
so its projections, MLPs and norms see only real tokens, and :func:`flat_layout` tells the attention function where
each collated row's tokens are in that row.  The two parts above then run on the collated (B, ·) layout gathered from
the flat row (``index_select`` of q, k, v: padding slots point at token 0 and are never read back), and the outputs
are put back in flat order.  On CPU (``ROW_BY_ROW_DEVICES``) each collated row is one block of the flat row, so the
two parts run row by row on slices of it instead (:func:`_rows_split`): no row is padded to the longest, which on
Orca-shaped batches is 17–25% of part 1's work and 35–45% of part 2's.  Plain rows [x, y] (a plan without y_l) take
part 1 only.

The split runs through a registered transformers attention function (``prefzoo_split_sdpa``) that the decoder's
layers look up by ``config._attn_implementation`` while :func:`split_attention` holds it; the layout reaches it as
the ``prefzoo_split`` keyword, which transformers' decoders pass down to their attention.  Without that keyword
(another caller, a decoder that drops the keyword) and for any attention feature the split does not reproduce (a
sliding window, a soft-cap, a position bias, attention sinks), it calls transformers' own SDPA function with the
4-D mask, so the result never depends on the split being taken.  Gradient checkpointing turns the split off: its
recomputation runs after the implementation is restored.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor
from torch.nn import functional as F

from prefzoo._thirdparty import attn_implementation, using_attn_implementation
from prefzoo.types import SEGMENT_CHOSEN, SEGMENT_PAD, SEGMENT_PROMPT, SEGMENT_REJECTED

__all__ = [
    "IMPLEMENTATION",
    "FlatLayout",
    "SplitPlan",
    "flat_layout",
    "split_attention",
    "split_plan",
    "split_refusal",
    "split_sdpa_forward",
]

IMPLEMENTATION = "prefzoo_split_sdpa"
PAD, PROMPT, CHOSEN, REJECTED = (  # segment ids, as PreferenceCollator(share_prompt=True) writes them
    SEGMENT_PAD,
    SEGMENT_PROMPT,
    SEGMENT_CHOSEN,
    SEGMENT_REJECTED,
)
_FEATURES = ("softcap", "position_bias", "s_aux", "sinks")  # attention features the split does not reproduce
# devices where a flat row's split runs row by row (:func:`_rows_split`): a CPU kernel call costs microseconds, so
# B calls per part beat one call padded to the longest row; on a GPU one batched launch stays (fewer, fuller kernels)
ROW_BY_ROW_DEVICES = ("cpu",)


@dataclass
class FlatLayout:
    """Where the (B, T) collated layout's tokens sit in one padding-free row of N tokens (:func:`flat_layout`)."""

    n: int  # N, the flat row's length
    p1: Tensor  # (B·L₁,) flat position of each part-1 slot (row b, column t < L₁); 0 at padding
    q: Tensor  # (B·C_l,) flat position of each y_l query slot; 0 at padding
    kv: Tensor  # (B·K,) flat position of each [x, y_l] key slot; 0 at padding
    out: Tensor  # (N,) for each flat position, its slot in cat(part 1 (B·L₁), part 2 (B·C_l))
    # (start, |x| + |y_w|, |x|, |y_l|) of each collated row's block of the flat row, in flat order, when the blocks
    # tile it: the split then runs row by row on slices, with no padding (on CPU, see ROW_BY_ROW_DEVICES)
    rows: tuple[tuple[int, int, int, int], ...] | None = None
    _masks: dict[tuple[int, torch.dtype], Tensor] = field(default_factory=dict)

    def rejected_mask(self, i: int, dtype: torch.dtype) -> Tensor:
        """Row ``i``'s part-2 mask (|y_l|, |x| + |y_l|), additive in ``dtype``: y_l query t sees keys j ≤ |x| + t."""
        if (i, dtype) not in self._masks:
            _, _, p, c = self.rows[i]  # type: ignore[index]
            j = torch.arange(p + c, device=self.out.device)
            hidden = j[None] > p + torch.arange(c, device=self.out.device)[:, None]  # (C, P + C)
            self._masks[i, dtype] = torch.zeros(hidden.shape, dtype=dtype, device=hidden.device).masked_fill_(
                hidden, float("-inf")
            )
        return self._masks[i, dtype]


@dataclass
class SplitPlan:
    """Where each row's parts are in a (B, T) shared layout, built once per forward and read by every layer."""

    t: int  # T, the row length
    l1: int  # L₁ = max_b(|x_b| + |y_w,b|): the causal part
    q_idx: Tensor  # (B, C_l) row positions of y_l (0 past a row's |y_l|)
    kv_idx: Tensor  # (B, K) row positions of [x, y_l] (0 past a row's |x| + |y_l|)
    allowed: Tensor  # (B, 1, C_l, K) bool: y_l query t sees keys j ≤ |x| + t; a padding query sees key 0 only
    is_l: Tensor  # (B, T) bool: the row's y_l positions
    src: Tensor  # (B, T) index into C_l of each y_l position (0 elsewhere)
    has_l: bool = True  # any y_l at all (plain rows [x, y] have none: part 1 only)
    flat: FlatLayout | None = None  # set when the decoder runs on one padding-free row (flat_layout)
    calls: int = 0  # layers that took the split (tests read it)
    _masks: dict[torch.dtype, Tensor] = field(default_factory=dict)

    def additive(self, dtype: torch.dtype) -> Tensor:
        """The part-2 mask as SDPA's additive float mask in ``dtype``, one copy shared by every layer."""
        if dtype not in self._masks:
            zeros = torch.zeros(self.allowed.shape, dtype=dtype, device=self.allowed.device)
            self._masks[dtype] = zeros.masked_fill_(~self.allowed, float("-inf"))
        return self._masks[dtype]


def segment_lengths(segments: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """(|x|, |y_w|, |y_l|), (B,) each, of a (B, T) segment-id tensor of the shared layout."""
    return (segments == PROMPT).sum(1), (segments == CHOSEN).sum(1), (segments == REJECTED).sum(1)


def split_plan(segments: Tensor) -> SplitPlan:
    """The plan for a (B, T) segment-id tensor of the shared layout (every row: x, then y_w, then y_l, then padding)."""
    t = segments.shape[1]
    dev = segments.device
    p_len, w_len, l_len = segment_lengths(segments)  # (B,) each
    c_l = max(int(l_len.max()), 1)
    k_len = max(int((p_len + l_len).max()), 1)
    t_q = torch.arange(c_l, device=dev)  # (C_l,)
    q_valid = t_q[None] < l_len[:, None]  # (B, C_l)
    q_idx = torch.where(q_valid, (p_len + w_len)[:, None] + t_q[None], 0)  # (B, C_l)
    j = torch.arange(k_len, device=dev)  # (K,)
    kv_idx = torch.where(j[None] < p_len[:, None], j[None], j[None] + w_len[:, None])  # (B, K): x, then y_l
    kv_idx = torch.where(j[None] < (p_len + l_len)[:, None], kv_idx, 0)
    allowed = j[None, None] <= (p_len[:, None] + t_q[None])[:, :, None]  # (B, C_l, K)
    allowed = torch.where(q_valid[:, :, None], allowed, j[None, None] == 0)  # padding queries: key 0, no NaN row
    pos = torch.arange(t, device=dev)  # (T,)
    is_l = segments == REJECTED  # (B, T)
    src = torch.where(is_l, pos[None] - (p_len + w_len)[:, None], 0)  # (B, T)
    l1 = max(int((p_len + w_len).max()), 1)
    return SplitPlan(t, l1, q_idx, kv_idx, allowed[:, None], is_l, src, has_l=bool((l_len > 0).any()))


def flat_layout(plan: SplitPlan, segments: Tensor, flat_of: Tensor, n: int) -> FlatLayout:
    """The plan's slots in one flat row: ``flat_of`` (B, T) is each collated real token's flat position (any value at
    padding), ``segments`` the collated segment ids the plan was made from, ``n`` the flat row's length."""
    b, t = segments.shape
    valid = segments != PAD  # (B, T)
    flat_of = flat_of.masked_fill(~valid, 0)  # padding slots read token 0 (finite, never read back)
    c_l = plan.q_idx.shape[1]
    rows = torch.arange(b, device=segments.device)[:, None]  # (B, 1)
    cols = torch.arange(t, device=segments.device)[None]  # (1, T)
    slot = torch.where(plan.is_l, b * plan.l1 + rows * c_l + plan.src, rows * plan.l1 + cols)  # (B, T)
    out = torch.zeros(n, dtype=torch.long, device=segments.device)
    out[flat_of[valid]] = slot[valid]
    p1 = F.pad(flat_of, (0, max(plan.l1 - t, 0)))[:, : plan.l1]  # (B, L₁)
    return FlatLayout(n, p1.reshape(-1), flat_of.gather(1, plan.q_idx).reshape(-1),
                      flat_of.gather(1, plan.kv_idx).reshape(-1), out, _row_blocks(segments, flat_of, n))  # fmt: skip


def _row_blocks(segments: Tensor, flat_of: Tensor, n: int) -> tuple[tuple[int, int, int, int], ...] | None:
    """(start, |x| + |y_w|, |x|, |y_l|) per collated row in flat order, or None unless each row's real tokens are one
    block of the flat row in their collated order and the blocks tile it exactly."""
    lengths = (segments != PAD).sum(1)  # (B,)
    cols = torch.arange(segments.shape[1], device=segments.device)[None]  # (1, T)
    starts = flat_of[:, 0]  # (B,)
    real = cols < lengths[:, None]  # (B, T): real tokens are each row's prefix
    if not bool(((segments != PAD) == real).all()) or not bool((flat_of == starts[:, None] + cols)[real].all()):
        return None
    p_len, w_len, l_len = ((segments == kind).sum(1) for kind in (PROMPT, CHOSEN, REJECTED))
    rows = sorted(zip(starts.tolist(), (p_len + w_len).tolist(), p_len.tolist(), l_len.tolist(), strict=True))
    ends = [start + l1 + c for start, l1, _, c in rows]
    if [start for start, *_ in rows] != [0, *ends[:-1]] or (ends[-1] if ends else 0) != n:
        return None
    return tuple(rows)


def split_refusal(backbone: Any, config: Any) -> str | None:
    """Why this decoder's shared forward cannot take the split (one line), or None when it can."""
    from prefzoo.model.arch import attention_layer_types, text_config

    impl = attn_implementation(config)
    if impl != "sdpa":
        return f"attention implementation {impl!r}, not 'sdpa'"
    if getattr(backbone, "gradient_checkpointing", False):
        return "gradient checkpointing recomputes the layers outside the split"
    if "sliding_attention" in attention_layer_types(config):  # (a window switched off, as Qwen2's, is no refusal)
        return "sliding-window layers"
    if any(getattr(text_config(config), k, None) for k in ("attn_logit_softcapping", "attention_chunk_size")):
        return "soft-capped or chunked attention"
    cls: Any = type(backbone)  # (typed Any: mypy does not take type[Any] as Hashable for the cache)
    return _keyword_refusal(cls)


@functools.cache
def _keyword_refusal(cls: Any) -> str | None:
    """Whether a decoder class's forward takes ``**kwargs`` to pass down (read once per class, not per forward)."""
    try:
        params = inspect.signature(cls.forward).parameters.values()
    except (TypeError, ValueError):
        return "the decoder's forward has no signature"
    if not any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params):
        return "the decoder's forward takes no keywords to pass to its attention"
    return None


def _gather(x: Tensor, idx: Tensor) -> Tensor:
    """x (B, H, T, D) at row positions idx (B, N) → (B, H, N, D)."""
    return x.gather(2, idx[:, None, :, None].expand(x.shape[0], x.shape[1], idx.shape[1], x.shape[3]))


def split_sdpa_forward(
    module: torch.nn.Module,
    query: Tensor,
    key: Tensor,
    value: Tensor,
    attention_mask: Tensor | None,
    dropout: float = 0.0,
    scaling: float | None = None,
    **kwargs: Any,
) -> tuple[Tensor, None]:
    """transformers' attention-function contract: (B, H, T, D) q, k, v → ((B, T, H, D) output, None)."""
    from transformers.integrations.sdpa_attention import repeat_kv, sdpa_attention_forward

    plan: SplitPlan | None = kwargs.pop("prefzoo_split", None)
    unusual = any(kwargs.get(k) is not None for k in _FEATURES) or kwargs.get("sliding_window") is not None
    if plan is None or unusual or kwargs.get("output_attentions") or not _fits(plan, query, key):
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout, scaling, **kwargs)
    groups = getattr(module, "num_key_value_groups", 1)
    if groups > 1:
        key, value = repeat_kv(key, groups), repeat_kv(value, groups)
    if plan.flat is not None:
        if plan.flat.rows is not None and query.device.type in ROW_BY_ROW_DEVICES:
            return _rows_split(plan, plan.flat, query, key, value, dropout, scaling), None
        return _flat_split(plan, plan.flat, query, key, value, dropout, scaling), None
    l1 = plan.l1
    o1 = F.scaled_dot_product_attention(  # (B, H, L₁, D): every x and y_w query, causal
        query[:, :, :l1], key[:, :, :l1], value[:, :, :l1], dropout_p=dropout, scale=scaling, is_causal=True
    )
    q_l, k_l, v_l = _gather(query, plan.q_idx), _gather(key, plan.kv_idx), _gather(value, plan.kv_idx)
    o2 = F.scaled_dot_product_attention(  # (B, H, C_l, D): y_l queries against [x, y_l]
        q_l, k_l, v_l, attn_mask=plan.additive(query.dtype), dropout_p=dropout, scale=scaling
    )
    o1 = F.pad(o1, (0, 0, 0, plan.t - l1))  # (B, H, T, D): zeros past L₁, replaced or padding
    out = torch.where(plan.is_l[:, None, :, None], _gather(o2, plan.src), o1)  # (B, H, T, D)
    plan.calls += 1
    return out.transpose(1, 2).contiguous(), None


def _fits(plan: SplitPlan, query: Tensor, key: Tensor) -> bool:
    """q and k have the plan's layout: (B, ·, T, ·) collated rows, or (1, ·, N, ·) for a flat plan."""
    if plan.flat is None:
        return query.shape[2] == plan.t and key.shape[2] == plan.t
    return query.shape[0] == 1 and query.shape[2] == plan.flat.n and key.shape[2] == plan.flat.n


def _flat_split(
    plan: SplitPlan, flat: FlatLayout, query: Tensor, key: Tensor, value: Tensor, dropout: float, scaling: float | None
) -> Tensor:
    """The split on one flat row: (1, H, N, D) q, k, v → (1, N, H, D), each part gathered into the collated rows."""
    b = plan.q_idx.shape[0]
    q, k, v = (x[0].transpose(0, 1) for x in (query, key, value))  # (N, H, D) views

    def rows_of(x: Tensor, idx: Tensor) -> Tensor:  # (N, H, D) at B·L flat positions → (B, H, L, D)
        return x.index_select(0, idx).view(b, -1, *x.shape[1:]).transpose(1, 2)

    o1 = F.scaled_dot_product_attention(  # (B, H, L₁, D): every x and y_w query, causal
        rows_of(q, flat.p1), rows_of(k, flat.p1), rows_of(v, flat.p1), dropout_p=dropout, scale=scaling,
        is_causal=True,
    )  # fmt: skip
    parts = [o1.transpose(1, 2).reshape(-1, *q.shape[1:])]  # (B·L₁, H, D)
    if plan.has_l:
        o2 = F.scaled_dot_product_attention(  # (B, H, C_l, D): y_l queries against [x, y_l]
            rows_of(q, flat.q), rows_of(k, flat.kv), rows_of(v, flat.kv), attn_mask=plan.additive(query.dtype),
            dropout_p=dropout, scale=scaling,
        )  # fmt: skip
        parts.append(o2.transpose(1, 2).reshape(-1, *q.shape[1:]))  # (B·C_l, H, D)
    plan.calls += 1
    return torch.cat(parts).index_select(0, flat.out)[None]  # (1, N, H, D)


def _rows_split(
    plan: SplitPlan, flat: FlatLayout, query: Tensor, key: Tensor, value: Tensor, dropout: float, scaling: float | None
) -> Tensor:
    """The split on one flat row, row by row: (1, H, N, D) q, k, v → (1, N, H, D).

    Each row's [x, y_w] is a causal SDPA on its own slice and its y_l queries attend to its own [x, y_l]: no row is
    padded to the batch's longest, where the gathered :func:`_flat_split` computes L₁² and C_l·K per row (17–25% of
    part 1 and 35–45% of part 2 on Orca-shaped batches)."""
    outs: list[Tensor] = []
    for i, (start, l1, p, c) in enumerate(flat.rows or ()):
        one = slice(start, start + l1)
        outs.append(F.scaled_dot_product_attention(  # (1, H, L₁_b, D): the row's x and y_w queries, causal
            query[:, :, one], key[:, :, one], value[:, :, one], dropout_p=dropout, scale=scaling, is_causal=True,
        ))  # fmt: skip
        if c:
            rej = slice(start + l1, start + l1 + c)
            k2 = torch.cat((key[:, :, start : start + p], key[:, :, rej]), 2)  # (1, H, |x| + |y_l|, D)
            v2 = torch.cat((value[:, :, start : start + p], value[:, :, rej]), 2)
            outs.append(F.scaled_dot_product_attention(  # (1, H, |y_l|, D): y_l queries against [x, y_l]
                query[:, :, rej], k2, v2, attn_mask=flat.rejected_mask(i, query.dtype), dropout_p=dropout,
                scale=scaling,
            ))  # fmt: skip
    plan.calls += 1
    return torch.cat(outs, 2).transpose(1, 2).contiguous()  # (1, N, H, D)


def _register() -> None:
    """(Re)register the attention function under :data:`IMPLEMENTATION` (a dict entry: cheap on every forward)."""
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask
    from transformers.modeling_utils import AttentionInterface

    AttentionInterface.register(IMPLEMENTATION, split_sdpa_forward)
    AttentionMaskInterface.register(IMPLEMENTATION, sdpa_mask)


@contextmanager
def split_attention(config: Any, on: bool = True) -> Iterator[None]:
    """While held (and ``on``), the decoder's layers look up :func:`split_sdpa_forward`; restored on exit."""
    if not on:
        yield
        return
    _register()
    with using_attn_implementation(config, IMPLEMENTATION):
        yield
