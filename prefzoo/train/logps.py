"""Completion log-probs of a causal LM: one chosen+rejected forward, LM head and float32 log-softmax in chunks.

The backbone runs once over the (2B, T) batch; only hidden states at positions that predict a completion token are
kept, and the LM head + log-softmax run over those in chunks of ``chunk_size`` positions, so no full-vocabulary
float32 tensor over every position ever exists.  With ``fused_head`` (default) a plain bias-free head goes through
:mod:`prefzoo.train.fastpath_head`, which keeps no (positions × vocab) tensor alive for backward either.
Per-token tensors are built only when asked for.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor, nn

from prefzoo.train.fastpath_head import fusable_head, head_logps
from prefzoo.train.fastpath_prompt import shared_prompt_select

__all__ = ["CompletionLogps", "PolicyLogps", "completion_logps_naive", "unwrap_causal_lm"]


class CompletionLogps(dict):
    """Per-row results for N = 2B rows (chosen rows first), a dict with attribute access.

    A dict so that DDP and DeepSpeed ZeRO-3 find the output tensors for their backward hooks.
    ``logps`` (N,) Σ_t log π(y_t | x, y_<t) over completion tokens; ``lengths`` (N,) completion token counts;
    optional ``token_logps`` / ``token_entropies`` (N, T_c), 0 at padding, and ``token_mask`` (N, T_c) bool.
    """

    _FIELDS = ("logps", "lengths", "token_logps", "token_entropies", "token_mask")

    def __init__(self, *args: Any, **fields: Any) -> None:
        # CompletionLogps(logps, lengths, ...) or CompletionLogps(mapping): accelerate rebuilds outputs as
        # type(out)({k: v ...}) when it converts mixed-precision outputs back to float32
        if len(args) == 1 and isinstance(args[0], dict) and not fields:
            fields = dict(args[0])
        else:
            fields = {**dict(zip(self._FIELDS, args, strict=False)), **fields}
        missing = [k for k in ("logps", "lengths") if fields.get(k) is None]
        if missing:
            raise TypeError(f"CompletionLogps needs {missing}")
        super().__init__({**dict.fromkeys(self._FIELDS), **fields})

    def __getattr__(self, name: str) -> Any:
        try:
            return self[name]
        except KeyError:
            raise AttributeError(name) from None

    def __setattr__(self, name: str, value: Any) -> None:
        self[name] = value

    def split(self) -> tuple[dict[str, Tensor | None], dict[str, Tensor | None]]:
        """(chosen half, rejected half) of every field."""
        b = self["logps"].shape[0] // 2
        chosen = {k: (v[:b] if v is not None else None) for k, v in self.items()}
        rejected = {k: (v[b:] if v is not None else None) for k, v in self.items()}
        return chosen, rejected


def unwrap_causal_lm(model: nn.Module) -> nn.Module:
    """The transformers CausalLM inside a peft wrapper (LoRA layers stay injected in it)."""
    get_base = getattr(model, "get_base_model", None)
    return get_base() if callable(get_base) else model


def _chunked_head_logps(
    head: nn.Module, h: Tensor, targets: Tensor, chunk_size: int, want_entropy: bool
) -> tuple[Tensor, Tensor | None]:
    """log π(target) and optionally entropy for M selected positions; h (M, H), targets (M,)."""
    logps, ents = [], []
    for start in range(0, h.shape[0], chunk_size):
        logits = head(h[start : start + chunk_size]).float()  # (m, V) float32, m ≤ chunk_size
        logp_all = torch.log_softmax(logits, dim=-1)  # (m, V)
        tgt = targets[start : start + chunk_size]  # (m,)
        logps.append(logp_all.gather(-1, tgt.unsqueeze(-1)).squeeze(-1))  # (m,)
        if want_entropy:
            ents.append(-(logp_all.exp() * logp_all).sum(-1))  # (m,)
    lp = torch.cat(logps) if logps else h.new_zeros(0, dtype=torch.float32)
    ent = (torch.cat(ents) if ents else h.new_zeros(0, dtype=torch.float32)) if want_entropy else None
    return lp, ent


class PolicyLogps(nn.Module):
    """Wraps a causal LM so that ``forward(batch)`` returns completion log-probs (what accelerate prepares).

    Wrapping keeps DDP/DeepSpeed gradient hooks on the module actually called.
    """

    def __init__(self, lm: nn.Module, chunk_size: int = 1024, fused_head: bool = True) -> None:
        super().__init__()
        self.lm = lm
        self.chunk_size = chunk_size
        self.fused_head = fused_head  # recompute-in-backward LM head (fastpath_head) when the head allows it

    def forward(
        self,
        input_ids: Tensor,
        attention_mask: Tensor,
        completion_mask: Tensor,
        token_logps: bool = False,
        token_entropies: bool = False,
    ) -> CompletionLogps:
        causal = unwrap_causal_lm(self.lm)
        backbone = causal.get_decoder()
        head = causal.get_output_embeddings()
        if completion_mask.dtype == torch.bool:  # plain layout: (2B, T) rows, chosen rows first
            hidden = backbone(input_ids=input_ids, attention_mask=attention_mask, use_cache=False).last_hidden_state
            # position t predicts token t+1: completion tokens at t+1 select hidden states at t
            predict = completion_mask[:, 1:]  # (N, T-1) bool
            h_sel = hidden[:, :-1][predict]  # (M, H), M = completion tokens in the batch, row-major
            targets = input_ids[:, 1:][predict]  # (M,)
            n = input_ids.shape[0]
            row = torch.arange(n, device=input_ids.device).unsqueeze(1).expand_as(predict)[predict]  # (M,)
            col = torch.cumsum(predict.long(), dim=1)[predict] - 1  # (M,) index within the row's completion
            lengths = predict.sum(dim=1)  # (N,)
        else:  # shared-prompt layout: (B, T) rows [x, y_w, y_l], completion_mask = segment ids
            selected = shared_prompt_select(backbone, causal.config, input_ids, completion_mask)
            h_sel, targets, row, col, lengths = selected
            n = lengths.shape[0]
        if self.fused_head and fusable_head(head):
            tok_lp, tok_ent = head_logps(h_sel, head.weight, targets, self.chunk_size, token_entropies)
        else:
            tok_lp, tok_ent = _chunked_head_logps(head, h_sel, targets, self.chunk_size, token_entropies)
        logps = torch.zeros(n, dtype=tok_lp.dtype, device=tok_lp.device).index_add(0, row, tok_lp)  # (N,)
        out = CompletionLogps(logps=logps, lengths=lengths)
        if token_logps or token_entropies:
            t_c = max(int(lengths.max()), 1)
            mask = torch.zeros(n, t_c, dtype=torch.bool, device=input_ids.device)
            mask[row, col] = True  # (N, T_c)
            out.token_mask = mask
            if token_logps:
                out.token_logps = tok_lp.new_zeros(n, t_c).index_put((row, col), tok_lp)  # (N, T_c)
            if token_entropies:
                assert tok_ent is not None
                out.token_entropies = tok_ent.new_zeros(n, t_c).index_put((row, col), tok_ent)  # (N, T_c)
        return out


def completion_logps_naive(lm: Any, input_ids: Tensor, attention_mask: Tensor, completion_mask: Tensor) -> Tensor:
    """Reference implementation: full logits + full float32 log-softmax; (N,) summed completion log-probs."""
    logits = lm(input_ids=input_ids, attention_mask=attention_mask).logits.float()  # (N, T, V)
    logp = torch.log_softmax(logits[:, :-1], dim=-1).gather(-1, input_ids[:, 1:].unsqueeze(-1)).squeeze(-1)
    return (logp * completion_mask[:, 1:]).sum(dim=1)  # (N,)
