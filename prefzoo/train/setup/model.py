"""Setup's model helpers: tokenizer and chat template, loading for training, the lean modules, the fast paths."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from prefzoo.data.chat import check_chat_template, set_chat_template
from prefzoo.data.shapes import PAIRS
from prefzoo.data.tokenize import ensure_pad_token
from prefzoo.model import (
    enable_gradient_checkpointing,
    fuse_gated_mlps,
    lean_rms_norms,
    load_kwargs,
    load_model_and_tokenizer,
    load_tokenizer,
    prepare_quantized,
    sparsify_dropout,
)
from prefzoo.scoring import model_identity
from prefzoo.spec import Loss
from prefzoo.train.checkpoint import ResumeError
from prefzoo.train.config import ConfigError
from prefzoo.train.config.sections import FastPathSection, ModelSection, OptimizationSection
from prefzoo.train.setup.shape_plan import ShapePlan

__all__ = ["check_token_ids", "fast_paths", "lean_modules", "load_model", "tokenizer_and_template"]


def tokenizer_and_template(
    cfg: ModelSection, chat_template: str, train_dataset: Any, prompts: list[Any] | None
) -> tuple[Any, str]:
    """(the tokenizer with ``--chat-template`` applied, what was decided), its template rendered once on the first
    example: a broken template is one line before the model loads."""
    assert cfg.model is not None  # checked first
    tokenizer = load_tokenizer(cfg.model, trust_remote_code=cfg.trust_remote_code)
    template = set_chat_template(tokenizer, chat_template)
    first = {"prompt": prompts[0]} if prompts else (train_dataset[0] if train_dataset is not None else None)
    if first:
        check_chat_template(tokenizer, first, template)
    return tokenizer, template


def load_model(
    cfg: ModelSection, accelerator: Any, resume_path: Path | None, resume_info: dict[str, Any], tokenizer: Any
) -> tuple[Any, Any, bool, str]:
    """(causal LM, ``tokenizer`` with a pad token, whether it came with an adapter, weight identity)."""
    assert cfg.model is not None  # checked first
    load = load_kwargs(cfg.torch_dtype, cfg.attn_implementation, cfg.load_in_4bit, cfg.load_in_8bit,
                       cuda=accelerator.device.type == "cuda")  # fmt: skip
    lm, tokenizer, has_adapter = load_model_and_tokenizer(
        cfg.model, trust_remote_code=cfg.trust_remote_code, tokenizer=tokenizer, **load
    )
    _prepare_for_training(cfg, lm, accelerator)
    identity = model_identity(lm, cfg.model)
    if resume_info and resume_info.get("model_identity") != identity:
        raise ResumeError(
            f"--resume {resume_path}: checkpoint was trained from model {resume_info.get('model')!r} "
            f"(identity {resume_info.get('model_identity')}), this run starts from {cfg.model!r} "
            f"({identity}); use the same --model or a new --output-dir"
        )
    pad_note = ensure_pad_token(tokenizer)
    if pad_note:
        accelerator.print(f"prefzoo train: {pad_note}")
        lm.config.pad_token_id = tokenizer.pad_token_id  # type: ignore[union-attr]
    return lm, tokenizer, has_adapter, identity


def _prepare_for_training(cfg: ModelSection, lm: Any, accelerator: Any) -> None:
    """Quantised base weights (peft's k-bit preparation) and activation checkpointing, said in one line each."""
    if cfg.load_in_4bit or cfg.load_in_8bit:
        prepare_quantized(lm, cfg.gradient_checkpointing)
        bits = "4-bit NF4" if cfg.load_in_4bit else "8-bit"
        accelerator.print(f"prefzoo train: base weights in {bits} (bitsandbytes); LoRA adapters train on them (QLoRA)")
    elif cfg.gradient_checkpointing:
        enable_gradient_checkpointing(lm)
    if cfg.gradient_checkpointing:
        accelerator.print(
            "prefzoo train: gradient checkpointing on (non-reentrant): activations recomputed in backward"
        )


def lean_modules(cfg: FastPathSection, lm: Any, accelerator: Any) -> None:
    """Fused gated MLPs, lean RMSNorms and sparse dropout where the run keeps them on, said in one line each."""
    if cfg.fused_mlp:  # prefzoo/model/fast/fused_mlp.py
        _say_switched(accelerator, fuse_gated_mlps(lm), "gated MLPs recompute silu(gate) and the product in "
                      "backward: two intermediate-width activations fewer kept per layer, same results",
                      "--no-fused-mlp")  # fmt: skip
    if cfg.lean_norms:
        _say_switched(accelerator, lean_rms_norms(lm), "RMSNorms recompute the normalised input in backward: one "
                      "hidden-width activation fewer kept per norm, same results", "--no-lean-norms")  # fmt: skip
    if cfg.sparse_dropout:  # prefzoo.model.fast.sparse_dropout
        rates = {f"at p={p:g}": n for p, n in sorted(sparsify_dropout(lm).items())}
        _say_switched(accelerator, rates, "dropout draws only the dropped positions on CPU: same distribution, less "
                      "time", "--no-sparse-dropout", count_first=True)  # fmt: skip


def _say_switched(accelerator: Any, switched: dict[str, int], what: str, flag: str, count_first: bool = False) -> None:
    """One log line for modules switched to a leaner forward: what changed, which (name × count), and the way out."""
    if switched:
        which = ", ".join(f"{n} {k}" if count_first else f"{k} × {n}" for k, n in switched.items())
        accelerator.print(f"prefzoo train: {what} ({which}; {flag} turns it off)")


def fast_paths(
    fast: FastPathSection, opt: OptimizationSection, loss: Loss, plan: ShapePlan, train_tok: Any, lm: Any,
    engine: Any = None,
) -> Any:
    """Prompt sharing, packing, length grouping for this run: forced by flags or chosen from the pairs' lengths."""
    from prefzoo.model import SWITCHES, fast_paths_for_run, unwrap

    unavailable = None
    if plan.batches != PAIRS:
        unavailable = f"{plan.batches} batches"
    elif train_tok is None:
        unavailable = "on-policy data"
    elif engine is not None and not engine.fast_paths_measured:
        unavailable = f"not measured under {engine.option}: force with on"
    switches = {k: getattr(fast, k) for k in SWITCHES}
    return fast_paths_for_run(switches, opt.per_device_batch_size, opt.seed, bool(loss.spec.batch_coupled), train_tok,
                              unavailable, unwrap(lm))  # fmt: skip


def check_token_ids(model: str | None, lm: Any, tokenizer: Any, *splits: Any) -> None:
    """Every token id of the tokenized ``splits`` (and the pad id) is a row of the model's embedding: a tokenizer
    that is not the model's is one line here, not an IndexError in the self-check (a device-side assert on CUDA)."""
    embedding = lm.get_input_embeddings()
    rows = getattr(embedding, "num_embeddings", None)
    if rows is None:
        return
    pad = tokenizer.pad_token_id
    highest = max([-1 if pad is None else int(pad), *(max_token_id(s) for s in splits if s is not None)])
    if highest >= rows:
        raise ConfigError(
            f"--model {model}: the tokenizer gives token id {highest} but the model's embedding has {rows} rows "
            f"(ids 0..{rows - 1}); use the tokenizer saved with this model (tokenizer.save_pretrained into the model "
            "folder), or resize the model's embeddings to the tokenizer (model.resize_token_embeddings(len(tokenizer)))"
        )


def max_token_id(ds: Any) -> int:
    """The largest id in the ``*_ids`` columns of a tokenized dataset (read from its arrow columns: no row loop)."""
    import pyarrow as pa
    import pyarrow.compute as pc

    highest = -1
    for name in ds.column_names:
        if not name.endswith("_ids"):
            continue
        column: Any = ds.data.column(name)
        while pa.types.is_list(column.type) or pa.types.is_large_list(column.type):
            column = pc.list_flatten(column)
        if pa.types.is_integer(column.type) and len(column):
            top = pc.max(column).as_py()
            highest = max(highest, -1 if top is None else int(top))
    return highest
