"""The tiny Llama and the character tokenizer: the default task's model, and the one every test builds.

``tiny_causal_lm()`` (public as ``prefzoo.testing.tiny_causal_lm``) builds both locally in well under a second:
nothing touches the network.  Its defaults are the embedded default task's model (hidden 64, 2 layers, 4 heads,
MLP 256, tied embeddings, 43-token vocabulary); a test passes smaller sizes or its own tokenizer.
"""

from __future__ import annotations

from typing import Any

__all__ = ["CHARS", "SPECIAL_TOKENS", "char_tokenizer", "tiny_causal_lm", "tiny_llama_config"]

SPECIAL_TOKENS = ("<pad>", "<bos>", "<eos>", "<unk>")  # ids 0, 1, 2, 3
CHARS = "0123456789+= abcdefghijklmnopqrstuvwxyz"  # one token per character (the default task's alphabet)


def char_tokenizer(
    chars: str = CHARS, *, pad: bool = True, bos: bool = True, model_max_length: int | None = 64
) -> Any:
    """A fast tokenizer with one token per character of ``chars`` after the four special tokens.

    ``bos``: plain calls prepend ``<bos>`` (``tokenizer("ab").input_ids == [1, a, b]``); ``pad=False`` leaves
    the pad token unset (to test what a run does with such a model); ``model_max_length=None`` keeps
    transformers' unbounded default.  Decoding concatenates characters.
    """
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast

    vocab = {t: i for i, t in enumerate((*SPECIAL_TOKENS, *chars))}
    tk = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tk.pre_tokenizer = pre_tokenizers.Split(Regex("."), behavior="isolated")
    tk.decoder = decoders.Fuse()  # decode by plain concatenation: "4","7" -> "47"
    if bos:
        tk.post_processor = processors.TemplateProcessing(
            single="<bos> $A", pair="<bos> $A $B", special_tokens=[("<bos>", vocab["<bos>"])]
        )
    kw: dict[str, Any] = {"pad_token": "<pad>"} if pad else {}
    if model_max_length is not None:
        kw["model_max_length"] = model_max_length
    return PreTrainedTokenizerFast(
        tokenizer_object=tk, bos_token="<bos>", eos_token="<eos>", unk_token="<unk>", padding_side="right", **kw
    )


def tiny_llama_config(
    tokenizer: Any,
    *,
    hidden_size: int = 64,  # d_model
    intermediate_size: int | None = None,  # MLP width; None: 4 × hidden_size
    num_hidden_layers: int = 2,
    num_attention_heads: int = 4,  # head dim hidden_size / heads
    max_position_embeddings: int = 64,
    tie_word_embeddings: bool = True,
    **config: Any,  # any other LlamaConfig field (num_labels=1 for a reward model, rope_theta, ...)
) -> Any:
    """A LlamaConfig sized by the arguments, with the vocabulary and special-token ids of ``tokenizer``."""
    from transformers import LlamaConfig

    ids = {
        "vocab_size": len(tokenizer),
        "pad_token_id": tokenizer.pad_token_id,
        "bos_token_id": tokenizer.bos_token_id,
        "eos_token_id": tokenizer.eos_token_id,
    }
    return LlamaConfig(
        hidden_size=hidden_size,
        intermediate_size=4 * hidden_size if intermediate_size is None else intermediate_size,
        num_hidden_layers=num_hidden_layers,
        num_attention_heads=num_attention_heads,
        num_key_value_heads=config.pop("num_key_value_heads", num_attention_heads),
        max_position_embeddings=max_position_embeddings,
        tie_word_embeddings=tie_word_embeddings,
        **{**ids, **config},
    )


def tiny_causal_lm(tokenizer: Any = None, *, seed: int = 0, **config: Any) -> tuple[Any, Any]:
    """``(model, tokenizer)``: a randomly initialised ``LlamaForCausalLM`` (``torch.manual_seed(seed)``) in train mode.

    ``tokenizer`` defaults to :func:`char_tokenizer`; ``config`` goes to :func:`tiny_llama_config`.  The
    model's generation config carries the config's pad, eos and bos ids (the tokenizer's unless overridden).
    With the defaults and ``seed`` this is exactly the default task's model before its warm-up.
    """
    import torch
    from transformers import LlamaForCausalLM

    tokenizer = char_tokenizer() if tokenizer is None else tokenizer
    cfg = tiny_llama_config(tokenizer, **config)
    torch.manual_seed(seed)
    model = LlamaForCausalLM(cfg)
    model.generation_config.pad_token_id = cfg.pad_token_id
    model.generation_config.eos_token_id = cfg.eos_token_id
    model.generation_config.bos_token_id = cfg.bos_token_id
    return model, tokenizer
