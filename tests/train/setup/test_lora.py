"""LoRA: the adapter-disabled reference is exactly the base model; adapters save and reload; bad targets error."""

from __future__ import annotations

import pytest
import torch

from prefzoo.data.collate import PreferenceCollator
from prefzoo.model.loading import LoRATargetError, apply_lora
from prefzoo.model.logps import PolicyLogps
from prefzoo.scoring import AdapterDisabledReference
from tests.train.helpers import base_config, run_inprocess


def _batch(tok):
    ex = [
        {"id": "a", "prompt_ids": [5, 6, 7], "chosen_ids": [8, 9, 2], "rejected_ids": [10, 2]},
        {"id": "b", "prompt_ids": [5], "chosen_ids": [11, 12, 2], "rejected_ids": [13, 14, 15, 2]},
    ]
    return PreferenceCollator(tok.pad_token_id)(ex)


def _perturbed_lora(model):
    lm = apply_lora(model, r=4, alpha=8, dropout=0.0, target_modules=["q_proj", "v_proj", "down_proj"])
    with torch.no_grad():
        for n, p in lm.named_parameters():
            if "lora_B" in n:
                p.normal_(0, 0.5)  # make the adapter matter (lora_B starts at zero)
    return lm


@pytest.mark.parametrize("mode", ["train", "eval"])
def test_disabled_adapter_reference_equals_base_exactly(mode):
    from tests.support.tiny import build_model, build_tokenizer

    tok = build_tokenizer()
    base = build_model(tok, seed=3)
    b = _batch(tok)
    with torch.no_grad():
        base_out = PolicyLogps(base.eval())(b["input_ids"], b["attention_mask"], b["completion_mask"]).logps
    lm = _perturbed_lora(build_model(tok, seed=3))
    policy = PolicyLogps(lm)
    policy.train(mode == "train")
    ref_w, ref_l = AdapterDisabledReference(policy)(b)
    assert torch.equal(torch.cat([ref_w, ref_l]), base_out)  # bit-identical
    with torch.no_grad():
        adapted = policy(b["input_ids"], b["attention_mask"], b["completion_mask"]).logps
    assert not torch.allclose(adapted, base_out)  # the adapter is active outside the context


def test_missing_target_modules_are_named():
    from tests.support.tiny import build_model, build_tokenizer

    with pytest.raises(LoRATargetError, match=r"\['qkv'\].*q_proj"):
        apply_lora(build_model(build_tokenizer()), 4, 4, 0.0, ["q_proj", "qkv"])


def test_lora_training_saves_adapter_that_reloads(tmp_path, tiny_dir, pairs_file):
    from peft import AutoPeftModelForCausalLM

    cfg = base_config(
        tiny_dir,
        pairs_file,
        tmp_path / "run",
        lora=True,
        lora_r=4,
        lora_alpha=8,
        max_steps=3,
        lr=1e-2,
        lora_target_modules=["q_proj", "v_proj"],
    )
    res = run_inprocess(cfg)
    final = res.final_dir
    assert (final / "adapter_config.json").is_file() and (final / "adapter_model.safetensors").is_file()
    assert not (final / "model.safetensors").exists()  # only the adapter, not a second full copy
    reloaded = AutoPeftModelForCausalLM.from_pretrained(str(final))
    trained = {k: v for k, v in res.model.state_dict().items() if "lora_" in k}
    got = {k: v for k, v in reloaded.state_dict().items() if "lora_" in k}
    assert trained.keys() == got.keys() and len(trained) > 0
    for k in trained:
        assert torch.equal(trained[k], got[k]), k
    assert any(not torch.equal(v, torch.zeros_like(v)) for k, v in got.items() if "lora_B" in k)


def test_merged_lora_and_continuing_from_an_adapter(tmp_path, tiny_dir, pairs_file):
    """--merge-lora saves a plain model; a starting model with an adapter trains it with a frozen reference."""
    from transformers import AutoModelForCausalLM

    cfg = base_config(
        tiny_dir,
        pairs_file,
        tmp_path / "a",
        lora=True,
        lora_r=4,
        lora_alpha=8,
        max_steps=2,
        lr=1e-2,
        lora_target_modules=["q_proj", "v_proj"],
    )
    first = run_inprocess(cfg)
    merged = run_inprocess({**cfg, "output_dir": str(tmp_path / "m"), "merge_lora": True})
    assert (merged.final_dir / "model.safetensors").is_file()
    AutoModelForCausalLM.from_pretrained(str(merged.final_dir))
    cont = run_inprocess(base_config(first.final_dir, pairs_file, tmp_path / "b", max_steps=2, lr=1e-2))
    assert cont.global_step == 2 and hasattr(cont.model, "peft_config")
