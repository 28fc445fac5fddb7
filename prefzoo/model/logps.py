"""Completion log-probs of a causal LM (:func:`sequence_logps`, the one computation every part of prefzoo uses).

One chosen+rejected forward, LM head, the model's logit transform and float32 log-softmax in chunks.

The backbone runs once over the (2B, T) batch; only hidden states at positions that predict a completion token are
kept, and the LM head + log-softmax run over those in chunks of ``chunk_size`` positions, so no full-vocabulary
float32 tensor over every position ever exists.  With ``fused_head`` (default) a plain bias-free head goes through
:mod:`prefzoo.model.fast.head`, which keeps no (positions × vocab) tensor alive for backward either.
Per-token tensors are built only when asked for.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, NamedTuple

import torch
from torch import Tensor, nn

from prefzoo.model.arch import logit_transform, logits_head, router_loss, text_config, varlen_attention
from prefzoo.model.fast.head import HeadOptions, fusable_head, row_sums
from prefzoo.model.fast.head_rows import weight_logps
from prefzoo.model.fast.packing import pack_rows, packed_forward, split_segments
from prefzoo.model.fast.prompt import shared_prompt_select, shared_select, unshare_rows
from prefzoo.model.moe import router_aux_loss

__all__ = [
    "CompletionLogps",
    "PolicyLogps",
    "completion_logps_naive",
    "is_shared_layout",
    "sequence_logps",
    "token_log_sq_probs",
    "unwrap",
]


class CompletionLogps(dict):
    """Per-row results for N = 2B rows (chosen rows first), a dict with attribute access.

    A dict so that data-parallel and sharding engines find the output tensors for their backward hooks.
    ``logps`` (N,) Σ_t log π(y_t | x, y_<t) over completion tokens; ``lengths`` (N,) completion token counts;
    optional ``token_logps`` / ``token_entropies`` / ``token_log_sq_probs`` (log Σ_v π(v)², constant) (N, T_c), 0 at
    padding, and ``token_mask`` (N, T_c) bool;
    ``aux_loss`` () the mixture-of-experts router term to add to the loss (coef × aux), or None;
    optional ``logits_sum`` (N,) Σ_t mean_v z_{t,v}: the vocabulary-mean logit summed over completion tokens
    (no gradient; TRL's ``logits/chosen`` metric is its token mean).
    """

    _FIELDS = (
        "logps", "lengths", "token_logps", "token_entropies", "token_mask", "aux_loss", "token_log_sq_probs",
        "logits_sum",
    )  # fmt: skip

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
        rows = [k for k in self._FIELDS if k != "aux_loss"]
        chosen = {k: (self[k][:b] if self[k] is not None else None) for k in rows}
        rejected = {k: (self[k][b:] if self[k] is not None else None) for k in rows}
        return chosen, rejected


def unwrap(model: Any, to: str = "lm") -> Any:
    """What ``model`` holds inside the wrappers around it: engines' (``.module``) and peft's.

    ``to="lm"``: the first object that can ``generate`` (a transformers model, or a peft model around one);
    ``"base"``: that model without peft's wrapper (LoRA layers stay injected in it); ``"policy"``: the
    :class:`PolicyLogps` inside a wrapped policy.
    """
    if to == "policy":
        while not isinstance(model, PolicyLogps):
            model = model.module
        return model
    while hasattr(model, "module") and not hasattr(model, "generate"):
        model = model.module
    get_base = getattr(model, "get_base_model", None) if to == "base" else None
    return get_base() if callable(get_base) else model


def _chunk_logits(head: Any, h: Tensor, opts: HeadOptions) -> Iterator[tuple[int, Tensor]]:
    """(start, the model's logits (m, V) in float32, float64 staying) of each chunk of ``opts.chunk_size`` positions
    of h (M, H), through the head module and the logit transform."""
    for start in range(0, h.shape[0], opts.chunk_size):
        a = head(h[start : start + opts.chunk_size])  # (m, V) head outputs, m ≤ chunk_size
        yield start, opts.transform(a.to(torch.promote_types(a.dtype, torch.float32)))


def _chunked_head_logps(
    head: Any, h: Tensor, targets: Tensor, want_entropy: bool, opts: HeadOptions = HeadOptions()
) -> tuple[Tensor, Tensor | None]:
    """log π(target) and optionally entropy for M selected positions; h (M, H), targets (M,)."""
    logps, ents = [], []
    for start, logits in _chunk_logits(head, h, opts):
        logp_all = torch.log_softmax(logits, dim=-1)  # (m, V)
        tgt = targets[start : start + opts.chunk_size]  # (m,)
        logps.append(logp_all.gather(-1, tgt.unsqueeze(-1)).squeeze(-1))  # (m,)
        if want_entropy:
            ents.append(-(logp_all.exp() * logp_all).sum(-1))  # (m,)
    lp = torch.cat(logps) if logps else h.new_zeros(0, dtype=torch.float32)
    ent = (torch.cat(ents) if ents else h.new_zeros(0, dtype=torch.float32)) if want_entropy else None
    return lp, ent


@torch.no_grad()
def _mean_logits(head: Any, h: Tensor, opts: HeadOptions) -> Tensor:
    """mean_v z_v (M,) of the model's logits z at M selected positions, h (M, H); no gradient.

    A plain linear head without soft-capping needs no (M, V) tensor: mean_v(s · h·w_v) = s · h·mean_v(w_v).
    """
    transform, chunk_size = opts.transform, opts.chunk_size
    if fusable_head(head) and transform.softcap is None:
        w_bar = head.weight.to(torch.promote_types(head.weight.dtype, torch.float32)).mean(0)  # (H,)
        return (h.to(w_bar.dtype) @ w_bar) * transform.scale  # (M,)
    out = [transform(head(h[i : i + chunk_size]).float()).mean(-1) for i in range(0, h.shape[0], chunk_size)]
    return torch.cat(out) if out else h.new_zeros(0, dtype=torch.float32)


def is_shared_layout(completion_mask: Tensor) -> bool:
    """Segment ids of the shared-prompt layout (int, values 0..3 with completions 2 and 3), not a 0/1 mask."""
    if completion_mask.dtype == torch.bool or completion_mask.is_floating_point():
        return False
    return bool((completion_mask > 1).any())


def _plain_select(
    hidden: Tensor, input_ids: Tensor, completion_mask: Tensor
) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:
    """(h_sel (M, ...), targets (M,), row (M,), col (M,), lengths (N,)) of (N, T) rows [x, y]."""
    # position t predicts token t+1: completion tokens at t+1 select hidden states (or logits) at t
    predict = completion_mask[:, 1:].bool()  # (N, T-1)
    h_sel = hidden[:, :-1][predict]  # (M, ...), M = completion tokens in the batch, row-major
    targets = input_ids[:, 1:][predict]  # (M,)
    n = input_ids.shape[0]
    row = torch.arange(n, device=input_ids.device).unsqueeze(1).expand_as(predict)[predict]  # (M,)
    col = torch.cumsum(predict.long(), dim=1)[predict] - 1  # (M,) index within the row's completion
    return h_sel, targets, row, col, predict.sum(dim=1)


def _router_aux(causal: nn.Module, out: Any, attention_mask: Tensor) -> Tensor | None:
    """coef × the architecture's own load-balancing loss of this forward, or None (not an MoE / not enabled)."""
    router_logits = getattr(out, "router_logits", None)
    if router_logits is None:
        return None
    aux = getattr(out, "aux_loss", None)  # the CausalLM forward (fallback path) computed it itself
    if aux is None:
        aux = router_aux_loss(causal, router_logits, attention_mask)
    coef = float(getattr(text_config(causal.config), "router_aux_loss_coef", 0.0) or 0.0)
    return coef * aux


class _Batch(NamedTuple):
    """The rows :func:`sequence_logps` scores: ``input_ids``, ``attention_mask``, ``completion_mask``, each (N, T)."""

    input_ids: Tensor
    attention_mask: Tensor
    completion_mask: Tensor


class _Outputs(NamedTuple):
    """What a :func:`sequence_logps` call asks for beyond the summed log-probs (its flags of the same names)."""

    token_logps: bool
    token_entropies: bool
    token_sq_probs: bool
    logits_mean: bool


def _model_forward(
    causal: nn.Module, batch: _Batch, router: bool
) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor, Tensor | None]:
    """The model's own ``forward(...).logits`` at the completion positions: (logits (M, V), targets, row, col,
    lengths, aux term); shared-layout batches are first rebuilt as plain rows."""
    input_ids, attention_mask, completion_mask = batch
    if is_shared_layout(completion_mask):
        input_ids, attention_mask, completion_mask = unshare_rows(input_ids, completion_mask)
    kw = {"output_router_logits": True} if router else {}
    out = causal(input_ids=input_ids, attention_mask=attention_mask, use_cache=False, **kw)
    logits, targets, row, col, lengths = _plain_select(out.logits, input_ids, completion_mask)
    aux = _router_aux(causal, out, attention_mask) if router else None
    return logits.to(torch.promote_types(logits.dtype, torch.float32)), targets, row, col, lengths, aux


def sequence_logps(
    model: nn.Module,
    input_ids: Tensor,
    attention_mask: Tensor,
    completion_mask: Tensor,
    *,
    token_logps: bool = False,
    token_entropies: bool = False,
    token_sq_probs: bool = False,
    chunk_size: int = 1024,
    fused_head: bool = True,
    path: str = "fast",
    router_aux: bool = False,
    logits_mean: bool = False,
    packing: bool = False,
    split_attention: bool = True,
) -> CompletionLogps:
    """Summed completion log-probs Σ_t log π(y_t | x, y_<t) of rows [x, y] of any Hugging Face causal LM.

    ``input_ids``/``attention_mask`` (N, T) right-padded rows; ``completion_mask`` (N, T) 0/1 or bool, 1 on the
    completion tokens y (or the shared-prompt layout's (B, T) segment ids: 0 pad, 1 x, 2 y_w, 3 y_l, giving
    N = 2B outputs, chosen rows first).  Returns a :class:`CompletionLogps`: ``logps`` (N,) float32 and
    ``lengths`` (N,); ``token_logps``/``token_entropies`` add (N, T_c) per-token tensors and ``token_mask``.

    ``path="fast"`` runs the decoder once, keeps only the hidden states that predict a completion token, and
    applies the LM head and the model's logit transform (soft-capping, scaling: :mod:`prefzoo.model.arch`)
    with a float32 log-softmax in chunks of ``chunk_size`` positions, fused (``fused_head``: nothing of size
    positions × vocabulary kept for backward) when the head is a plain bias-free linear layer.  ``path="model"``
    uses the model's own ``forward(...).logits`` instead (slower, for architectures the fast path does not
    reproduce).  ``router_aux`` adds ``aux_loss`` (scalar): ``router_aux_loss_coef`` × the mixture-of-experts
    load-balancing loss, when the model's config enables ``output_router_logits``.  ``logits_mean`` adds
    ``logits_sum`` (N,): the vocabulary-mean logit summed over each row's completion tokens (a metric; no gradient).
    ``packing`` runs the fast path's decoder on the rows packed without padding (:mod:`prefzoo.model.fast.packing`);
    the model path ignores it.  ``split_attention`` lets the shared-prompt layout's attention run as two causal
    parts where the decoder allows it (:mod:`prefzoo.model.fast.split`); False keeps one masked call per layer.
    """
    if path not in ("fast", "model"):
        raise ValueError(f"sequence_logps: path={path!r}: choose 'fast' or 'model'")
    causal: Any = unwrap(model, "base")
    router = router_aux and router_loss(causal.config)
    batch = _Batch(input_ids, attention_mask, completion_mask)
    want = _Outputs(token_logps, token_entropies, token_sq_probs, logits_mean)
    if path == "model":
        scores = _model_path_scores(causal, batch, router, want)
    else:
        opts = HeadOptions(chunk_size, logit_transform(causal.config))
        scores = _fast_path_scores(causal, batch, router, want, opts, fused_head, packing, split_attention)
    return _completion_logps(scores, want, input_ids.device)


class _Scores(NamedTuple):
    """What either path computed: logps (N,), lengths (N,), row/col (M,) of each scored position, the router term,
    and the per-token log-probs, entropies, log Σ π², vocabulary-mean logits (M,) where computed (else None)."""

    logps: Tensor
    lengths: Tensor
    row: Tensor
    col: Tensor
    aux: Tensor | None
    tok_lp: Tensor | None
    tok_ent: Tensor | None
    tok_sq: Tensor | None
    tok_mean: Tensor | None


def _model_path_scores(causal: Any, batch: _Batch, router: bool, want: _Outputs) -> _Scores:
    """:func:`sequence_logps` through the model's own ``forward(...).logits`` (``path="model"``)."""
    logits, targets, row, col, lengths, aux = _model_forward(causal, batch, router)
    logp_all = torch.log_softmax(logits, dim=-1)  # (M, V)
    tok_lp = logp_all.gather(-1, targets.unsqueeze(-1)).squeeze(-1)  # (M,)
    tok_ent = -(logp_all.exp() * logp_all).sum(-1) if want.token_entropies else None  # (M,)
    tok_sq = torch.logsumexp(2 * logp_all.detach(), dim=-1) if want.token_sq_probs else None  # (M,)
    tok_mean = logits.detach().mean(-1) if want.logits_mean else None  # (M,)
    logps = row_sums(tok_lp, row, lengths.shape[0])  # (N,)
    return _Scores(logps, lengths, row, col, aux, tok_lp, tok_ent, tok_sq, tok_mean)


def _fast_path_scores(
    causal: Any,
    batch: _Batch,
    router: bool,
    want: _Outputs,
    opts: HeadOptions,
    fused_head: bool,
    packing: bool,
    split_attention: bool,
) -> _Scores:
    """:func:`sequence_logps` through the decoder once and the LM head at the completion positions only."""
    head = logits_head(causal)
    kw: dict[str, Any] = {"output_router_logits": True} if router else {}
    out, (h_sel, targets, row, col, lengths), row_mask = _select_hidden(causal, batch, packing, split_attention, kw)
    aux = _router_aux(causal, out, row_mask) if router else None
    n = lengths.shape[0]
    per_token = want.token_logps or want.token_entropies
    logps, tok_lp, tok_ent = _head_logps(
        head, h_sel, targets, row, n, per_token, want.token_entropies, opts, fused_head
    )
    tok_sq = token_log_sq_probs(head, h_sel, opts) if want.token_sq_probs else None
    tok_mean = _mean_logits(head, h_sel.detach(), opts) if want.logits_mean else None  # (M,)
    return _Scores(logps, lengths, row, col, aux, tok_lp, tok_ent, tok_sq, tok_mean)


def _select_hidden(
    causal: Any, batch: _Batch, packing: bool, split_attention: bool, kw: dict[str, Any]
) -> tuple[Any, tuple[Tensor, Tensor, Tensor, Tensor, Tensor], Tensor]:
    """(decoder output, (h_sel, targets, row, col, lengths), the rows' real-token mask) of the batch's layout."""
    input_ids, attention_mask, completion_mask = batch
    backbone = causal.get_decoder()
    shared = is_shared_layout(completion_mask)
    if packing:  # padding-free rows; hidden states come back in the collated layout
        segments = (  # SDPA: one padding-free row, attention split over the collated rows
            split_segments(backbone, causal.config, attention_mask, completion_mask, shared)
            if split_attention else None
        )  # fmt: skip
        one_row = segments is not None or varlen_attention(causal.config)  # flash: one row, sequence boundaries
        packed = pack_rows(input_ids, attention_mask, completion_mask, shared, one_row)
        out, hidden = packed_forward(backbone, causal.config, packed, segments, **kw)
        select = shared_select if shared else _plain_select
        return out, select(hidden, input_ids, completion_mask), (packed.doc != 0).long()  # the router saw real tokens
    if not shared:  # plain layout: (N, T) rows
        out = backbone(input_ids=input_ids, attention_mask=attention_mask, use_cache=False, **kw)
        return out, _plain_select(out.last_hidden_state, input_ids, completion_mask), attention_mask
    # shared-prompt layout: (B, T) rows [x, y_w, y_l], completion_mask = segment ids
    out, selected = shared_prompt_select(backbone, causal.config, input_ids, completion_mask, split_attention, **kw)
    return out, selected, (completion_mask != 0).long()


def _completion_logps(s: _Scores, want: _Outputs, device: torch.device) -> CompletionLogps:
    """The :class:`CompletionLogps` of either path's scores, with the per-token (N, T_c) tensors asked for."""
    n = s.lengths.shape[0]
    result = CompletionLogps(logps=s.logps, lengths=s.lengths, aux_loss=s.aux)
    if s.tok_mean is not None:
        zeros = torch.zeros(n, dtype=torch.float32, device=s.logps.device)
        result.logits_sum = zeros.index_add(0, s.row, s.tok_mean.float())  # (N,)
    if not (want.token_logps or want.token_entropies or want.token_sq_probs):
        return result
    t_c = max(int(s.lengths.max()), 1)
    mask = torch.zeros(n, t_c, dtype=torch.bool, device=device)
    mask[s.row, s.col] = True  # (N, T_c)
    result.token_mask = mask
    for asked, name, tok in (
        (want.token_logps, "token_logps", s.tok_lp),
        (want.token_entropies, "token_entropies", s.tok_ent),
        (want.token_sq_probs, "token_log_sq_probs", s.tok_sq),
    ):
        if asked:
            assert tok is not None
            result[name] = tok.new_zeros(n, t_c).index_put((s.row, s.col), tok)  # (N, T_c)
    return result


def _head_logps(
    head: Any,
    h_sel: Tensor,
    targets: Tensor,
    row: Tensor,
    n: int,
    per_token: bool,
    want_entropy: bool,
    opts: HeadOptions,
    fused_head: bool,
) -> tuple[Tensor, Tensor | None, Tensor | None]:
    """(logps (N,) summed per row, token log-probs (M,), token entropies (M,) or None) of M selected positions.

    Without per-token outputs a fused head may score whole rows (:mod:`prefzoo.model.fast.head_rows`: it keeps
    each row's weight gradient instead of the softmax when that is smaller); the token log-probs are then None.
    """
    if fused_head and fusable_head(head):
        return weight_logps(h_sel, head.weight, targets, row, n, per_token, want_entropy, opts)
    tok_lp, tok_ent = _chunked_head_logps(head, h_sel, targets, want_entropy, opts)
    return row_sums(tok_lp, row, n), tok_lp, tok_ent


@torch.no_grad()
def token_log_sq_probs(head: Any, h: Tensor, opts: HeadOptions) -> Tensor:
    """log Σ_v π(v | prefix)² of M selected positions (M,), a constant: one more LM-head pass, only for WPO."""
    out = [torch.logsumexp(2 * torch.log_softmax(z, -1), -1) for _, z in _chunk_logits(head, h, opts)]
    return torch.cat(out) if out else h.new_zeros(0, dtype=torch.float32)


class PolicyLogps(nn.Module):
    """Wraps a causal LM so that ``forward(batch)`` returns :func:`sequence_logps` (what accelerate prepares).

    Wrapping keeps an engine's gradient hooks on the module actually called.  The trainer, the reference and
    evaluation all compute log-probs through this one function.
    """

    def __init__(
        self,
        lm: nn.Module,
        chunk_size: int = 1024,
        fused_head: bool = True,
        path: str = "fast",
        router_aux: bool = False,
        packing: bool = False,
    ) -> None:
        super().__init__()
        self.lm = lm
        self.chunk_size = chunk_size
        self.fused_head = fused_head  # recompute-in-backward LM head (fastpath_head) when the head allows it
        self.path = path  # 'fast' or 'model' (the model's own forward: the self-check's fallback)
        self.router_aux = router_aux  # add coef × the MoE router loss as ``aux_loss`` (the policy, in training)
        self.packing = packing  # decoder over padding-free packed rows (prefzoo.model.fast.packing)

    def forward(
        self,
        input_ids: Tensor,
        attention_mask: Tensor,
        completion_mask: Tensor,
        token_logps: bool = False,
        token_entropies: bool = False,
        token_sq_probs: bool = False,
        logits_mean: bool = False,
    ) -> CompletionLogps:
        return sequence_logps(
            self.lm,
            input_ids,
            attention_mask,
            completion_mask,
            token_logps=token_logps,
            token_entropies=token_entropies,
            token_sq_probs=token_sq_probs,
            chunk_size=self.chunk_size,
            fused_head=self.fused_head,
            path=self.path,
            router_aux=self.router_aux and self.training,
            logits_mean=logits_mean,
            packing=self.packing,
        )


def completion_logps_naive(lm: Any, input_ids: Tensor, attention_mask: Tensor, completion_mask: Tensor) -> Tensor:
    """Reference implementation: full logits + full float32 log-softmax; (N,) summed completion log-probs."""
    logits = lm(input_ids=input_ids, attention_mask=attention_mask).logits.float()  # (N, T, V)
    logp = torch.log_softmax(logits[:, :-1], dim=-1).gather(-1, input_ids[:, 1:].unsqueeze(-1)).squeeze(-1)
    return (logp * completion_mask[:, 1:]).sum(dim=1)  # (N,)
