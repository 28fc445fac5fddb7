"""One tiny-Llama builder (prefzoo.data.tiny, public as prefzoo.testing.tiny_causal_lm): default task and tests."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("transformers")

from prefzoo.data import default as D
from prefzoo.model import default_policy as P
from prefzoo.testing import char_tokenizer, tiny_causal_lm
from tests.support.tiny import build_model, build_tokenizer


def _historical_default_model(tok, seed):
    """The default task's model exactly as prefzoo/data/default.py built it before the builder was shared."""
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        vocab_size=len(tok), hidden_size=64, intermediate_size=256, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=4, max_position_embeddings=64, tie_word_embeddings=True, pad_token_id=tok.pad_token_id,
        bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id,
    )  # fmt: skip
    torch.manual_seed(seed)
    return LlamaForCausalLM(config)


def _same_weights(a, b) -> bool:
    sa, sb = a.state_dict(), b.state_dict()
    return sa.keys() == sb.keys() and all(torch.equal(sa[k], sb[k]) for k in sa)


@pytest.mark.parametrize("seed", [0, 1])
def test_the_default_task_model_is_bit_identical_to_before(seed) -> None:
    tok = D.build_tokenizer()
    model = P.build_model(D.WarmupConfig(), tok, seed)
    old = _historical_default_model(tok, seed)
    assert _same_weights(model, old)
    assert model.config.to_dict() == old.config.to_dict()
    assert (model.generation_config.pad_token_id, model.generation_config.eos_token_id) == (0, 2)
    # the tokenizer and the cache key (which folds in the alphabet and the sizes) did not move either
    assert tok("rev abc=").input_ids == [1, 34, 21, 38, 16, 17, 18, 19, 15]  # <bos> then one id per character
    assert len(tok) == 43 and tok.decode(tok("12+3=", add_special_tokens=False).input_ids) == "12+3="
    assert D.cache_key(D.WarmupConfig(), 0) == "default-task-v2-seed0-62545d3e8e"


def test_public_builder_defaults_are_the_default_task_model() -> None:
    model, tok = tiny_causal_lm(seed=5)
    assert tok.get_vocab() == D.build_tokenizer().get_vocab()
    assert _same_weights(model, P.build_model(D.WarmupConfig(), D.build_tokenizer(), 5))
    other, _ = tiny_causal_lm(seed=6)
    assert not _same_weights(model, other)


def test_the_tests_tokenizer_and_model() -> None:
    tok = build_tokenizer()
    assert tok("ab").input_ids == [4, 5] and tok.pad_token_id == 0  # no <bos>: the trainer tests' contract
    assert build_tokenizer(pad=False).pad_token is None
    assert char_tokenizer(bos=False)("1").input_ids == [5]
    model = build_model(tok, seed=0)
    assert model.config.hidden_size == 32 and model.config.intermediate_size == 64
    assert not model.config.tie_word_embeddings and model.config.vocab_size == len(tok) == 47
