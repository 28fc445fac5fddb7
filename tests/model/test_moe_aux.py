"""A mixture-of-experts policy's router load-balancing loss is added as the architecture's own forward adds it."""

from __future__ import annotations

import json
import math

import pytest
import torch

from prefzoo.testing.architectures import build_tiny, tiny_pairs

pytest.importorskip("transformers")

COEF = 0.5  # large enough that a missing or mis-scaled router term shows in the loss


def _moe(model_type: str):
    m = build_tiny(model_type)
    m.config.output_router_logits = True
    m.config.router_aux_loss_coef = COEF
    return m


@pytest.mark.parametrize("model_type", ["mixtral", "qwen2_moe", "olmoe"])
def test_aux_term_equals_coef_times_the_models_aux_loss(model_type):
    from prefzoo.data.collate import PreferenceCollator
    from prefzoo.model.logps import PolicyLogps

    model = _moe(model_type)
    b = PreferenceCollator(0)(tiny_pairs(96))
    ids, attn, cm = b["input_ids"], b["attention_mask"], b["completion_mask"]
    with torch.no_grad():
        own = model(input_ids=ids, attention_mask=attn, output_router_logits=True).aux_loss
        policy = PolicyLogps(model, router_aux=True).train()
        out = policy(ids, attn, cm)
        policy.eval()
        evaluated = policy(ids, attn, cm)
    assert own is not None and float(own) > 0
    torch.testing.assert_close(out.aux_loss, COEF * own, atol=1e-6, rtol=1e-6)
    assert evaluated.aux_loss is None  # the router term is a training term of the policy only


def test_no_aux_term_unless_the_config_asks():
    from prefzoo.data.collate import PreferenceCollator
    from prefzoo.model.logps import PolicyLogps

    model = build_tiny("mixtral")
    model.config.output_router_logits = False
    b = PreferenceCollator(0)(tiny_pairs(96))
    with torch.no_grad():
        out = PolicyLogps(model, router_aux=True).train()(b["input_ids"], b["attention_mask"], b["completion_mask"])
    assert out.aux_loss is None


def test_one_training_step_adds_coef_times_aux(tmp_path, pairs_file):
    """Step 1 of DPO has policy = reference, so the preference loss is log 2; the logged loss adds coef × aux."""
    import datasets
    from transformers import MixtralConfig, MixtralForCausalLM

    from prefzoo.data.collate import PreferenceCollator
    from prefzoo.data.tokenize import tokenize_pairs
    from tests.support.tiny import build_tokenizer
    from tests.train.helpers import base_config, run_inprocess

    tok = build_tokenizer()

    torch.manual_seed(0)
    cfg = MixtralConfig(
        vocab_size=len(tok),
        hidden_size=32,
        intermediate_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        num_local_experts=4,
        num_experts_per_tok=2,
        max_position_embeddings=128,
        output_router_logits=True,
        router_aux_loss_coef=COEF,
        pad_token_id=tok.pad_token_id,
    )
    model = MixtralForCausalLM(cfg)
    model_dir = tmp_path / "moe"
    model.save_pretrained(model_dir)
    tok.save_pretrained(model_dir)
    n = 4
    rows = [json.loads(line) for line in pairs_file.read_text().splitlines()[:n]]
    data = tmp_path / "pairs.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    res = run_inprocess(base_config(model_dir, data, tmp_path / "out", max_steps=1, per_device_batch_size=n, lr=1e-6))
    logged = res.history[0]
    enc, _ = tokenize_pairs(datasets.Dataset.from_list(rows), tok, 1800, 512)
    b = PreferenceCollator(tok.pad_token_id)([enc[i] for i in range(len(enc))])
    with torch.no_grad():
        own = model.train()(
            input_ids=b["input_ids"], attention_mask=b["attention_mask"], output_router_logits=True
        ).aux_loss
    assert logged["aux_loss"] == pytest.approx(COEF * float(own), rel=1e-5, abs=1e-6)
    assert logged["loss"] == pytest.approx(math.log(2) + COEF * float(own), rel=1e-5, abs=1e-6)


def _composite(model, router: bool):
    """``model`` seen through a multimodal-style config: the MoE flag on its text part only, as
    ``config.get_text_config()`` returns it (the top level has no output_router_logits)."""
    from types import SimpleNamespace

    text = model.config
    text.output_router_logits = router
    config = SimpleNamespace(get_text_config=lambda *a, **k: text, model_type=text.model_type,
                             _attn_implementation="eager")  # fmt: skip
    return SimpleNamespace(config=config, get_decoder=model.get_decoder)


def test_router_loss_is_a_declared_capability_of_the_architecture():
    from prefzoo.model.arch import model_capabilities

    model = _moe("mixtral")
    assert model_capabilities(model).router_loss and model_capabilities(model).fast_path_block()
    model.config.output_router_logits = False
    assert not model_capabilities(model).router_loss and model_capabilities(model).fast_path_block() is None
    assert model_capabilities(_composite(model, True)).router_loss  # read where the architecture's forward reads it
    assert not model_capabilities(_composite(model, False)).router_loss


def test_auto_fast_paths_read_the_router_capability():
    """Prompt-heavy pairs turn prompt sharing on, unless the model declares a router loss in the objective."""
    from types import SimpleNamespace

    import datasets

    from prefzoo.data.shapes import PAIRS
    from prefzoo.train.config.sections import FastPathSection, OptimizationSection
    from prefzoo.train.setup.model import fast_paths as _fast_paths
    from prefzoo.train.setup.shape_plan import ShapePlan

    fast, opt = FastPathSection(), OptimizationSection(per_device_batch_size=2, seed=0)  # share, pack, group: auto
    loss = SimpleNamespace(spec=SimpleNamespace(batch_coupled=False))
    pairs = datasets.Dataset.from_dict({"prompt_ids": [[1] * 20] * 4, "chosen_ids": [[2] * 3] * 4,
                                        "rejected_ids": [[3] * 3] * 4})  # fmt: skip
    model = build_tiny("mixtral")
    plain = _fast_paths(fast, opt, loss, ShapePlan(PAIRS, PAIRS), pairs, _composite(model, False))
    assert plain.share_prompt, plain.line()
    moe = _fast_paths(fast, opt, loss, ShapePlan(PAIRS, PAIRS), pairs, _composite(model, True))
    assert not (moe.share_prompt or moe.packing or moe.group_by_length) and "MoE router loss" in moe.line()
