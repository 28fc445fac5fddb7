"""Batched, deterministic text generation from a causal LM for the win-rate (greedy or seeded sampling)."""

from __future__ import annotations

from typing import Any

__all__ = ["generate", "unwrap_model"]


def unwrap_model(model: Any) -> Any:
    """The bare transformers model inside a DDP/accelerate/DeepSpeed wrapper."""
    while hasattr(model, "module") and not hasattr(model, "generate"):
        model = model.module
    return model


def generate(
    model: Any,
    tokenizer: Any,
    prompts: list[str],
    *,
    max_new_tokens: int = 64,
    batch_size: int = 32,
    do_sample: bool = False,
    temperature: float = 1.0,
    top_p: float = 1.0,
    seed: int = 0,
) -> list[str]:
    """Completions (decoded, special tokens dropped) for ``prompts``, in order.

    Greedy by default, so the result depends only on the weights.  With
    ``do_sample=True`` each batch ``i`` samples under ``torch.manual_seed(seed + i)``
    inside a forked RNG, so a run is reproducible and the caller's RNG state is
    untouched.  Prompts are left-padded; the model is put in eval mode and
    restored afterwards.
    """
    import torch

    if not prompts:
        raise ValueError("generate: prompts is empty; pass at least one prompt")
    if max_new_tokens < 1:
        raise ValueError(f"generate: max_new_tokens={max_new_tokens} must be >= 1")
    model = unwrap_model(model)
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    if pad_id is None:
        raise ValueError("generate: the tokenizer has neither a pad nor an eos token; set tokenizer.pad_token")
    device = next(model.parameters()).device
    was_training, old_side = model.training, tokenizer.padding_side
    model.eval()
    tokenizer.padding_side = "left"
    out: list[str] = []
    try:
        for i in range(0, len(prompts), batch_size):
            chunk = prompts[i : i + batch_size]
            enc = tokenizer(chunk, return_tensors="pt", padding=True).to(device)
            kw: dict[str, Any] = {"max_new_tokens": max_new_tokens, "do_sample": do_sample}
            if do_sample:
                kw.update(temperature=temperature, top_p=top_p, top_k=0)
            else:
                kw.update(temperature=None, top_p=None, top_k=None)
            with torch.random.fork_rng(devices=[]), torch.no_grad():
                torch.manual_seed(seed + i // batch_size)
                ids = model.generate(
                    **enc, pad_token_id=pad_id, eos_token_id=tokenizer.eos_token_id, **kw
                )  # (b, T_prompt + T_new)
            new = ids[:, enc["input_ids"].shape[1] :]  # (b, T_new)
            out.extend(tokenizer.batch_decode(new, skip_special_tokens=True))
    finally:
        tokenizer.padding_side = old_side
        model.train(was_training)
    return out
