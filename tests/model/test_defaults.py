"""Issue 25: dropout off in the policy by default (TRL's disable_dropout); every row fitted to the model's context."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from prefzoo.model.context import ContextLengthError, fit_to_context, model_context
from prefzoo.model.defaults import disable_dropout
from tests.support.tiny import build_model, build_tokenizer, make_pairs, write_jsonl
from tests.train.helpers import base_config, run_inprocess


def gpt2(n_positions: int = 1024, dropout: float = 0.1, seed: int = 0):
    """A tiny GPT-2 (learned position embeddings, nn.Dropout everywhere) on the character tokenizer."""
    import torch
    from transformers import GPT2Config, GPT2LMHeadModel

    tok = build_tokenizer()
    torch.manual_seed(seed)
    cfg = GPT2Config(
        vocab_size=len(tok), n_positions=n_positions, n_embd=32, n_layer=2, n_head=4, resid_pdrop=dropout,
        embd_pdrop=dropout, attn_pdrop=dropout, bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id,
        pad_token_id=tok.pad_token_id,
    )  # fmt: skip
    return GPT2LMHeadModel(cfg), tok


def llama(attention_dropout: float = 0.1):
    """The tiny Llama with a config-driven (functional) attention dropout and no nn.Dropout module."""
    import torch
    from transformers import LlamaForCausalLM

    tok = build_tokenizer()
    cfg = build_model(tok).config
    cfg.attention_dropout = attention_dropout  # LlamaAttention reads it at init into self.attention_dropout
    torch.manual_seed(0)
    return LlamaForCausalLM(cfg), tok


def save(root: Path, model, tok) -> Path:
    model.save_pretrained(root)
    tok.save_pretrained(root)
    return root


@pytest.fixture(scope="module")
def gpt2_dir(tmp_path_factory) -> Path:
    return save(tmp_path_factory.mktemp("gpt2"), *gpt2())


@pytest.fixture(scope="module")
def llama_dir(tmp_path_factory) -> Path:
    return save(tmp_path_factory.mktemp("llama-dropout"), *llama())


def _first_step(model_dir: Path, pairs: Path, out: Path, **kw) -> tuple[dict[str, float], object]:
    result = run_inprocess(base_config(model_dir, pairs, out, max_steps=1, lr=1e-5, **kw))
    return result.history[0], result


# --- dropout ----------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("which", ["gpt2", "llama"])
def test_first_step_is_log2_with_zero_rewards_by_default_and_not_with_keep_dropout(
    which, gpt2_dir, llama_dir, pairs_file, tmp_path, capsys
):
    model_dir = gpt2_dir if which == "gpt2" else llama_dir
    first, _ = _first_step(model_dir, pairs_file, tmp_path / "off")
    log = capsys.readouterr().out
    # policy (train mode) and reference (eval mode) log-probs are bit-identical: β·0 rewards, −log σ(0) = log 2
    assert first["rewards/chosen"] == 0.0 and first["rewards/rejected"] == 0.0 and first["rewards/margins"] == 0.0
    assert first["loss"] == pytest.approx(math.log(2), abs=1e-7)
    assert "dropout off in the policy (TRL's disable_dropout" in log
    expected = "attn_pdrop=0.1" if which == "gpt2" else "LlamaAttention.attention_dropout=0.1"
    assert expected in log
    card = json.loads((tmp_path / "off" / "final" / "run_card.json").read_text())
    assert card["model_defaults"]["dropout"]["kept"] is False
    assert card["model_defaults"]["dropout"]["config"]  # attn_pdrop / attention_dropout recorded as turned off
    saved = json.loads((tmp_path / "off" / "final" / "config.json").read_text())  # the saved model keeps its own
    assert saved.get("attn_pdrop", saved.get("attention_dropout")) == 0.1

    noisy, _ = _first_step(model_dir, pairs_file, tmp_path / "kept", keep_dropout=True)
    assert "dropout kept on (--keep-dropout)" in capsys.readouterr().out
    assert noisy["rewards/margins"] != 0.0
    assert abs(noisy["loss"] - math.log(2)) > 1e-5


def test_disable_dropout_finds_modules_config_and_functional_rates():
    model, _ = gpt2()
    report = disable_dropout(model)
    assert report.modules[0.1] > 0 and report.config["attn_pdrop"] == 0.1
    assert all(m.p == 0.0 for m in model.modules() if isinstance(m, __import__("torch").nn.Dropout))
    assert model.config.attn_pdrop == 0.0 and model.config.resid_pdrop == 0.0
    with report.config_restored():
        assert model.config.attn_pdrop == 0.1
    assert model.config.attn_pdrop == 0.0
    lm, _ = llama()
    report = disable_dropout(lm)
    assert report.attributes == {"LlamaAttention.attention_dropout=0.1": 2}
    assert all(layer.self_attn.attention_dropout == 0.0 for layer in lm.model.layers)
    kept, _ = llama()
    assert disable_dropout(kept, keep=True).found and kept.model.layers[0].self_attn.attention_dropout == 0.1


def test_lora_dropout_stays_what_the_user_set(llama_dir, pairs_file, tmp_path):
    from torch import nn

    from prefzoo.model.loading import apply_lora

    lm, _ = llama()
    peft_model = apply_lora(lm, 4, 4, 0.3, ["q_proj", "v_proj"])  # an adapter already on the model
    report = disable_dropout(peft_model)
    lora = [m for n, m in peft_model.named_modules() if "lora_dropout" in n and isinstance(m, nn.Dropout)]
    assert lora and all(m.p == 0.3 for m in lora)
    assert report.attributes and all(layer.self_attn.attention_dropout == 0.0 for layer in lm.model.layers)
    assert 0.3 not in report.modules

    first, result = _first_step(
        llama_dir, pairs_file, tmp_path / "lora", lora=True, lora_r=4, lora_alpha=4, lora_dropout=0.3,
        lora_target_modules=["q_proj", "v_proj"],
    )  # fmt: skip
    trained = [m for n, m in result.model.named_modules() if "lora_dropout" in n and isinstance(m, nn.Dropout)]
    assert trained and all(m.p == 0.3 for m in trained)
    assert first["rewards/margins"] == 0.0  # the adapter-disabled reference equals the policy at step 0


# --- context ----------------------------------------------------------------------------------------------------


def test_fit_to_context_rules():
    model, tok = gpt2(n_positions=128)
    assert model_context(model, tok) == (128, "config max_position_embeddings=128")
    lim = fit_to_context(None, None, model, tok)
    assert (lim.max_prompt_length, lim.max_completion_length, lim.clipped) == (64, 64, True)  # half to completions
    big, _ = gpt2(n_positions=2048)
    lim = fit_to_context(None, None, big, tok)
    assert (lim.max_prompt_length, lim.max_completion_length) == (1536, 512)
    assert fit_to_context(100, None, model, tok).max_completion_length == 28  # an explicit limit is kept
    assert fit_to_context(None, 100, model, tok).max_prompt_length == 28
    assert not fit_to_context(None, None, gpt2(n_positions=4096)[0], tok).clipped  # 1800 + 512 fit
    tok.model_max_length = 96  # a real tokenizer limit is the smaller one
    assert model_context(model, tok) == (96, "tokenizer model_max_length=96")
    tok.model_max_length = int(1e30)  # transformers' "no limit" sentinel is ignored
    assert model_context(model, tok)[0] == 128
    with pytest.raises(ContextLengthError, match=r"^--max-prompt-length 4096 does not fit .* 128 tokens"):
        fit_to_context(4096, None, model, tok)
    with pytest.raises(ContextLengthError, match=r"100 \+ --max-completion-length 64 = 164 exceeds .* 128 tokens"):
        fit_to_context(100, 64, model, tok)


def _long_pairs(n: int, prompt_chars: int = 400) -> list[dict[str, str]]:
    return [
        {"id": f"l{i}", "prompt": ("abc def " * 60)[: prompt_chars - 4] + f"q{i}=", "chosen": f"{i} yes" * 8,
         "rejected": f"{i} no" * 8}
        for i in range(n)
    ]  # fmt: skip


def test_long_rows_train_on_a_128_position_gpt2_and_the_log_says_why(tmp_path, capsys):
    model_dir = save(tmp_path / "gpt2-128", *gpt2(n_positions=128))
    data = write_jsonl(tmp_path / "long.jsonl", _long_pairs(8))
    result = run_inprocess(base_config(model_dir, data, tmp_path / "out", max_steps=1))
    out = capsys.readouterr().out
    assert math.isfinite(result.history[0]["loss"])
    assert (
        "token limits: prompt 64 + completion 64 = 128, clipped from 1800 + 512 to fit the model's context of 128 "
        "tokens (config max_position_embeddings=128)" in out
    )
    assert "8 prompts / 0 completions truncated (8 pairs only because of the model's context)" in out
    assert result.data_stats["train"]["context_truncated"] == 8
    card = json.loads((tmp_path / "out" / "final" / "run_card.json").read_text())
    assert card["model_defaults"]["token_limits"]["max_prompt_length"] == 64


def test_explicit_limit_beyond_the_context_is_one_line(tmp_path, capsys):
    from prefzoo.cli.main import main

    model_dir = save(tmp_path / "gpt2-128", *gpt2(n_positions=128))
    data = write_jsonl(tmp_path / "pairs.jsonl", make_pairs(8))
    capsys.readouterr()
    rc = main(["train", "--loss", "dpo", "--model", str(model_dir), "--dataset", str(data), "--max-prompt-length",
               "4096", "--output-dir", str(tmp_path / "out"), "--no-progress", "--report-to", "none"])  # fmt: skip
    err = capsys.readouterr().err.strip()
    assert rc != 0 and len(err.splitlines()) == 1
    assert "4096" in err and "128 tokens" in err and "Traceback" not in err


def test_win_rate_generation_and_reward_accuracy_respect_the_context():
    import datasets

    from prefzoo.eval.reward import reward_accuracy
    from prefzoo.eval.winrate import win_rate

    policy, tok = gpt2(n_positions=128, seed=0)
    baseline, _ = gpt2(n_positions=128, seed=1)
    prompts = [p["prompt"] for p in _long_pairs(3, prompt_chars=200)] + ["short q="]
    res = win_rate(policy, baseline, tok, prompts, lambda p, a, b: [0.5] * len(p), max_new_tokens=16, batch_size=2)
    assert res.prompts_truncated == 3 and res.summary()["prompts_truncated"] == 3
    with pytest.raises(ValueError, match=r"max_new_tokens=128 leaves no room .* 128 tokens"):
        win_rate(policy, baseline, tok, prompts, lambda p, a, b: [0.5] * len(p), max_new_tokens=128)
    ra = reward_accuracy(policy, tok, datasets.Dataset.from_list(_long_pairs(4)), "simpo", batch_size=2)
    assert ra["max_prompt_length"] == 64 and ra["context_truncated"] == 4 and ra["pairs"] == 4


def test_adapter_disabled_reference_scores_in_eval_mode_even_with_kept_dropout():
    import torch

    from prefzoo.model.loading import apply_lora
    from prefzoo.model.logps import PolicyLogps
    from prefzoo.scoring import AdapterDisabledReference

    lm, _ = llama(attention_dropout=0.5)
    policy = PolicyLogps(apply_lora(lm, 4, 4, 0.3, ["q_proj"]))
    policy.train()  # --keep-dropout: the policy trains with its dropout on
    ids = torch.randint(4, 40, (4, 12))  # (2B, T): chosen rows then rejected rows
    completion = torch.ones_like(ids, dtype=torch.bool)
    completion[:, :6] = False
    batch = {"input_ids": ids, "attention_mask": torch.ones_like(ids), "completion_mask": completion}
    first, second = AdapterDisabledReference(policy)(batch), AdapterDisabledReference(policy)(batch)
    assert torch.equal(first[0], second[0]) and torch.equal(first[1], second[1])  # no dropout noise
    assert policy.training  # the policy's mode is restored


def test_a_run_without_lora_does_not_import_peft():
    """Dropout is turned off without importing peft when no adapter can exist (peft is not loaded): ~2 CPU s of the
    default run's first start, when nothing is byte-compiled yet (issue 16)."""
    import subprocess
    import sys

    child = (
        "import sys\n"
        "from transformers import GPT2Config, GPT2LMHeadModel\n"
        "from prefzoo.model.defaults import disable_dropout\n"
        "m = GPT2LMHeadModel(GPT2Config(n_layer=1, n_head=2, n_embd=8, vocab_size=16, n_positions=8))\n"
        "report = disable_dropout(m)\n"
        "print(sorted(k for k in sys.modules if k.split('.')[0] == 'peft'), sum(report.modules.values()) > 0)\n"
    )
    proc = subprocess.run([sys.executable, "-c", child], capture_output=True, text=True, timeout=300)
    assert proc.stdout.strip() == "[] True", proc.stdout + proc.stderr[-2000:]
