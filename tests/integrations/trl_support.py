"""The TRL integration tests' runs: a tiny Llama trained a few plain-SGD steps by TRL's DPO/KTO trainer or prefzoo's.

Both sides get the same model folder, the same data and the same seed, so the only difference is the loss code.
Used by the tests and by ``benchmarks/bench_trl_adapter.py`` (run as a worker by the 2-process test too).
"""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import torch


def make_pairs(n: int, seed: int = 0, equal_chosen: bool = False) -> list[dict[str, str]]:
    """n pairs 'add a+b=' with completions of varied lengths (``equal_chosen``: every chosen one 3 characters)."""
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        a, b = rng.randint(10, 49), rng.randint(10, 49)
        s = a + b
        tail = "" if equal_chosen else " ok" * rng.randint(0, 3)
        chosen = f" {s}{tail}"
        rejected = f" {s + rng.choice([-3, -1, 2, 7])}" + " no" * rng.randint(0, 4)
        out.append({"prompt": f"add {a}+{b}=", "chosen": chosen, "rejected": rejected})
    return out


def model_dir(root: Path, seed: int = 0) -> Path:
    """A saved tiny Llama with its character tokenizer (eos and pad set): TRL loads a reference copy by path."""
    from tests.support.tiny import build_model, build_tokenizer

    out = root / "tiny-trl"
    if not (out / "config.json").is_file():
        tok = build_tokenizer(pad=True)
        build_model(tok, seed=seed).save_pretrained(out)
        tok.save_pretrained(out)
    return out


def make_unpaired(n: int, seed: int = 0) -> list[dict[str, Any]]:
    """2n unpaired examples (KTO's format): each pair of :func:`make_pairs` as a desirable and an undesirable
    completion, shuffled with ``seed`` so that every batch of 4 mixes the labels."""
    rows = [{"prompt": p["prompt"], "completion": p[key], "label": key == "chosen"}
            for p in make_pairs(n, seed=seed) for key in ("chosen", "rejected")]  # fmt: skip
    random.Random(seed).shuffle(rows)
    return rows


def config(out: Path, kind: str = "dpo", **kw: Any) -> Any:
    """A DPOConfig (or KTOConfig) for a deterministic CPU run: plain SGD, constant rate, no clipping, no
    checkpointing, fp64."""
    from trl import DPOConfig, KTOConfig

    base: dict[str, Any] = dict(
        output_dir=str(out),
        per_device_train_batch_size=4,
        gradient_accumulation_steps=1,
        learning_rate=0.5,
        optim="sgd",
        lr_scheduler_type="constant",
        warmup_steps=0,
        weight_decay=0.0,
        max_grad_norm=0.0,
        max_steps=3,
        logging_steps=1,
        save_strategy="no",
        report_to="none",
        disable_tqdm=True,
        use_cpu=True,
        bf16=False,
        gradient_checkpointing=False,
        dataloader_num_workers=0,
        seed=0,
        model_init_kwargs={"dtype": torch.float64},  # the two loss codes' float32 rounding would show after 3 steps
    )
    base.update(kw)
    return (KTOConfig if kind == "kto" else DPOConfig)(**base)


def train(
    model_path: Path,
    out: Path,
    pairs: list[dict[str, Any]],
    *,
    adapter: bool,
    loss: Any = None,
    loss_params: dict[str, Any] | None = None,
    lora: bool = False,
    kind: str = "dpo",
    **cfg: Any,
) -> tuple[dict[str, torch.Tensor], list[dict[str, float]], Any]:
    """Train; returns (trainable parameters after training, the log history, the trainer)."""
    import datasets
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(model_path)
    peft_config = None
    if lora:
        from peft import LoraConfig

        peft_config = LoraConfig(r=4, lora_alpha=8, lora_dropout=0.0, target_modules=["q_proj", "v_proj"],
                                 task_type="CAUSAL_LM", init_lora_weights=True)  # fmt: skip
    kw: dict[str, Any] = dict(
        model=str(model_path),
        args=config(out, kind, **cfg),
        train_dataset=datasets.Dataset.from_list(pairs),
        processing_class=tok,
        peft_config=peft_config,
    )
    import trl

    from prefzoo.integrations import trl as adapters

    name = "KTOTrainer" if kind == "kto" else "DPOTrainer"
    if adapter:
        trainer = getattr(adapters, name)(**kw, loss=loss, loss_params=loss_params)
    else:
        trainer = getattr(trl, name)(**kw)
    trainer.train()
    params = {n: p.detach().clone() for n, p in trainer.model.named_parameters() if p.requires_grad}
    return params, list(trainer.state.log_history), trainer


def max_rel_diff(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor], start: dict[str, torch.Tensor]) -> float:
    """max over parameters of |Δa − Δb| / max|Δb|: the updates compared, relative to the update's size."""
    assert a.keys() == b.keys() == start.keys()
    worst = 0.0
    for k in a:
        da, db = a[k] - start[k], b[k] - start[k]
        scale = float(db.abs().max())
        if scale > 0:
            worst = max(worst, float((da - db).abs().max()) / scale)
        else:
            assert float(da.abs().max()) == 0.0, k
    return worst


def assert_same_training(ours: dict, ours_log: list, theirs: dict, trl_log: list, start: dict) -> None:
    """Three SGD steps through the adapter and through TRL's trainer: the same updates (relative 1e-5), updates that
    moved the weights, and the same three logged losses."""
    import pytest

    assert ours.keys() == theirs.keys() and theirs
    assert max_rel_diff(ours, theirs, start) <= 1e-5
    moved = max(float((theirs[k] - start[k]).abs().max()) for k in theirs)
    assert moved > 1e-3  # the steps did something: an equal no-op would prove nothing
    steps = [(a["loss"], b["loss"]) for a, b in zip(ours_log, trl_log, strict=True) if "loss" in a]
    assert len(steps) == 3 and all(a == pytest.approx(b, rel=1e-5) for a, b in steps), steps

