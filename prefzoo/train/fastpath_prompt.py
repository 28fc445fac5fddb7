"""Prompt prefix sharing: one forward per pair over [x, y_w, y_l] in which y_l cannot see y_w.

Row b holds the prompt x (P tokens), the chosen completion y_w (C_w) and the rejected completion y_l (C_l).
Position ids restart y_l at P (so RoPE sees exactly the positions of the plain [x, y_l] row), and a 4-D attention
mask is causal except that y_l queries never attend to y_w keys.  Every hidden state of x and y_w then equals the
plain [x, y_w] row's, and every hidden state of y_l equals the plain [x, y_l] row's: the log-probs are the same
while the prompt is processed once instead of twice.  The first token of y_w and of y_l are both predicted from the
last prompt position.
"""

from __future__ import annotations

from typing import Any, cast

import torch
from torch import Tensor, nn

__all__ = ["SharedPromptError", "shared_prompt_mask", "shared_prompt_select"]

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


def _attention_mask_for(config: Any, allowed: Tensor, dtype: torch.dtype) -> Tensor:
    impl = getattr(config, "_attn_implementation", "sdpa") or "sdpa"
    if impl == "sdpa":
        return allowed  # SDPA takes a boolean mask (True = attend)
    if impl == "eager":
        return torch.zeros(allowed.shape, dtype=dtype, device=allowed.device).masked_fill(
            ~allowed, torch.finfo(dtype).min
        )  # (B, 1, T, T) additive
    raise SharedPromptError(
        f"share_prompt needs an attention implementation that accepts a 4-D mask (sdpa or eager); this model uses "
        f"{impl!r}: load it with attn_implementation='sdpa' or turn share_prompt off"
    )


def shared_prompt_select(
    backbone: nn.Module, config: Any, input_ids: Tensor, segments: Tensor
) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:
    """Run the backbone on the shared layout; (h_sel (M, H), targets (M,), row (M,), col (M,), lengths (2B,)).

    ``row`` is the output row (b for y_w of pair b, B + b for its y_l) and ``col`` the token index within that
    completion, the same conventions as the plain (2B, T) layout.
    """
    b, t = segments.shape
    p_len = (segments == PROMPT).sum(1)  # (B,)
    w_len = (segments == CHOSEN).sum(1)  # (B,)
    l_len = (segments == REJECTED).sum(1)  # (B,)
    if bool((p_len < 1).any()):
        raise SharedPromptError("share_prompt: every pair needs at least one prompt token to predict from")
    pos = torch.arange(t, device=segments.device).expand(b, t)  # (B, T)
    position_ids = torch.where(segments == REJECTED, pos - w_len[:, None], pos).masked_fill(segments == PAD, 0)
    embed_dtype = cast(Any, backbone).get_input_embeddings().weight.dtype
    if torch.is_autocast_enabled(input_ids.device.type):
        embed_dtype = torch.get_autocast_dtype(input_ids.device.type)
    mask = _attention_mask_for(config, shared_prompt_mask(segments), embed_dtype)
    hidden = backbone(
        input_ids=input_ids, attention_mask=mask, position_ids=position_ids, use_cache=False
    ).last_hidden_state  # (B, T, H)
    wb, wt = (segments == CHOSEN).nonzero(as_tuple=True)  # (M_w,), row-major: pair by pair, in order
    lb, lt = (segments == REJECTED).nonzero(as_tuple=True)  # (M_l,)
    first_l = lt == p_len[lb] + w_len[lb]  # the first y_l token is predicted from the last prompt position
    pred_l = torch.where(first_l, p_len[lb] - 1, lt - 1)  # (M_l,)
    h_sel = torch.cat([hidden[wb, wt - 1], hidden[lb, pred_l]])  # (M, H)
    targets = torch.cat([input_ids[wb, wt], input_ids[lb, lt]])  # (M,)
    row = torch.cat([wb, lb + b])  # (M,)
    col = torch.cat([wt - p_len[wb], lt - p_len[lb] - w_len[lb]])  # (M,)
    return h_sel, targets, row, col, torch.cat([w_len, l_len])
