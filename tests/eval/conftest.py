"""Tiny local models for the evaluation tests: a random causal LM and a random reward classifier, char tokenizer."""

from __future__ import annotations

from typing import Any

import pytest

pytest.importorskip("transformers")
pytest.importorskip("datasets")

SIZES: dict[str, Any] = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=1, tie_word_embeddings=False)


def make_causal_lm(seed: int = 0) -> tuple[Any, Any]:
    """A random 1-layer Llama (hidden 32) with the default task's character tokenizer, in eval mode."""
    from prefzoo.testing import tiny_causal_lm

    model, tok = tiny_causal_lm(seed=seed, **SIZES)
    return model.eval(), tok


@pytest.fixture(scope="session")
def causal_dirs(tmp_path_factory: pytest.TempPathFactory) -> tuple[Any, ...]:
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
def classifier_dir(tmp_path_factory: pytest.TempPathFactory) -> Any:
    """A randomly initialised LlamaForSequenceClassification (num_labels=1) with the char tokenizer."""
    import torch
    from transformers import LlamaForSequenceClassification

    from prefzoo.testing import char_tokenizer, tiny_llama_config

    tok = char_tokenizer()
    torch.manual_seed(3)
    model = LlamaForSequenceClassification(tiny_llama_config(tok, num_labels=1, max_position_embeddings=64, **SIZES))
    d = tmp_path_factory.mktemp("rm")
    model.save_pretrained(d)
    tok.save_pretrained(d)
    return d
