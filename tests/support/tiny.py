"""The tests' tiny model, tokenizer and preference pairs, built with the public ``prefzoo.testing.tiny_causal_lm``.

The trainer tests' tokenizer is the character tokenizer over a wider alphabet (``?.,:`` too) without ``<bos>``,
and their model is a 2-layer Llama of hidden size 32 with untied embeddings: small enough for a step in
milliseconds, and the sizes every trainer test was written against.
"""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

from prefzoo.data.tiny import char_tokenizer, tiny_causal_lm

CHARS = "abcdefghijklmnopqrstuvwxyz0123456789 =+?.,:"


def build_tokenizer(pad: bool = True) -> Any:
    """The trainer tests' character tokenizer (no ``<bos>``; ``pad=False``: no pad token set)."""
    return char_tokenizer(CHARS, pad=pad, bos=False, model_max_length=None)


def build_model(tokenizer: Any, seed: int = 0, hidden: int = 32, layers: int = 2, tied: bool = False) -> Any:
    """A random 2-layer Llama, MLP 2 × hidden, 4 heads, untied embeddings (``tied``: the LM head is the embedding)."""
    model, _ = tiny_causal_lm(
        tokenizer,
        seed=seed,
        hidden_size=hidden,
        intermediate_size=2 * hidden,
        num_hidden_layers=layers,
        max_position_embeddings=128,
        tie_word_embeddings=tied,
    )
    return model


def make_pairs(n: int, seed: int = 0) -> list[dict[str, str]]:
    """n plain pairs: 'add a+b=' prompts, the correct sum chosen, a wrong one rejected."""
    rng = random.Random(seed)
    out = []
    for i in range(n):
        a, b = rng.randint(0, 49), rng.randint(0, 49)
        wrong = a + b + rng.choice([-3, -2, -1, 1, 2, 3])
        out.append({"id": f"p{i}", "prompt": f"add {a}+{b}=", "chosen": str(a + b), "rejected": str(abs(wrong))})
    return out


def write_jsonl(path: Path, rows: list[dict[str, Any]]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def make_model_dir(root: Path, seed: int = 0, pad: bool = True, hidden: int = 32, tied: bool = False) -> Path:
    """A save_pretrained folder with the tiny model and tokenizer (``pad=False``: the tokenizer has no pad token;
    ``tied``: tied embeddings, in ``tiny-model-tied``)."""
    model = build_model(build_tokenizer(pad=True), seed, hidden=hidden, tied=tied)
    out = root / ("tiny-model-tied" if tied else "tiny-model")
    model.save_pretrained(out)
    build_tokenizer(pad=pad).save_pretrained(out)
    return out
