"""Tiny local models for the evaluation tests: a random causal LM and a random reward classifier, char tokenizer."""

from __future__ import annotations

import os

import pytest

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")

pytest.importorskip("transformers")
pytest.importorskip("datasets")


def _config(tok, **kw):
    from transformers import LlamaConfig

    return LlamaConfig(
        vocab_size=len(tok), hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=4,
        num_key_value_heads=4, max_position_embeddings=64, pad_token_id=tok.pad_token_id,
        bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id, **kw,
    )  # fmt: skip


def make_causal_lm(seed: int = 0):
    import torch
    from transformers import LlamaForCausalLM

    from prefzoo.data.default import build_tokenizer

    tok = build_tokenizer()
    torch.manual_seed(seed)
    return LlamaForCausalLM(_config(tok)).eval(), tok


@pytest.fixture(scope="session")
def causal_dirs(tmp_path_factory):
    """Two different random tiny causal LMs saved with the tokenizer: (policy_dir, baseline_dir)."""
    out = []
    for seed in (0, 1):
        model, tok = make_causal_lm(seed)
        d = tmp_path_factory.mktemp(f"lm{seed}")
        model.save_pretrained(d)
        tok.save_pretrained(d)
        out.append(d)
    return tuple(out)


@pytest.fixture(scope="session")
def classifier_dir(tmp_path_factory):
    """A randomly initialised LlamaForSequenceClassification (num_labels=1) with the char tokenizer."""
    import torch
    from transformers import LlamaForSequenceClassification

    from prefzoo.data.default import build_tokenizer

    tok = build_tokenizer()
    torch.manual_seed(3)
    model = LlamaForSequenceClassification(_config(tok, num_labels=1))
    d = tmp_path_factory.mktemp("rm")
    model.save_pretrained(d)
    tok.save_pretrained(d)
    return d
