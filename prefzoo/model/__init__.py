"""The model engine below training and evaluation: loading, what a model brings, and sequence log-probs.

Training, evaluation, the testing kit and the TRL adapter use a causal LM only through the names below; this
package imports neither accelerate nor the trainer.

- loading (:mod:`~prefzoo.model.loading`): the policy and tokenizer from a name or folder, quantization, LoRA;
- what a model brings (:mod:`~prefzoo.model.context`, :mod:`~prefzoo.model.defaults`): its context length and the
  prompt/completion limits fitted into it, dropout turned off;
- architecture adapters (:mod:`~prefzoo.model.arch`, :mod:`~prefzoo.model.moe`): the logit transform and attention
  pattern prefzoo reproduces, the mixture-of-experts router loss;
- log-probs (:mod:`~prefzoo.model.logps`): :func:`sequence_logps` and :class:`PolicyLogps`, the one computation every
  part of prefzoo uses, with the exact speed paths of :mod:`prefzoo.model.fast` (:func:`weight_logps`: its fused
  LM head for a weight and selected hidden states, as :mod:`prefzoo.nn` uses it, with its :class:`HeadOptions`);
- the run-start self-check (:mod:`~prefzoo.model.selfcheck`): the fast path against the model's own logits;
- prompt embeddings (:mod:`~prefzoo.model.embedding`) for BCO's density-ratio classifier;
- the default task's starting policy (:mod:`~prefzoo.model.default_policy`): shipped, or warmed up once and cached.


Importing this package imports nothing: each name loads its module on first use (PEP 562), so the CLI can read
:data:`SWITCHES` before torch loads.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from prefzoo._lazy import lazy_names

if TYPE_CHECKING:  # the same names for type checkers and IDEs; at run time __getattr__ loads them
    from prefzoo.model.arch import (
        LogitTransform,
        ModelCapabilities,
        attention_layer_types,
        logit_transform,
        model_capabilities,
        vocab_cut,
    )
    from prefzoo.model.context import (
        DEFAULT_MAX_COMPLETION_LENGTH,
        DEFAULT_MAX_PROMPT_LENGTH,
        ContextLengthError,
        ContextLimits,
        fit_to_context,
        model_context,
    )
    from prefzoo.model.default_policy import load_default_task
    from prefzoo.model.defaults import ModelDefaults, apply_model_defaults
    from prefzoo.model.embedding import PromptEmbedding, mean_pooled_hidden_states
    from prefzoo.model.fast.choice import SWITCHES, FastPaths, choose_fast_paths, fast_paths_for_run, switch_value
    from prefzoo.model.fast.fused_mlp import fuse_gated_mlps, lean_rms_norms
    from prefzoo.model.fast.head import HeadOptions, head_logps
    from prefzoo.model.fast.head_rows import weight_logps
    from prefzoo.model.fast.packing import PackingError, packing_takes_split
    from prefzoo.model.fast.prompt import SharedPromptError
    from prefzoo.model.fast.sparse_dropout import sparsify_dropout
    from prefzoo.model.fast.split import split_refusal
    from prefzoo.model.loading import (
        LoadOptionError,
        LoRATargetError,
        ModelSourceError,
        apply_lora,
        check_model_source,
        enable_gradient_checkpointing,
        load_kwargs,
        load_model_and_tokenizer,
        load_tokenizer,
        prepare_quantized,
        remote_code_note,
    )
    from prefzoo.model.logps import CompletionLogps, PolicyLogps, sequence_logps, token_log_sq_probs, unwrap
    from prefzoo.model.moe import RouterAuxError, add_router_loss, router_metrics
    from prefzoo.model.selfcheck import LogpsSelfCheckError, check_logps, first_pairs, run_self_check

# module -> the public names it defines: the TYPE_CHECKING imports above (tests/test_package.py keeps them in step)
_MODULES: dict[str, tuple[str, ...]] = {
    "prefzoo.model.arch": ("LogitTransform", "ModelCapabilities", "attention_layer_types", "logit_transform",
                           "model_capabilities", "vocab_cut"),
    "prefzoo.model.context": ("ContextLengthError", "ContextLimits", "DEFAULT_MAX_COMPLETION_LENGTH",
                              "DEFAULT_MAX_PROMPT_LENGTH", "fit_to_context", "model_context"),
    "prefzoo.model.default_policy": ("load_default_task",),
    "prefzoo.model.defaults": ("ModelDefaults", "apply_model_defaults"),
    "prefzoo.model.embedding": ("PromptEmbedding", "mean_pooled_hidden_states"),
    "prefzoo.model.fast.choice": ("FastPaths", "SWITCHES", "choose_fast_paths", "fast_paths_for_run", "switch_value"),
    "prefzoo.model.fast.fused_mlp": ("fuse_gated_mlps", "lean_rms_norms"),
    "prefzoo.model.fast.head": ("HeadOptions", "head_logps"),
    "prefzoo.model.fast.head_rows": ("weight_logps",),
    "prefzoo.model.fast.packing": ("PackingError", "packing_takes_split"),
    "prefzoo.model.fast.prompt": ("SharedPromptError",),
    "prefzoo.model.fast.sparse_dropout": ("sparsify_dropout",),
    "prefzoo.model.fast.split": ("split_refusal",),
    "prefzoo.model.loading": ("LoRATargetError", "LoadOptionError", "ModelSourceError", "apply_lora",
                              "check_model_source", "enable_gradient_checkpointing", "load_kwargs",
                              "load_model_and_tokenizer", "load_tokenizer", "prepare_quantized",
                              "remote_code_note"),
    "prefzoo.model.logps": ("CompletionLogps", "PolicyLogps", "sequence_logps", "token_log_sq_probs", "unwrap"),
    "prefzoo.model.moe": ("RouterAuxError", "add_router_loss", "router_metrics"),
    "prefzoo.model.selfcheck": ("LogpsSelfCheckError", "check_logps", "first_pairs", "run_self_check"),
}  # fmt: skip


__all__ = [
    "DEFAULT_MAX_COMPLETION_LENGTH",
    "DEFAULT_MAX_PROMPT_LENGTH",
    "SWITCHES",
    "CompletionLogps",
    "ContextLengthError",
    "ContextLimits",
    "FastPaths",
    "HeadOptions",
    "LoRATargetError",
    "LoadOptionError",
    "LogitTransform",
    "LogpsSelfCheckError",
    "ModelCapabilities",
    "ModelDefaults",
    "ModelSourceError",
    "PackingError",
    "PolicyLogps",
    "PromptEmbedding",
    "RouterAuxError",
    "SharedPromptError",
    "add_router_loss",
    "apply_lora",
    "apply_model_defaults",
    "attention_layer_types",
    "check_logps",
    "check_model_source",
    "choose_fast_paths",
    "enable_gradient_checkpointing",
    "fast_paths_for_run",
    "first_pairs",
    "fit_to_context",
    "fuse_gated_mlps",
    "head_logps",
    "lean_rms_norms",
    "load_default_task",
    "load_kwargs",
    "load_model_and_tokenizer",
    "load_tokenizer",
    "logit_transform",
    "mean_pooled_hidden_states",
    "model_capabilities",
    "model_context",
    "packing_takes_split",
    "prepare_quantized",
    "remote_code_note",
    "router_metrics",
    "run_self_check",
    "sequence_logps",
    "sparsify_dropout",
    "split_refusal",
    "switch_value",
    "token_log_sq_probs",
    "unwrap",
    "vocab_cut",
    "weight_logps",
]

_LAZY, __getattr__, __dir__ = lazy_names(globals(), _MODULES)
