"""The sweep's tiny models keep what makes an architecture hard: a model whose config lists per-layer attention types
gets both a full and a sliding-window layer in its two layers (a default pattern such as Gemma 3's five sliding
layers per full one would leave the tiny model with no full layer, or no sliding one)."""

from __future__ import annotations

import pytest

pytest.importorskip("transformers")

from prefzoo.testing.architectures import tiny_config


@pytest.mark.parametrize("model_type", ["gemma2", "gemma3_text", "cohere2", "olmo3"])
def test_tiny_configs_mix_full_and_sliding_attention(model_type):
    cfg = tiny_config(model_type)
    assert cfg.num_hidden_layers == 2 and set(cfg.layer_types) == {"full_attention", "sliding_attention"}, (
        cfg.num_hidden_layers, cfg.layer_types)
