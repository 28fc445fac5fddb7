"""The default prompt embedding of BCO's density-ratio classifier: mean-pooled last hidden states of a model.

TRL's BCOTrainer takes any ``embedding_func(input_ids, attention_mask) -> (N, D)``; its example pools an embedding
model's token states over the attention mask.  prefzoo's default pools the reference model's (or the policy's) last
hidden states over the prompt tokens, so no second model is loaded.  Any callable of the same signature plugs in.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor

__all__ = ["PromptEmbedding", "mean_pooled_hidden_states"]

PromptEmbedding = Callable[[Tensor, Tensor], Tensor]  # (input_ids (N, T), attention_mask (N, T)) -> (N, D)


def mean_pooled_hidden_states(lm: Any) -> PromptEmbedding:
    """``embed(input_ids, attention_mask)``: Σ_t m_t·h_t / max(Σ_t m_t, 1e-9) over the last hidden states h (no grad),
    the mean pooling of TRL's BCO example; pass a mask of the prompt tokens only to embed the prompt of a row."""

    @torch.no_grad()
    def embed(input_ids: Tensor, attention_mask: Tensor) -> Tensor:
        out = lm(input_ids=input_ids, attention_mask=attention_mask, output_hidden_states=True)
        h = out.hidden_states[-1].float()  # (N, T, D)
        m = attention_mask.to(h.dtype).unsqueeze(-1)  # (N, T, 1)
        return (h * m).sum(1) / m.sum(1).clamp(min=1e-9)  # (N, D)

    return embed
