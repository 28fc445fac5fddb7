"""Padding-free packing: a micro-batch's sequences laid end to end in fewer rows, so no FLOP goes to padding.

The collated rows (plain (N, T) rows [x, y], or the shared-prompt layout's (B, T) rows [x, y_w, y_l]) are packed
first-fit-decreasing into rows of the batch's longest sequence (T_pack = max length): every sequence stays whole in
one packed row, so attention costs at most what the padded batch cost and the MLP, norms and projections see only
real tokens.  Position ids restart at 0 for each sequence (the shared layout's y_l restarts at its prompt end, as in
:mod:`prefzoo.model.fast.prompt`), and a 4-D mask is causal and block-diagonal: a token sees only earlier tokens
of its own sequence (and, in a shared row, y_l never sees y_w).  Sliding-window layers get the window in each
sequence's own positions.  The decoder's hidden states are then put back in the collated layout, so head, logit
transform, token-level outputs and shared-prompt selection are the unpacked path's own code: the log-probs are equal
to it within float tolerance.

Under SDPA, wherever the shared-prompt split of :mod:`prefzoo.model.fast.split` can run (no sliding window,
soft-cap or chunked attention, a decoder that passes keywords down, no gradient checkpointing: :func:`split_segments`),
every sequence goes end to end into **one** row with no padding at all, and the attention runs as the split over the
collated rows gathered from that row: causal parts with ``is_causal`` instead of a block-diagonal mask of the packed
row's T² entries, whose every block SDPA would compute.  A layer that falls back to transformers' SDPA (a decoder
that drops the keyword) reads the one-row block mask, so the result never depends on the split being taken.

Transformers' own packed-sequence detection (restarted position ids, no mask) builds the same block-causal mask for
SDPA/eager, but it cannot express the shared layout's y_l → y_w block; the explicit mask serves both.  An
architecture whose attention a 4-D mask cannot express is refused with one line (:func:`packing_refusal`).

Flash attention (``flash_attention_2``/``_3``/``_4`` or a hub flash-attn kernel: :func:`varlen_attention`) takes no
4-D mask; there the sequences go end to end into **one** row with no padding at all, and the decoder gets their
boundaries as ``cu_seq_lens_q``/``cu_seq_lens_k`` and ``max_length_q``/``max_length_k``: transformers hands them to
``flash_attn_varlen_func``, which keeps each sequence causal and applies sliding windows and soft-capping within
it (no mask of T² entries is built).  A sequence boundary cannot say "y_l sees x but not y_w", so the shared-prompt
layout is refused there with one line (:func:`varlen_shared_refusal`); plain rows pack.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor, nn

from prefzoo._thirdparty import attn_implementation
from prefzoo.model.arch import shared_prompt_refusal, varlen_attention
from prefzoo.model.fast.prompt import (
    CHOSEN,
    PAD,
    PROMPT,
    REJECTED,
    SharedPromptError,
    decoder_masks,
    layer_masks,
    shared_position_ids,
)
from prefzoo.model.fast.split import flat_layout, split_attention, split_plan, split_refusal

__all__ = [
    "PackedRows",
    "PackingError",
    "one_row_mask",
    "pack_rows",
    "packed_forward",
    "packing_refusal",
    "packing_takes_split",
    "split_segments",
    "varlen_shared_refusal",
]


class PackingError(SharedPromptError):
    """The model's attention cannot be given the block-diagonal mask that packing needs."""


def packing_refusal(backbone: nn.Module, config: Any) -> str | None:
    """Why packing cannot reproduce this model's attention (one line), or None when it can."""
    return shared_prompt_refusal(backbone, config, "packing")


def varlen_shared_refusal(config: Any) -> str:
    """The one-line refusal of the shared-prompt layout under a flash-attention kernel."""
    impl = attn_implementation(config)
    return (
        f"share_prompt: {impl} attention separates packed sequences by their boundaries only and cannot keep the "
        f"rejected completion from seeing the chosen one: turn share_prompt off (packing still works) or load the "
        f"model with attn_implementation='sdpa'"
    )


class PackedRows:
    """Where each collated token went: ``src_row``/``src_col`` (K,) → ``dst_row``/``dst_col`` (K,), K real tokens.

    ``input_ids``, ``position_ids``, ``doc`` (sequence index + 1, 0 = padding) and ``kind`` (segment kind of the
    shared layout, else 1) are (R, T_pack) packed rows, R ≤ N.
    """

    def __init__(
        self, input_ids: Tensor, valid: Tensor, position_ids: Tensor, kind: Tensor, one_row: bool = False
    ) -> None:
        n, t = valid.shape
        lengths = valid.sum(1)  # (N,) real tokens per collated row
        t_pack = max(int(lengths.sum() if one_row else lengths.max()), 1) if n else 1  # one_row: flash varlen
        bins: list[int] = []  # tokens used per packed row
        dst = [0] * n
        offset = [0] * n
        for r in sorted(range(n), key=lambda i: (-int(lengths[i]), i)):  # first-fit decreasing
            need = int(lengths[r])
            k = next((j for j, used in enumerate(bins) if used + need <= t_pack), len(bins))
            if k == len(bins):
                bins.append(0)
            dst[r], offset[r] = k, bins[k]
            bins[k] += need
        dev = input_ids.device
        self.src_row, self.src_col = valid.nonzero(as_tuple=True)  # (K,), row-major
        rank = (torch.cumsum(valid.long(), dim=1) - 1)[self.src_row, self.src_col]  # (K,) index among real tokens
        self.dst_row = torch.tensor(dst, dtype=torch.long, device=dev)[self.src_row]  # (K,)
        self.dst_col = torch.tensor(offset, dtype=torch.long, device=dev)[self.src_row] + rank  # (K,)
        shape = (len(bins), t_pack)
        self.shape = (n, t)
        self.input_ids = input_ids.new_zeros(shape)
        self.input_ids[self.dst_row, self.dst_col] = input_ids[self.src_row, self.src_col]
        self.position_ids = position_ids.new_zeros(shape)
        self.position_ids[self.dst_row, self.dst_col] = position_ids[self.src_row, self.src_col]
        self.doc = torch.zeros(shape, dtype=torch.long, device=dev)
        self.doc[self.dst_row, self.dst_col] = self.src_row + 1
        self.kind = torch.zeros(shape, dtype=torch.long, device=dev)
        self.kind[self.dst_row, self.dst_col] = kind[self.src_row, self.src_col].long()

    @property
    def rows(self) -> int:
        return int(self.input_ids.shape[0])

    def mask(self) -> Tensor:
        """(R, 1, T, T) bool, True = may attend: causal within one sequence, no y_l → y_w, no padding keys."""
        t = self.doc.shape[1]
        dq, dk = self.doc[:, :, None], self.doc[:, None, :]  # (R, T, 1), (R, 1, T)
        kq, kk = self.kind[:, :, None], self.kind[:, None, :]
        causal = torch.ones(t, t, dtype=torch.bool, device=self.doc.device).tril()  # (T, T)
        allowed = causal & (dq == dk) & (dk != 0) & ~((kq == REJECTED) & (kk == CHOSEN))  # (R, T, T)
        eye = torch.eye(t, dtype=torch.bool, device=self.doc.device)
        allowed = allowed | (eye & (dq == 0))  # a padding query keeps its own key: no all-masked softmax row
        return allowed[:, None]

    def flat_positions(self) -> Tensor:
        """(N, T) each collated real token's column in a one-row packing (0 at padding): the flat row's inverse."""
        flat_of = torch.zeros(self.shape, dtype=torch.long, device=self.doc.device)
        flat_of[self.src_row, self.src_col] = self.dst_col
        return flat_of

    def varlen_kwargs(self) -> dict[str, Any]:
        """Sequence boundaries of a one-row packing as transformers' flash path takes them (``cu_seq_lens_q``/``_k``
        int32 (S + 1,), ``max_length_q``/``_k``)."""
        if self.rows != 1 or bool((self.doc == 0).any()):
            raise PackingError("packing: sequence boundaries need every sequence in one row without padding")
        doc = self.doc[0]  # (K,)
        starts = torch.ones_like(doc, dtype=torch.bool)
        starts[1:] = doc[1:] != doc[:-1]
        cu = torch.cat([starts.nonzero().flatten(), doc.new_tensor([doc.numel()])]).to(torch.int32)  # (S + 1,)
        longest = int((cu[1:] - cu[:-1]).max())
        return {"cu_seq_lens_q": cu, "cu_seq_lens_k": cu, "max_length_q": longest, "max_length_k": longest}

    def unpack(self, packed: Tensor) -> Tensor:
        """(R, T_pack, ...) packed states → (N, T, ...) in the collated layout, zeros at padding (differentiable)."""
        out = packed.new_zeros(*self.shape, *packed.shape[2:])
        return out.index_put((self.src_row, self.src_col), packed[self.dst_row, self.dst_col])


def pack_rows(
    input_ids: Tensor, attention_mask: Tensor, completion_mask: Tensor, shared: bool, one_row: bool = False
) -> PackedRows:
    """Pack collated rows: plain rows by ``attention_mask``, shared-layout rows by their segment ids; ``one_row``
    puts every sequence in a single row (the flash varlen layout)."""
    if shared:
        valid = completion_mask != PAD  # (B, T)
        return PackedRows(input_ids, valid, shared_position_ids(completion_mask), completion_mask, one_row)
    valid = attention_mask.bool()  # (N, T)
    position_ids = (torch.cumsum(valid.long(), dim=1) - 1).clamp(min=0)  # (N, T) restart per row
    return PackedRows(input_ids, valid, position_ids, valid.long(), one_row)


def packing_takes_split(backbone: nn.Module, config: Any) -> bool:
    """Packed rows run as one padding-free row with the split attention (see :func:`split_segments`)."""
    return not varlen_attention(config) and split_refusal(backbone, config) is None


def split_segments(
    backbone: nn.Module, config: Any, attention_mask: Tensor, completion_mask: Tensor, shared: bool
) -> Tensor | None:
    """The collated rows' segment ids when their packing can run as one padding-free row with the split attention
    of :mod:`prefzoo.model.fast.split` (SDPA, no sliding window or soft-cap, a decoder that passes keywords
    down), else None: the packed rows keep their block-diagonal mask."""
    if not packing_takes_split(backbone, config):
        return None
    if shared:
        return completion_mask
    valid = attention_mask.bool()  # (N, T): plain rows [x, y], right-padded (part 1 of the split: causal from 0)
    lengths = valid.sum(1, keepdim=True)  # (N, 1)
    if not bool((valid == (torch.arange(valid.shape[1], device=valid.device)[None] < lengths)).all()):
        return None
    return valid.long() * PROMPT  # every real token a "prompt" token: no y_l, part 1 only


def packed_forward(
    backbone: nn.Module, config: Any, packed: PackedRows, segments: Tensor | None = None, **forward_kw: Any
) -> tuple[Any, Tensor]:
    """Run the decoder on packed rows; (its output, last hidden state back in the collated layout (N, T, H)).

    ``segments`` (from :func:`split_segments`, with a one-row ``packed``): the attention runs as the split on the
    collated rows gathered from the flat row; layers that cannot take it read the block-diagonal mask."""
    if segments is not None:
        return _split_forward(backbone, config, packed, segments, **forward_kw)
    if varlen_attention(config):  # one row: the flash kernel gets the sequence boundaries instead of a mask
        refusal = packing_refusal(backbone, config)
        if refusal is None and bool((packed.kind == REJECTED).any()):
            refusal = varlen_shared_refusal(config)
        if refusal is not None:
            raise PackingError(refusal)
        mask, extra = None, packed.varlen_kwargs()
    else:
        mask, extra = _packed_masks(backbone, config, packed), {}
    out = backbone(
        input_ids=packed.input_ids, attention_mask=mask, position_ids=packed.position_ids, use_cache=False,
        **extra, **forward_kw,
    )  # fmt: skip
    return out, packed.unpack(out.last_hidden_state)


def _split_forward(
    backbone: nn.Module, config: Any, packed: PackedRows, segments: Tensor, **forward_kw: Any
) -> tuple[Any, Tensor]:
    """:func:`packed_forward` on one padding-free row with the split attention gathered from it."""
    if packed.rows != 1:
        raise PackingError("packing: the split attention needs every sequence in one row")
    plan = split_plan(segments)
    flat_of = packed.flat_positions()
    plan.flat = flat_layout(plan, segments, flat_of, int(packed.input_ids.shape[1]))
    try:  # only a layer that falls back reads the mask: the boolean one
        mask = layer_masks(backbone, config, one_row_mask(segments, flat_of), packed.position_ids, "packing")
    except SharedPromptError as e:
        raise PackingError(str(e)) from None
    with split_attention(config):
        out = backbone(
            input_ids=packed.input_ids, attention_mask=mask, position_ids=packed.position_ids, use_cache=False,
            prefzoo_split=plan, **forward_kw,
        )  # fmt: skip
    return out, packed.unpack(out.last_hidden_state)


def one_row_mask(segments: Tensor, flat_of: Tensor) -> Tensor:
    """:meth:`PackedRows.mask` of a one-row packing, built block by block: (1, 1, N, N) bool.

    Each collated row's real tokens are one contiguous block of the flat row (``flat_of`` (B, T): each token's flat
    position), so the mask is block-diagonal with each row's own causal mask (y_l not seeing y_w) on the diagonal:
    Σ L_b² comparisons instead of the N² of the generic mask (measured ~2% of a LoRA step on Orca-shaped rows)."""
    lengths = (segments != PAD).sum(1).tolist()  # (B,) real tokens per collated row, a prefix of each
    n = int(sum(lengths))
    out = torch.zeros(n, n, dtype=torch.bool, device=segments.device)
    for r, length in enumerate(lengths):
        seg, start = segments[r, :length], int(flat_of[r, 0])
        block = torch.ones(length, length, dtype=torch.bool, device=segments.device).tril_()
        block &= ~((seg[:, None] == REJECTED) & (seg[None, :] == CHOSEN))
        out[start : start + length, start : start + length] = block
    return out[None, None]


def _packed_masks(backbone: nn.Module, config: Any, packed: PackedRows) -> Any:
    """The additive block-diagonal mask (or {layer type: mask}) that every layer of the decoder shares."""
    try:
        return decoder_masks(backbone, config, packed.mask(), packed.position_ids, "packing")
    except SharedPromptError as e:
        raise PackingError(str(e)) from None
