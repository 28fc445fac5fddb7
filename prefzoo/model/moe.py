"""Mixture-of-experts router load-balancing loss, computed as the architecture's own ``ForCausalLM.forward`` does.

prefzoo calls the decoder directly (:mod:`prefzoo.model.logps`), so the ``aux_loss`` that a transformers MoE model
adds to its loss when its config sets ``output_router_logits`` (Mixtral, Qwen2/3-MoE, OLMoE, DeepSeek, GPT-OSS, ...)
is recomputed here with the architecture's own ``load_balancing_loss_func`` and the CausalLM's ``num_experts`` /
``num_experts_per_tok``: the same normalisation; the caller multiplies it by ``router_aux_loss_coef``.
"""

from __future__ import annotations

import sys
from typing import Any

from torch import Tensor, nn

__all__ = ["RouterAuxError", "add_router_loss", "router_aux_loss", "router_metrics"]


class RouterAuxError(ValueError):
    """The model asks for a router loss (``output_router_logits``) that prefzoo cannot recompute."""


def router_aux_loss(causal: nn.Module, router_logits: Any, attention_mask: Tensor) -> Tensor:
    """The architecture's load-balancing loss (unscaled) of one decoder forward's ``router_logits``.

    ``attention_mask`` (N, T) is the 2-D padding mask of the rows the decoder saw (1 = token).
    """
    module = sys.modules.get(type(causal).__module__)
    fn = getattr(module, "load_balancing_loss_func", None)
    n_experts = getattr(causal, "num_experts", None)
    top_k = getattr(causal, "num_experts_per_tok", None)
    if fn is None or n_experts is None or top_k is None:
        kind = getattr(causal.config, "model_type", type(causal).__name__)
        raise RouterAuxError(
            f"{kind}: config.output_router_logits is set but prefzoo cannot recompute this architecture's router "
            "loss (no load_balancing_loss_func / num_experts / num_experts_per_tok): set output_router_logits=False "
            "in the model config, or train with logps_fallback (the model's own forward)"
        )
    return fn(router_logits, n_experts, top_k, attention_mask)


def add_router_loss(loss_value: Tensor, aux: Tensor | None) -> Tensor:
    """The step's loss plus the policy's router term (``router_aux_loss_coef`` × aux, already scaled), if any."""
    return loss_value if aux is None else loss_value + aux.to(loss_value.dtype)


def router_metrics(aux: Tensor | None) -> dict[str, float]:
    """``{'aux_loss': coef × aux}`` for the metrics line of an MoE policy; empty otherwise."""
    return {} if aux is None else {"aux_loss": float(aux.detach())}
