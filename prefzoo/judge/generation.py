"""Batched, deterministic text generation from a causal LM for the win-rate (greedy or seeded sampling)."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator, Sequence
from typing import Any

from prefzoo.data.chat import Prompt, render_prompt
from prefzoo.model import unwrap

__all__ = ["generate", "padding_side", "prompt_budget"]

log = logging.getLogger(__name__)


@contextlib.contextmanager
def padding_side(tokenizer: Any, side: str) -> Iterator[Any]:
    """``tokenizer`` padding on ``side`` ("left" or "right") inside the block, its own side restored afterwards."""
    old = tokenizer.padding_side
    tokenizer.padding_side = side
    try:
        yield tokenizer
    finally:
        tokenizer.padding_side = old


def prompt_budget(model: Any, tokenizer: Any, max_new_tokens: int) -> tuple[int | None, str]:
    """(prompt tokens that fit beside ``max_new_tokens`` in the model's context or None when it declares none, why).

    ``max_new_tokens`` that leaves no room for a prompt is a ValueError naming both numbers.
    """
    from prefzoo.model import model_context

    context, source = model_context(unwrap(model), tokenizer)
    if context is None:
        return None, source
    if max_new_tokens >= context:
        raise ValueError(
            f"max_new_tokens={max_new_tokens} leaves no room for a prompt in the model's context of {context} tokens "
            f"({source}); lower it below {context}"
        )
    return context - max_new_tokens, f"the model's context of {context} tokens ({source})"


def _generated_lengths(new: Any, eos_id: int | None) -> list[int]:
    """Tokens each row generated before its first eos (what follows the eos is padding): (b, T_new) -> b ints."""
    T = new.shape[1]
    if eos_id is None:
        return [T] * new.shape[0]
    is_eos = new == eos_id  # (b, T_new)
    first = is_eos.int().argmax(dim=1)  # (b,) first eos, 0 when none
    return [int(f) if bool(row.any()) else T for f, row in zip(first, is_eos, strict=True)]


def generate(
    model: Any,
    tokenizer: Any,
    prompts: Sequence[Prompt],
    *,
    max_new_tokens: int = 64,
    batch_size: int = 32,
    do_sample: bool = False,
    temperature: float = 1.0,
    top_p: float = 1.0,
    seed: int = 0,
    report: dict[str, Any] | None = None,
) -> list[str]:
    """Completions (decoded, special tokens dropped) for ``prompts``, in order.

    Greedy by default, so the result depends only on the weights.  With
    ``do_sample=True`` each batch ``i`` samples under ``torch.manual_seed(seed + i)``
    inside a forked RNG, so a run is reproducible and the caller's RNG state is
    untouched.  Prompts are left-padded; the model is put in eval mode and
    restored afterwards.  Each prompt is rendered exactly as training renders it
    (:func:`prefzoo.data.chat.render_prompt`: a string as given, a conversation
    through the chat template with the generation prompt).  A prompt longer than the model's context minus
    ``max_new_tokens`` keeps its end (as in training); how many were cut is logged and, when ``report`` is a dict,
    stored in ``report["prompts_truncated"]`` with the budget in ``report["prompt_budget"]``, the number of tokens
    each prompt generated before its eos in ``report["new_tokens"]`` and those tokens in ``report["token_ids"]``.
    """
    pad_id = _checked_pad_id(tokenizer, prompts, max_new_tokens)
    model = unwrap(model)
    budget, why = prompt_budget(model, tokenizer, max_new_tokens)
    truncated = 0
    device = next(model.parameters()).device
    was_training = model.training
    model.eval()
    out: list[str] = []
    lengths: list[int] = []  # generated tokens per prompt, before the first eos (at most max_new_tokens)
    token_ids: list[list[int]] = []  # those tokens
    kw = _generate_kwargs(max_new_tokens, do_sample, temperature, top_p)
    try:
        with padding_side(tokenizer, "left"):
            for i in range(0, len(prompts), batch_size):
                enc, cut = _encode_chunk(tokenizer, prompts[i : i + batch_size], device, budget)
                truncated += cut
                new = _generate_chunk(model, tokenizer, enc, pad_id, kw, seed + i // batch_size)  # (b, T_new)
                out.extend(tokenizer.batch_decode(new, skip_special_tokens=True))
                got = _generated_lengths(new, tokenizer.eos_token_id)
                lengths.extend(got)
                token_ids.extend(row[:n].tolist() for row, n in zip(new, got, strict=True))
    finally:
        model.train(was_training)
    if truncated:
        log.warning(
            "generate: %d of %d prompts cut to their last %d tokens so that prompt + max_new_tokens=%d fits %s",
            truncated, len(prompts), budget, max_new_tokens, why,
        )  # fmt: skip
    if report is not None:
        report.update(prompts_truncated=truncated, prompt_budget=budget, new_tokens=lengths, token_ids=token_ids)
    return out


def _checked_pad_id(tokenizer: Any, prompts: Sequence[Prompt], max_new_tokens: int) -> int:
    """Refuses empty ``prompts`` and ``max_new_tokens`` < 1; the id to pad with: the pad token, else the eos token."""
    if not prompts:
        raise ValueError("generate: prompts is empty; pass at least one prompt")
    if max_new_tokens < 1:
        raise ValueError(f"generate: max_new_tokens={max_new_tokens} must be >= 1")
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    if pad_id is None:
        raise ValueError("generate: the tokenizer has neither a pad nor an eos token; set tokenizer.pad_token")
    return pad_id


def _generate_kwargs(max_new_tokens: int, do_sample: bool, temperature: float, top_p: float) -> dict[str, Any]:
    """``model.generate``'s decoding arguments: seeded sampling with ``temperature``/``top_p``, else greedy."""
    kw: dict[str, Any] = {"max_new_tokens": max_new_tokens, "do_sample": do_sample}
    if do_sample:
        kw.update(temperature=temperature, top_p=top_p, top_k=0)
    else:
        kw.update(temperature=None, top_p=None, top_k=None)
    return kw


def _encode_chunk(tokenizer: Any, chunk: Sequence[Prompt], device: Any, budget: int | None) -> tuple[Any, int]:
    """A batch of rendered prompts, left-padded on ``device``, cut to their last ``budget`` tokens; the count cut."""
    enc = tokenizer.pad(
        {"input_ids": [render_prompt(tokenizer, p) for p in chunk]}, padding=True, return_tensors="pt"
    ).to(device)  # left-padded (B, T_prompt) input_ids and attention_mask
    truncated = 0
    if budget is not None and enc["input_ids"].shape[1] > budget:  # left-padded: the ends are last
        truncated = int((enc["attention_mask"].sum(dim=1) > budget).sum())
        enc = {k: v[:, -budget:] for k, v in enc.items()}  # (b, budget)
    return enc, truncated


def _generate_chunk(model: Any, tokenizer: Any, enc: Any, pad_id: int, kw: dict[str, Any], seed: int) -> Any:
    """The new tokens (b, T_new) generated for one encoded batch under ``torch.manual_seed(seed)`` in a forked RNG."""
    import torch

    with torch.random.fork_rng(devices=[]), torch.no_grad():
        torch.manual_seed(seed)
        ids = model.generate(
            **enc, pad_token_id=pad_id, eos_token_id=tokenizer.eos_token_id, **kw
        )  # (b, T_prompt + T_new)
    return ids[:, enc["input_ids"].shape[1] :]  # (b, T_new)
