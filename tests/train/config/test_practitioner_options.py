"""The options a TRL user expects (issue 16): checkpointing, dtype, attention kernel, QLoRA, eval/save/schedule
options, fractional epochs, TRL's metric names."""

from __future__ import annotations

import json
import math

import pytest
import torch

from prefzoo.cli.main import main
from prefzoo.model.loading import LoadOptionError, enable_gradient_checkpointing, load_kwargs
from prefzoo.model.logps import PolicyLogps, sequence_logps
from prefzoo.train.config import ConfigError, TrainConfig
from prefzoo.train.setup.optimizer import build_schedule
from tests.support.tiny import build_model, build_tokenizer
from tests.train.helpers import base_config, max_param_diff, params_of, run_inprocess


def _batch(tok, n=3):
    rows = [("add 1+2=", "3"), ("add 10+20=", "30"), ("add 7+8=", "15")][:n]
    ids = [tok(p + c)["input_ids"] + [tok.eos_token_id] for p, c in rows]
    plen = [len(tok(p)["input_ids"]) for p, _ in rows]
    t = max(map(len, ids))
    input_ids = torch.tensor([x + [tok.pad_token_id] * (t - len(x)) for x in ids])
    attn = torch.tensor([[1] * len(x) + [0] * (t - len(x)) for x in ids])
    comp = torch.tensor([[0] * p + [1] * (len(x) - p) + [0] * (t - len(x)) for x, p in zip(ids, plen, strict=True)])
    return input_ids, attn, comp


def _grads(model, frozen_embeddings: bool):
    model.train()
    model.get_input_embeddings().weight.requires_grad_(not frozen_embeddings)
    model.zero_grad()
    tok = build_tokenizer()
    lp = PolicyLogps(model)(*_batch(tok))
    (lp.logps * torch.tensor([1.0, -0.5, 2.0])).sum().backward()
    return {n: p.grad.clone() for n, p in model.named_parameters() if p.requires_grad}


@pytest.mark.parametrize("frozen_embeddings", [False, True])  # frozen: the LoRA case (no input needs a gradient)
def test_gradient_checkpointing_gives_the_same_gradients_and_recomputes(frozen_embeddings):
    tok = build_tokenizer()
    plain, ckpt = build_model(tok, seed=1), build_model(tok, seed=1)
    enable_gradient_checkpointing(ckpt)
    calls, mlp = [], ckpt.model.layers[0].mlp
    forward = mlp.forward
    mlp.forward = lambda *a, **k: calls.append(1) or forward(*a, **k)  # counts recomputation (hooks do not)
    g_plain, g_ckpt = _grads(plain, frozen_embeddings), _grads(ckpt, frozen_embeddings)
    assert g_plain.keys() == g_ckpt.keys() and len(g_plain) > 10
    for k in g_plain:
        assert torch.allclose(g_plain[k], g_ckpt[k], atol=1e-6, rtol=1e-5), k
    assert len(calls) == 2  # forward + recomputation in backward: checkpointing is really on
    # non-reentrant (transformers would otherwise make the embeddings' output require grad to make reentrant work)
    assert ckpt.model.layers[0]._gradient_checkpointing_func.keywords == {"use_reentrant": False}


def test_gradient_checkpointing_run_equals_a_plain_run(tmp_path, tiny_dir, pairs_file, capsys):
    plain = run_inprocess(base_config(tiny_dir, pairs_file, tmp_path / "plain"))
    ckpt = run_inprocess(base_config(tiny_dir, pairs_file, tmp_path / "ckpt", gradient_checkpointing=True))
    assert "gradient checkpointing on (non-reentrant)" in capsys.readouterr().out
    assert max_param_diff(params_of(plain.model), params_of(ckpt.model)) < 1e-6
    layers = ckpt.model.model.layers
    assert all(layer.gradient_checkpointing for layer in layers)


def test_torch_dtype_loads_the_weights_in_that_dtype_and_trains(tmp_path, tiny_dir, pairs_file):
    res = run_inprocess(base_config(tiny_dir, pairs_file, tmp_path, torch_dtype="bfloat16", loss="simpo", max_steps=2))
    assert {p.dtype for p in res.model.parameters()} == {torch.bfloat16}
    assert all(math.isfinite(h["loss"]) for h in res.history)


def test_float16_weights_train_only_adapters(tmp_path, tiny_dir, pairs_file):
    """Full fine-tuning of float16 weights with AdamW breaks (eps underflows): a one-line error; LoRA trains."""
    with pytest.raises(ConfigError, match="torch_dtype=float16 without --lora: AdamW cannot update float16"):
        TrainConfig(torch_dtype="float16")
    kw = dict(torch_dtype="float16", lora=True, lora_target_modules=["q_proj", "v_proj"], loss="simpo", max_steps=3)
    res = run_inprocess(base_config(tiny_dir, pairs_file, tmp_path, **kw))
    dtypes = {n: p.dtype for n, p in res.model.named_parameters()}
    assert dtypes["base_model.model.model.layers.0.mlp.up_proj.weight"] == torch.float16
    assert {d for n, d in dtypes.items() if "lora_" in n} == {torch.float32}  # peft keeps adapters in float32
    assert len(res.history) == 3 and all(math.isfinite(h["loss"]) for h in res.history)


def test_torch_dtype_auto_keeps_the_checkpoint_s_dtype_and_bad_values_are_one_line(tmp_path, tiny_dir):
    assert load_kwargs("auto")["dtype"] == "auto" and load_kwargs("bfloat16")["dtype"] is torch.bfloat16
    with pytest.raises(ConfigError, match="torch_dtype='fp8': choose float32, bfloat16, float16 or auto"):
        TrainConfig(torch_dtype="fp8")


def test_attn_implementation_reaches_the_model_and_flash_attention_names_the_fix(tmp_path, tiny_dir, pairs_file):
    res = run_inprocess(base_config(tiny_dir, pairs_file, tmp_path, attn_implementation="eager", max_steps=1))
    assert res.model.config._attn_implementation == "eager"
    with pytest.raises(LoadOptionError, match=r"needs a CUDA GPU .* use --attn-implementation sdpa"):
        load_kwargs("bfloat16", "flash_attention_2", cuda=False)


def test_flash_attention_on_cpu_is_a_one_line_cli_error(tmp_path, tiny_dir, pairs_file, capsys):
    cfg = ["--model", str(tiny_dir), "--dataset", str(pairs_file), "--output-dir", str(tmp_path), "--report-to",
           "none", "--attn-implementation", "flash_attention_2"]  # fmt: skip
    assert main(["train", *cfg]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "flash_attention_2 needs a CUDA GPU" in err and "sdpa" in err, err


def _bitsandbytes_runs() -> str | None:
    """Why bitsandbytes' quantised layers cannot run here, or None."""
    try:
        import bitsandbytes as bnb

        layer = bnb.nn.Linear4bit(64, 64, compute_dtype=torch.float32)
        layer.weight = bnb.nn.Params4bit(layer.weight.data, requires_grad=False, quant_type="nf4")
        layer = layer.to("cpu")
        layer(torch.randn(2, 64))
    except Exception as e:
        return f"bitsandbytes cannot run a 4-bit layer here: {type(e).__name__}: {str(e)[:120]}"
    return None


@pytest.mark.parametrize("bits", [4, 8])
def test_qlora_trains_adapters_on_quantised_base_weights(tmp_path, pairs_file, bits, capsys):
    pytest.importorskip("peft")
    reason = _bitsandbytes_runs()
    if reason:
        pytest.skip(reason)
    import bitsandbytes as bnb

    from tests.support.tiny import make_model_dir

    model_dir = make_model_dir(tmp_path, hidden=64)
    kw = {f"load_in_{bits}bit": True, "lora": True, "lora_r": 4, "lora_alpha": 8, "max_steps": 2, "lr": 1e-2}
    res = run_inprocess(base_config(model_dir, pairs_file, tmp_path / "run", **kw))
    kind = bnb.nn.Linear4bit if bits == 4 else bnb.nn.Linear8bitLt
    quantised = [n for n, m in res.model.named_modules() if isinstance(m, kind)]
    assert quantised and all("lora" not in n for n in quantised)
    lora_b = [p for n, p in res.model.named_parameters() if "lora_B" in n]
    assert lora_b and any(float(p.detach().abs().max()) > 0 for p in lora_b)  # B starts at 0: the adapters trained
    assert all(math.isfinite(h["loss"]) for h in res.history)
    assert f"base weights in {'4-bit NF4' if bits == 4 else '8-bit'}" in capsys.readouterr().out


def test_quantised_loading_needs_lora_and_one_width():
    with pytest.raises(ConfigError, match="load_in_4bit needs --lora"):
        TrainConfig(load_in_4bit=True)
    with pytest.raises(ConfigError, match="both set"):
        TrainConfig(load_in_4bit=True, load_in_8bit=True, lora=True)


def test_eval_steps_evaluates_every_n_steps_and_once_at_the_end(tmp_path, tiny_dir, pairs_file):
    kw = dict(max_steps=5, eval_fraction=0.2, eval_steps=2)
    res = run_inprocess(base_config(tiny_dir, pairs_file, tmp_path / "a", **kw))
    assert [e["step"] for e in res.evals] == [2, 4, 5]
    off = run_inprocess(base_config(tiny_dir, pairs_file, tmp_path / "b", **{**kw, "eval_steps": 0}))
    assert [e["step"] for e in off.evals] == [5]


def test_save_only_model_checkpoints_are_model_folders_and_refuse_to_resume(tmp_path, tiny_dir, pairs_file):
    from transformers import AutoModelForCausalLM

    out = tmp_path / "run"
    cfg = base_config(tiny_dir, pairs_file, out, max_steps=4, save_steps=2, save_only_model=True)
    res = run_inprocess(cfg)
    ckpt = out / "checkpoints" / "step-00000004"
    names = {p.name for p in ckpt.iterdir()}
    assert {"model.safetensors", "config.json", "tokenizer_config.json"} <= names
    assert not any(n.startswith(("optimizer", "scheduler", "random_states")) for n in names), names
    loaded = AutoModelForCausalLM.from_pretrained(ckpt)
    assert max_param_diff(params_of(loaded), params_of(res.model)) == 0
    from prefzoo.train.checkpoint.save import ResumeError

    with pytest.raises(ResumeError, match=r"--save-only-model .* cannot be resumed; start a new run from it"):
        run_inprocess({**cfg, "max_steps": 6, "resume": str(out / "checkpoints" / "step-00000002")})


def test_fractional_epochs_stop_part_way_and_log_a_fractional_epoch(tmp_path, tiny_dir, pairs_file):
    # 64 pairs / 4 per step = 16 steps per epoch
    res = run_inprocess(base_config(tiny_dir, pairs_file, tmp_path, max_steps=None, epochs=0.25))
    assert res.global_step == 4
    assert [h["epoch"] for h in res.history] == [0.0625, 0.125, 0.1875, 0.25]
    assert TrainConfig.from_dict({"epochs": "1.5"}).epochs == 1.5
    with pytest.raises(ConfigError, match=r"epochs=0\.0 must be > 0"):
        TrainConfig.from_dict({"epochs": 0.0})


def test_trl_metric_names_are_logged(tmp_path, tiny_dir, pairs_file):
    run_inprocess(base_config(tiny_dir, pairs_file, tmp_path, max_steps=2, lr=1e-3, warmup_ratio=0.0,
                              lr_scheduler_type="constant"))  # fmt: skip
    step = json.loads((tmp_path / "metrics.jsonl").read_text().splitlines()[0])
    names = ["rewards/chosen", "rewards/rejected", "rewards/accuracies", "rewards/margins", "logps/chosen",
             "logps/rejected", "logits/chosen", "logits/rejected", "learning_rate", "epoch", "grad_norm",
             "loss"]  # fmt: skip
    assert all(k in step and math.isfinite(step[k]) for k in names), sorted(step)
    assert step["learning_rate"] == 1e-3 and step["epoch"] == 0.0625


@pytest.mark.parametrize("layout", ["fused", "chunked", "softcap", "model"])
def test_logits_metric_is_the_mean_logit_over_completion_tokens(layout):
    """logits/chosen is TRL's mean of the model's logits over vocabulary and completion tokens."""
    tok = build_tokenizer()
    model = build_model(tok, seed=3)
    if layout == "softcap":
        model.config.final_logit_softcapping = 0.05  # read by the fast path's transform; applied here by hand
    input_ids, attn, comp = _batch(tok)
    out = sequence_logps(model, input_ids, attn, comp, logits_mean=True, fused_head=layout != "chunked",
                         path="model" if layout == "model" else "fast")  # fmt: skip
    with torch.no_grad():
        logits = model(input_ids=input_ids, attention_mask=attn).logits.float()  # (N, T, V)
    if layout == "softcap":
        logits = 0.05 * torch.tanh(logits / 0.05)
    sel = comp[:, 1:].bool()  # position t predicts token t+1
    expected = torch.stack([logits[i, :-1][sel[i]].mean(-1).sum() for i in range(len(sel))])  # (N,)
    assert torch.allclose(out.logits_sum, expected, atol=1e-5), (out.logits_sum, expected)
    assert out.logits_sum.requires_grad is False


def test_lr_scheduler_type_and_warmup_steps():
    def lrs(**kw):
        opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=1.0)
        sched = build_schedule(opt, 10, kw.pop("warmup_ratio", 0.0), **kw)
        out = []
        for _ in range(10):
            out.append(sched.get_last_lr()[0])
            opt.step()
            sched.step()
        return out

    assert lrs(name="constant") == [1.0] * 10
    assert lrs(name="linear") == pytest.approx([1 - i / 10 for i in range(10)])
    assert lrs(name="cosine", warmup_steps=2)[:3] == pytest.approx([0.0, 0.5, 1.0])
    assert lrs(name="cosine", warmup_steps=2, warmup_ratio=0.5)[:3] == pytest.approx([0.0, 0.5, 1.0])  # steps win
    with pytest.raises(ConfigError, match="lr_scheduler_type='reduce_lr_on_plateau': choose cosine, linear"):
        TrainConfig(lr_scheduler_type="reduce_lr_on_plateau")
