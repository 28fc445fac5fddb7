"""What a causal LM does around its decoder that prefzoo must reproduce: the logit transform and the attention pattern.

prefzoo runs the decoder itself and applies its own LM head (:mod:`prefzoo.model.logps`), so it owns what each
architecture's ``ForCausalLM.forward`` does to the head's output, and, in the masks it builds for prompt sharing,
what each layer's attention pattern is.  Both are read from the config the way the architecture's forward reads them
(transformers 5.x modeling files):

- logit transform z = cap · tanh(s · (h Wᵀ) / cap) (cap = None: z = s · h Wᵀ), with s from

  ============================================================  ==================================  ===========
  model types                                                   config field                        s
  ============================================================  ==================================  ===========
  cohere, cohere2, cohere2_moe, cohere_compass                  ``logit_scale``                     × value
  granite, granite_swa, granitemoe(+_swa, hybrid, shared),      ``logits_scaling``                  ÷ value
  minicpm3 (divides the hidden state: the same for a bias-free head)
  hyperclovax                                                   ``logits_scaling``                  × value
  falcon_h1                                                     ``lm_head_multiplier``              × value
  muse_glimmer, muse_spark                                      ``output_multiplier``               × value
  inkling_text, inkling_mm_model (Inkling 1; divides the        ``logits_mup_width_multiplier``     ÷ value
  hidden state: the same for a bias-free head)
  other transformers model types                                none (their forward scales nothing)
  remote-code models (TRL's reading)                            ``logit_scale``, ``output_multiplier``,
                                                                ``lm_head_multiplier`` ×; ``logits_scaling`` ÷
  ============================================================  ==================================  ===========

  and cap from ``final_logit_softcapping`` (Gemma 2/3/3n/4, VaultGemma, nanochat, Mistral Large 4, Muse...),
  ``logits_soft_cap`` (RecurrentGemma) or ``output_logit_soft_cap`` (xLSTM).  An architecture that does anything
  else is caught by the run-start self-check (:mod:`prefzoo.model.selfcheck`).
- vocabulary cut: Inkling 1 (``inkling_text``, ``inkling_mm_model``) applies a head over the whole embedding table,
  then keeps only the first ``unpadded_vocab_size`` logits, so the softmax runs over those;
  :func:`logits_head` returns that head as :class:`FirstRows` (the same logits, and a weight of the first rows for
  the fused head).  Inkling 2 builds its head with those rows only, so it needs nothing.
- attention pattern per layer: ``config.layer_types`` ("full_attention" / "sliding_attention", window
  ``config.sliding_window``), or every layer sliding when the config has a ``sliding_window`` and no layer types.
- router loss: a mixture-of-experts model whose (text) config sets ``output_router_logits`` adds its load-balancing
  loss to the objective (:mod:`prefzoo.model.moe` recomputes it); that loss is a mean over the tokens the decoder
  sees, so a layout that changes them (a shared prompt, packing) changes the objective, not only its cost.

:func:`model_capabilities` gathers what the rest of a run reads of these (the fast-path choice, the log-prob
function), so each is read from the config in one place.
"""

from __future__ import annotations

import inspect
import math
from dataclasses import dataclass
from typing import Any, cast

from torch import Tensor, nn

from prefzoo._thirdparty import attn_implementation

__all__ = [
    "ATTENTION_TYPES",
    "FirstRows",
    "LogitTransform",
    "ModelCapabilities",
    "attention_layer_types",
    "logit_transform",
    "logits_head",
    "model_capabilities",
    "router_loss",
    "shared_prompt_refusal",
    "text_config",
    "varlen_attention",
    "vocab_cut",
]

_MUL, _DIV = "mul", "div"
_SCALE_BY_TYPE: dict[str, tuple[str, str]] = {
    **dict.fromkeys(("cohere", "cohere2", "cohere2_moe", "cohere_compass"), ("logit_scale", _MUL)),
    **dict.fromkeys(
        ("granite", "granite_swa", "granitemoe", "granitemoe_swa", "granitemoehybrid", "granitemoeshared", "minicpm3"),
        ("logits_scaling", _DIV),
    ),
    "hyperclovax": ("logits_scaling", _MUL),
    "falcon_h1": ("lm_head_multiplier", _MUL),
    "muse_glimmer": ("output_multiplier", _MUL),
    "muse_spark": ("output_multiplier", _MUL),
    **dict.fromkeys(("inkling_text", "inkling_mm_model"), ("logits_mup_width_multiplier", _DIV)),
}
_VOCAB_CUT_BY_TYPE = dict.fromkeys(("inkling_text", "inkling_mm_model"), "unpadded_vocab_size")
_GENERIC_SCALES = (("logit_scale", _MUL), ("output_multiplier", _MUL), ("lm_head_multiplier", _MUL))
_GENERIC_DIVISORS = (("logits_scaling", _DIV),)
_SOFTCAP_KEYS = ("final_logit_softcapping", "logits_soft_cap", "output_logit_soft_cap")
ATTENTION_TYPES = ("full_attention", "sliding_attention")
_STATELESS_TYPES = ("mlp", "moe")  # hybrid configs name their feed-forward-only layers too


def text_config(config: Any) -> Any:
    """The decoder's config (a multimodal config's text part; the config itself otherwise)."""
    get = getattr(config, "get_text_config", None)
    return get() if callable(get) else config


@dataclass(frozen=True)
class LogitTransform:
    """z = cap · tanh(scale · a / cap) for head outputs a = h Wᵀ; cap None = no soft-capping."""

    scale: float = 1.0
    softcap: float | None = None

    @property
    def identity(self) -> bool:
        return self.scale == 1.0 and self.softcap is None

    def __call__(self, a: Tensor) -> Tensor:
        """Transformed logits of head outputs ``a`` (any shape; float32 in, float32 out)."""
        if self.scale != 1.0:
            a = a * self.scale
        if self.softcap is not None:
            a = self.softcap * (a / self.softcap).tanh()
        return a

    def apply_(self, a: Tensor) -> Tensor:
        """In place on a float32 buffer (the fused head's chunks)."""
        if self.scale != 1.0:
            a.mul_(self.scale)
        if self.softcap is not None:
            a.div_(self.softcap).tanh_().mul_(self.softcap)
        return a

    def derivative_(self, z: Tensor) -> Tensor:
        """dz/da from the transformed logits z, in place: scale · (1 − (z/cap)²)."""
        if self.softcap is None:
            return z.fill_(self.scale)
        return z.div_(self.softcap).square_().neg_().add_(1.0).mul_(self.scale)

    def describe(self) -> str:
        parts = ([f"× {self.scale:g}"] if self.scale != 1.0 else []) + (
            [f"soft-cap {self.softcap:g}"] if self.softcap is not None else []
        )
        return ", ".join(parts) or "none"


def _number(cfg: Any, key: str) -> float | None:
    v = getattr(cfg, key, None)
    if isinstance(v, bool) or not isinstance(v, int | float):
        return None
    return float(v)


def logit_transform(config: Any) -> LogitTransform:
    """The transform the architecture's own ``forward`` applies to its LM head's output (see the module table)."""
    cfg = text_config(config)
    kind = getattr(config, "model_type", None)
    if kind in _SCALE_BY_TYPE:
        rules = [_SCALE_BY_TYPE[kind]]
    elif type(config).__module__.startswith("transformers."):
        rules = []  # transformers' own modeling code: audited (the table); e.g. MPT's config has an unused logit_scale
    else:
        rules = [*_GENERIC_SCALES, *_GENERIC_DIVISORS]  # remote code: TRL's reading; the self-check has the last word
    scale = 1.0
    for key, how in rules:
        v = _number(cfg, key)
        if v is None:
            v = _number(config, key)
        if v is None:
            continue
        if how == _DIV and v == 0:
            raise ValueError(f"model config {key}=0: the architecture divides its logits by it")
        scale = scale * v if how == _MUL else scale / v
    cap = None
    for key in _SOFTCAP_KEYS:
        v = _number(cfg, key)
        if v is not None and v > 0:
            cap = v
            break
    if not math.isfinite(scale):
        raise ValueError(f"model config gives a non-finite logit scale ({scale}); check {rules}")
    return LogitTransform(scale=scale, softcap=cap)


def vocab_cut(config: Any) -> int | None:
    """How many logits the architecture's forward keeps (its first ``n``), where it cuts them; None: all of them."""
    key = _VOCAB_CUT_BY_TYPE.get(getattr(config, "model_type", None) or "")
    n = _number(text_config(config), key) if key else None
    if n is None:
        return None
    if n != int(n) or n < 1:
        raise ValueError(f"model config {key}={n}: the architecture keeps that many logits; it must be a count >= 1")
    return int(n)


class FirstRows(nn.Module):
    """A linear LM head whose logits the architecture cuts to the first ``n`` (Inkling 1's ``unpadded_vocab_size``):
    the same logits as the model's forward, and ``weight`` / ``bias`` views of the first ``n`` rows, so the fused head
    computes them (and its gradient reaches exactly those rows)."""

    def __init__(self, head: nn.Module, n: int) -> None:
        super().__init__()
        self.head, self.n = head, n

    @property
    def weight(self) -> Tensor:
        return cast(Tensor, self.head.weight)[: self.n]

    @property
    def bias(self) -> Tensor | None:
        b: Tensor | None = getattr(self.head, "bias", None)
        return None if b is None else b[: self.n]

    @property
    def out_features(self) -> int:
        return self.n

    def forward(self, x: Tensor) -> Tensor:
        return self.head(x)[..., : self.n]


def logits_head(causal: Any) -> Any:
    """The module that maps the decoder's last hidden state to logits (before the transform above).

    Usually the output embedding (``lm_head``); BERT-style decoders wrap it in a prediction head (dense, activation,
    norm, then the output embedding: ``cls`` / ``lm_head``), which is returned whole.  A linear head whose logits the
    architecture cuts (:func:`vocab_cut`) is returned as :class:`FirstRows`.
    """
    out_emb = causal.get_output_embeddings()
    for name in ("lm_head", "cls"):
        m = getattr(causal, name, None)
        if isinstance(m, nn.Module) and m is not out_emb and any(x is out_emb for x in m.modules()):
            return m
    n, rows = vocab_cut(causal.config), getattr(out_emb, "out_features", None)
    if n is not None and isinstance(rows, int) and n < rows:  # a plain linear head, or a LoRA layer wrapping one
        return FirstRows(out_emb, n)
    return out_emb


def attention_layer_types(config: Any) -> list[str]:
    """One entry per decoder layer: 'full_attention', 'sliding_attention', or the config's own name for others."""
    cfg = text_config(config)
    n = int(getattr(cfg, "num_hidden_layers", 0) or 0)
    types = getattr(cfg, "layer_types", None)
    if isinstance(types, list | tuple) and types:
        return [str(t) for t in types]
    window = getattr(cfg, "sliding_window", None)
    if isinstance(window, int) and window > 0 and getattr(cfg, "use_sliding_window", True) is not False:
        return ["sliding_attention"] * n
    return ["full_attention"] * n


def sliding_window(config: Any) -> int | None:
    window = getattr(text_config(config), "sliding_window", None)
    return int(window) if isinstance(window, int) and window > 0 else None


def takes_mask_per_layer_type(backbone: Any) -> bool:
    """The decoder's forward accepts ``attention_mask`` as a {layer type: 4-D mask} dict (transformers 5.x)."""
    try:
        src = inspect.getsource(type(backbone).forward)
    except (OSError, TypeError):
        return False
    return "isinstance(causal_mask_mapping := attention_mask, dict)" in src or "isinstance(attention_mask, dict)" in src


def takes_position_ids(backbone: Any) -> bool:
    """The decoder's forward has a ``position_ids`` parameter (learned positions from the input shape do not)."""
    try:
        return "position_ids" in inspect.signature(type(backbone).forward).parameters
    except (TypeError, ValueError):
        return False


def shared_prompt_refusal(backbone: Any, config: Any, feature: str = "share_prompt") -> str | None:
    """Why prompt sharing (or packing: ``feature``) cannot reproduce this model's attention (one line), or None."""
    cfg = text_config(config)
    kind = getattr(config, "model_type", "?")
    flags = {m.is_causal for m in backbone.modules() if isinstance(getattr(m, "is_causal", None), bool)}
    if True not in flags or False in flags:
        return (
            f"{feature}: {kind}'s attention modules do not all declare is_causal=True (an encoder-style or "
            f"bidirectional model), so the shared mask would change what they see: turn {feature} off"
        )
    if not takes_position_ids(backbone):
        return (
            f"{feature}: {kind}'s decoder takes no position_ids, so the rejected completion cannot restart at the "
            f"prompt end: turn {feature} off"
        )
    types = attention_layer_types(config)
    others = sorted(set(types) - set(ATTENTION_TYPES) - set(_STATELESS_TYPES))
    if others:
        return (
            f"{feature}: {kind} has {others} layers, which carry state across the whole row (the rejected "
            f"completion would see the chosen one): turn {feature} off"
        )
    if "sliding_attention" in types and sliding_window(config) is None:
        return f"{feature}: {kind} has sliding-attention layers but no sliding_window in its config"
    attention = set(types) & set(ATTENTION_TYPES)
    if len(attention) > 1 and not takes_mask_per_layer_type(backbone):
        return (
            f"{feature}: {kind} mixes {sorted(attention)} layers but its decoder takes one mask for all of them: "
            f"turn {feature} off"
        )
    if getattr(cfg, "attention_chunk_size", None):
        return f"{feature}: {kind} uses chunked attention, which the shared mask does not express: turn it off"
    if getattr(cfg, "alibi", False) or (kind in ("bloom", "mpt", "falcon") and getattr(cfg, "alibi", True)):
        return f"{feature}: {kind} derives positions from the key index (ALiBi), not position ids: turn it off"
    return None


def router_loss(config: Any) -> bool:
    """The architecture adds its mixture-of-experts router load-balancing loss to the objective
    (``output_router_logits`` on the text config, as the CausalLM's own forward reads it)."""
    return bool(getattr(text_config(config), "output_router_logits", False))


def varlen_attention(config: Any) -> bool:
    """The model attends through a flash-attention kernel (transformers' ``flash_attention_2``/``_3``/``_4`` or a hub
    flash-attn kernel): packed sequences go to it by their boundaries, not by a 4-D mask."""
    impl = str(attn_implementation(config) or "")
    return impl.startswith("flash_attention") or "flash-attn" in impl or "flash_attn" in impl


@dataclass(frozen=True)
class ModelCapabilities:
    """What a causal LM declares that decides how prefzoo may lay out its batches (read once, at setup)."""

    router_loss: bool  # the objective holds the MoE router loss over the plain batch's tokens
    custom_mask_refusal: str | None  # why a shared-prompt 4-D mask cannot reproduce its attention, or None
    packing_refusal: str | None  # why packing cannot (a 4-D mask, or flash's sequence boundaries), or None

    def fast_path_block(self) -> str | None:
        """Why the automatic fast paths stay off for this model whatever the data (None: the data decides)."""
        if self.router_loss:
            return "the MoE router loss counts the plain batch's tokens: force with on"
        return None


def model_capabilities(causal: Any, feature: str = "the fast paths") -> ModelCapabilities:
    """The :class:`ModelCapabilities` of a transformers CausalLM (unwrapped: no peft or DDP wrapper)."""
    config = causal.config
    impl = attn_implementation(config, "sdpa") or "sdpa"
    layout = shared_prompt_refusal(causal.get_decoder(), config, feature)  # what the architecture allows
    no_mask = None if impl in ("sdpa", "eager") else f"{impl} attention takes no 4-D mask"
    pack = layout if varlen_attention(config) else no_mask or layout  # flash packs by sequence boundaries
    return ModelCapabilities(router_loss(config), custom_mask_refusal=no_mask or layout, packing_refusal=pack)
