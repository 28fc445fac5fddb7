"""Tiny local fixtures for trainer tests: a character tokenizer, a 2-layer Llama, and preference pairs on disk."""

from __future__ import annotations

import json
import random
from pathlib import Path

CHARS = "abcdefghijklmnopqrstuvwxyz0123456789 =+?.,:"


def build_tokenizer(pad: bool = True):
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    specials = ["<pad>", "<bos>", "<eos>", "<unk>"]
    vocab = {t: i for i, t in enumerate(specials + list(CHARS))}
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Split("", behavior="isolated")
    kw = {"pad_token": "<pad>"} if pad else {}
    return PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<bos>", eos_token="<eos>", unk_token="<unk>", **kw)


def build_model(tokenizer, seed: int = 0, hidden: int = 32, layers: int = 2):
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    cfg = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=hidden,
        intermediate_size=2 * hidden,
        num_hidden_layers=layers,
        num_attention_heads=4,
        num_key_value_heads=4,
        max_position_embeddings=128,
        pad_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.eos_token_id,
        bos_token_id=tokenizer.bos_token_id,
    )
    return LlamaForCausalLM(cfg)


def make_pairs(n: int, seed: int = 0) -> list[dict[str, str]]:
    """n plain pairs: 'add a+b=' prompts, the correct sum chosen, a wrong one rejected."""
    rng = random.Random(seed)
    out = []
    for i in range(n):
        a, b = rng.randint(0, 49), rng.randint(0, 49)
        wrong = a + b + rng.choice([-3, -2, -1, 1, 2, 3])
        out.append({"id": f"p{i}", "prompt": f"add {a}+{b}=", "chosen": str(a + b), "rejected": str(abs(wrong))})
    return out


def write_jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def make_model_dir(root: Path, seed: int = 0, pad: bool = True, hidden: int = 32) -> Path:
    """A save_pretrained folder with the tiny model and tokenizer."""
    tok = build_tokenizer(pad=True)
    model = build_model(tok, seed, hidden=hidden)
    out = root / "tiny-model"
    model.save_pretrained(out)
    if not pad:
        tok = build_tokenizer(pad=False)
    tok.save_pretrained(out)
    return out
