"""Prompt prefix sharing: one forward per pair over [x, y_w, y_l] in which y_l cannot see y_w.

Row b holds the prompt x (P tokens), the chosen completion y_w (C_w) and the rejected completion y_l (C_l).
Position ids restart y_l at P (so RoPE sees exactly the positions of the plain [x, y_l] row), and a 4-D attention
mask is causal except that y_l queries never attend to y_w keys.  Every hidden state of x and y_w then equals the
plain [x, y_w] row's, and every hidden state of y_l equals the plain [x, y_l] row's: the log-probs are the same
while the prompt is processed once instead of twice.  The first token of y_w and of y_l are both predicted from the
last prompt position.

Layers with a sliding window (``config.layer_types`` / ``config.sliding_window``, :mod:`prefzoo.model.arch`) get
the window applied in the plain row's coordinates (the position ids: y_l restarts at the prompt end), so a y_l query
at plain position q sees prompt and y_l keys k with q − k < window, as in the plain [x, y_l] row.  A decoder that
mixes full and sliding layers receives a {layer type: mask} dict; an architecture whose attention the mask cannot
express (recurrent layers, chunked attention, ALiBi, one mask for mixed layers) is refused with one line.
"""

from __future__ import annotations

from typing import Any, cast

import torch
from torch import Tensor, nn

from prefzoo._thirdparty import attn_implementation
from prefzoo.model.arch import ATTENTION_TYPES, attention_layer_types, shared_prompt_refusal, sliding_window
from prefzoo.model.fast.split import segment_lengths, split_attention, split_plan, split_refusal

__all__ = [
    "SharedPromptError",
    "decoder_masks",
    "shared_position_ids",
    "shared_prompt_mask",
    "shared_prompt_select",
    "shared_select",
    "unshare_rows",
]

PAD, PROMPT, CHOSEN, REJECTED = 0, 1, 2, 3  # segment ids written by PreferenceCollator(share_prompt=True)


class SharedPromptError(ValueError):
    """The model's attention implementation cannot take the custom mask that prompt sharing needs."""


def shared_prompt_mask(segments: Tensor) -> Tensor:
    """(B, 1, T, T) bool, True = may attend: causal, no padding keys, no y_l → y_w; padding queries see themselves."""
    t = segments.shape[1]
    q, k = segments[:, :, None], segments[:, None, :]  # (B, T, 1), (B, 1, T)
    causal = torch.ones(t, t, dtype=torch.bool, device=segments.device).tril()  # (T, T)
    allowed = causal & (k != PAD) & ~((q == REJECTED) & (k == CHOSEN))  # (B, T, T)
    eye = torch.eye(t, dtype=torch.bool, device=segments.device)  # (T, T)
    allowed = allowed | (eye & (q == PAD))  # a padding query keeps one key: no all-masked softmax row (NaN)
    return allowed[:, None]  # (B, 1, T, T)


def windowed(allowed: Tensor, position_ids: Tensor, window: int) -> Tensor:
    """``allowed`` (B, 1, T, T) restricted to keys less than ``window`` plain positions behind the query."""
    q, k = position_ids[:, :, None], position_ids[:, None, :]  # (B, T, 1), (B, 1, T)
    t = allowed.shape[-1]
    eye = torch.eye(t, dtype=torch.bool, device=allowed.device)  # a padding query keeps its own key
    return allowed & ((q - k < window) | eye)[:, None]  # (B, 1, T, T)


def unshare_rows(input_ids: Tensor, segments: Tensor, pad_token_id: int = 0) -> tuple[Tensor, Tensor, Tensor]:
    """The plain layout of a shared-layout batch: (input_ids, attention_mask, completion_mask bool), (2B, T') rows
    [x, y_w] then [x, y_l], right-padded; the inverse of ``PreferenceCollator(share_prompt=True)``."""
    rows, comp = [], []
    for seg_kind in (CHOSEN, REJECTED):
        for ids, seg in zip(input_ids, segments, strict=True):
            keep = (seg == PROMPT) | (seg == seg_kind)
            rows.append(ids[keep])
            comp.append(seg[keep] == seg_kind)
    t = max(len(r) for r in rows)
    n = len(rows)
    out_ids = input_ids.new_full((n, t), pad_token_id)
    attn = torch.zeros(n, t, dtype=torch.long, device=input_ids.device)
    mask = torch.zeros(n, t, dtype=torch.bool, device=input_ids.device)
    for i, (r, c) in enumerate(zip(rows, comp, strict=True)):
        out_ids[i, : len(r)], attn[i, : len(r)], mask[i, : len(r)] = r, 1, c
    return out_ids, attn, mask


def _attention_mask_for(config: Any, allowed: Tensor, dtype: torch.dtype, feature: str = "share_prompt") -> Tensor:
    """The additive (B, 1, T, T) mask every layer of the decoder shares, built once from ``allowed`` (True = attend).

    SDPA would take the boolean mask, but it converts it to this float mask (0 / -inf) inside every call, and each
    layer's autograd then keeps its own copy for backward: one shared copy is the same numbers without the per-layer
    conversions (measured on the UltraFeedback-shaped `simpo` step: peak RSS 1,687 → 1,620 MB).  Eager attention
    adds the mask to the scores; it gets the dtype's minimum, as transformers' own masks do.
    """
    impl = attn_implementation(config, "sdpa") or "sdpa"
    if impl in ("sdpa", "eager"):
        fill = float("-inf") if impl == "sdpa" else torch.finfo(dtype).min
        return torch.zeros(allowed.shape, dtype=dtype, device=allowed.device).masked_fill_(~allowed, fill)
    raise SharedPromptError(
        f"{feature} needs an attention implementation that accepts a 4-D mask (sdpa or eager); this model uses "
        f"{impl!r}: load it with attn_implementation='sdpa' or turn {feature} off"
    )


def layer_masks(
    backbone: nn.Module, config: Any, allowed: Tensor, position_ids: Tensor, feature: str = "share_prompt"
) -> Tensor | dict[str, Tensor]:
    """The boolean mask(s) the decoder takes: one (B, 1, T, T) tensor, or {layer type: tensor} for mixed layers."""
    refusal = shared_prompt_refusal(backbone, config, feature)
    if refusal is not None:
        raise SharedPromptError(refusal)
    types = set(attention_layer_types(config)) & set(ATTENTION_TYPES)
    masks: dict[str, Tensor] = {}
    for kind in types:
        window = sliding_window(config) if kind == "sliding_attention" else None
        masks[kind] = windowed(allowed, position_ids, window) if window is not None else allowed
    return masks.popitem()[1] if len(masks) == 1 else masks


def decoder_masks(
    backbone: nn.Module, config: Any, allowed: Tensor, position_ids: Tensor, feature: str = "share_prompt"
) -> Tensor | dict[str, Tensor]:
    """The additive mask(s) every layer of the decoder shares, from ``allowed`` (B, 1, T, T) (True = attend): one
    tensor, or {layer type: tensor} for mixed layers, in the embeddings' dtype (autocast's when it is on)."""
    dtype = cast(Any, backbone).get_input_embeddings().weight.dtype
    if torch.is_autocast_enabled(allowed.device.type):
        dtype = torch.get_autocast_dtype(allowed.device.type)
    bool_masks = layer_masks(backbone, config, allowed, position_ids, feature)
    if isinstance(bool_masks, dict):
        return {k: _attention_mask_for(config, v, dtype, feature) for k, v in bool_masks.items()}
    return _attention_mask_for(config, bool_masks, dtype, feature)


def shared_prompt_select(
    backbone: nn.Module, config: Any, input_ids: Tensor, segments: Tensor, split: bool = True, **forward_kw: Any
) -> tuple[Any, tuple[Tensor, Tensor, Tensor, Tensor, Tensor]]:
    """Run the backbone on the shared layout; (its output, (h_sel (M, H), targets (M,), row (M,), col (M,),
    lengths (2B,))).

    ``split``: compute the attention in two causal parts where the decoder allows it (:mod:`fastpath_split`;
    the same attention up to rounding, at 1.6–2× less attention work); False: one masked SDPA call per layer.

    ``row`` is the output row (b for y_w of pair b, B + b for its y_l) and ``col`` the token index within that
    completion, the same conventions as the plain (2B, T) layout.
    """
    position_ids = shared_position_ids(segments)  # (B, T)
    allowed = shared_prompt_mask(segments)  # (B, 1, T, T) bool
    split = split and split_refusal(backbone, config) is None
    if split:  # two causal SDPA calls per layer instead of one over the whole masked row (fastpath_split)
        forward_kw = {**forward_kw, "prefzoo_split": split_plan(segments)}
        # only a layer that falls back reads the mask: the boolean one, a quarter of the float one's bytes
        mask: Tensor | dict[str, Tensor] = layer_masks(backbone, config, allowed, position_ids)
    else:
        mask = decoder_masks(backbone, config, allowed, position_ids)
    with split_attention(config, split):
        out = backbone(
            input_ids=input_ids, attention_mask=mask, position_ids=position_ids, use_cache=False, **forward_kw
        )
    return out, shared_select(out.last_hidden_state, input_ids, segments)


def shared_position_ids(segments: Tensor) -> Tensor:
    """(B, T) position ids of the shared layout: y_l restarts at the prompt end (its plain [x, y_l] row's)."""
    b, t = segments.shape
    if bool(((segments == PROMPT).sum(1) < 1).any()):
        raise SharedPromptError("share_prompt: every pair needs at least one prompt token to predict from")
    w_len = (segments == CHOSEN).sum(1)  # (B,)
    pos = torch.arange(t, device=segments.device).expand(b, t)  # (B, T)
    return torch.where(segments == REJECTED, pos - w_len[:, None], pos).masked_fill(segments == PAD, 0)


def shared_select(hidden: Tensor, input_ids: Tensor, segments: Tensor) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:
    """(h_sel (M, H), targets (M,), row (M,), col (M,), lengths (2B,)) of shared-layout hidden states (B, T, H)."""
    b = segments.shape[0]
    p_len, w_len, l_len = segment_lengths(segments)  # (B,) each
    wb, wt = (segments == CHOSEN).nonzero(as_tuple=True)  # (M_w,), row-major: pair by pair, in order
    lb, lt = (segments == REJECTED).nonzero(as_tuple=True)  # (M_l,)
    first_l = lt == p_len[lb] + w_len[lb]  # the first y_l token is predicted from the last prompt position
    pred_l = torch.where(first_l, p_len[lb] - 1, lt - 1)  # (M_l,)
    h_sel = torch.cat([hidden[wb, wt - 1], hidden[lb, pred_l]])  # (M, H)
    targets = torch.cat([input_ids[wb, wt], input_ids[lb, lt]])  # (M,)
    row = torch.cat([wb, lb + b])  # (M,)
    col = torch.cat([wt - p_len[wb], lt - p_len[lb] - w_len[lb]])  # (M,)
    return h_sel, targets, row, col, torch.cat([w_len, l_len])
