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


def test_a_sliding_window_switched_off_by_default_is_switched_on_for_one_of_the_two_layers():
    """Qwen2's default config has ``use_sliding_window=False``: the tiny one turns it on past layer 0, so the sweep
    tests the window it would otherwise never reach."""
    cfg = tiny_config("qwen2")
    assert cfg.use_sliding_window is True and cfg.max_window_layers == 1
    assert cfg.layer_types == ["full_attention", "sliding_attention"]


def test_grouped_query_attention_is_kept_where_the_config_has_it():
    """Two key/value heads for four query heads: the sweep exercises GQA's repeated heads, not plain multi-head."""
    cfg = tiny_config("llama")
    assert (cfg.num_attention_heads, cfg.num_key_value_heads) == (4, 2)


@pytest.mark.parametrize(
    ("model_type", "why"),
    [
        ("lfm2_moe", "layer_types settable but None by default: left for the config to derive"),
        ("jamba", "layer_types a read-only property: derived from the config's own periods"),
        ("falcon_mamba", "layer_types a read-only property of a model without attention layers"),
    ],
)
def test_layer_types_are_only_rebuilt_where_the_config_lists_them_and_lets_them_be_set(model_type, why):
    """The mixed full/sliding pattern is written only into a non-empty, settable list: elsewhere the tiny config is the
    config's own, shrunk to two layers, and it builds."""
    from transformers import CONFIG_MAPPING

    if model_type not in CONFIG_MAPPING:
        pytest.skip(f"this transformers has no {model_type!r} config")
    cfg = tiny_config(model_type)
    assert cfg.num_hidden_layers == 2, why
    types = getattr(cfg, "layer_types", None)
    assert types is None or len(types) == 2, (why, types)


def test_a_model_that_writes_to_stdout_while_it_is_built_is_built_quietly(monkeypatch, capsys):
    """Some model classes print while they are built; the sweep's report is on stdout, so build_tiny catches their
    output (``print`` and ``sys.stdout.write`` alike) in both of its builds, the size check on the meta device and the
    real one."""
    import sys

    from transformers import LlamaForCausalLM

    from prefzoo.testing.architectures import build_tiny

    init, builds = LlamaForCausalLM.__init__, []

    def chatty(self, *args, **kw):
        builds.append(1)
        print("building", end="; ")
        sys.stdout.write("built\n")
        init(self, *args, **kw)

    monkeypatch.setattr(LlamaForCausalLM, "__init__", chatty)
    model = build_tiny("llama")
    assert capsys.readouterr().out == "" and len(builds) == 2 and not model.training


def test_tiny_pairs_are_the_seed_0_draw_by_default_with_the_documented_lengths():
    """The sweep's default pairs are reproducible: the seed-0 draw, ids above the three special tokens."""
    from prefzoo.testing.architectures import tiny_pairs

    pairs = tiny_pairs(96)
    assert pairs == tiny_pairs(96, seed=0) and pairs != tiny_pairs(96, seed=1)
    lengths = [(len(p["prompt_ids"]), len(p["chosen_ids"]), len(p["rejected_ids"])) for p in pairs]
    assert lengths == [(10, 9, 7), (6, 3, 8), (8, 5, 5)]
    assert all(3 <= t < 96 for p in pairs for k in ("prompt_ids", "chosen_ids", "rejected_ids") for t in p[k])


def test_a_head_over_part_of_the_vocabulary_is_kept_smaller_and_the_pairs_stay_below_it():
    """Inkling 2's head covers ``unpadded_vocab_size`` rows of a larger embedding table (200,058 of 201,024).  The
    tiny one keeps a smaller head (not the full 200,058 rows, which made it too big to build), and the sweep's pairs
    draw their ids below it, as real data never holds the padded ids; a model without the field is left as it is.
    Inkling 1 has the field too (None by default) but cuts its logits in forward: the tiny one sets it, so the
    sweep checks the cut, and its pairs stay below it as well."""
    pytest.importorskip("transformers.models.inkling2")
    pytest.importorskip("transformers.models.inkling")
    from prefzoo.testing.architectures import VOCAB, _token_range, build_tiny, check_architecture

    model = build_tiny("inkling2_text")
    assert model.get_input_embeddings().num_embeddings == VOCAB
    assert model.get_output_embeddings().out_features == _token_range(model) == VOCAB - 6
    assert _token_range(build_tiny("llama")) == VOCAB
    inkling1 = build_tiny("inkling_text")
    assert inkling1.config.unpadded_vocab_size == _token_range(inkling1) == VOCAB - 6
    assert inkling1.get_output_embeddings().out_features == VOCAB  # the whole table: the forward cuts the logits
    assert check_architecture("inkling2_text").status == "pass"
    assert check_architecture("inkling_text").status == "pass"


def test_a_model_too_big_after_shrinking_is_refused_with_its_size_in_millions(monkeypatch):
    """The sweep's skip reason says how big the shrunk model still is, in millions of parameters, and the limit."""
    from prefzoo.testing import architectures

    n = sum(p.numel() for p in architectures.build_tiny("llama").parameters())
    monkeypatch.setattr(architectures, "MAX_PARAMS", 1000)
    with pytest.raises(architectures.TinyBuildError) as e:
        architectures.build_tiny("llama")
    assert str(e.value) == f"{n / 1e6:.1f}M parameters after shrinking the known size fields (limit 1,000)"
    assert 0.005 < n / 1e6 < 0.5  # a tiny model: the message reads 0.0xM, not a power of ten off
