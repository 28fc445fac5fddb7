"""The sections of a run's settings, one dataclass each, in the order of ``prefzoo train --help`` and the docs.

Each section holds its keys (the comment on a key is its ``--help`` text) and ``check``, which validates them and
raises a :class:`ConfigError` naming the key and the fix.  :class:`prefzoo.train.config.TrainConfig` is all of them
at once, so a key keeps its flat name everywhere: ``cfg.lr``, ``lr:`` in YAML, ``--lr`` on the command line.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from prefzoo.errors import ConfigError
from prefzoo.train.setup.schedules import SCHEDULES

__all__ = ["ATTN_IMPLEMENTATIONS", "LR_SCHEDULERS", "SECTIONS", "TORCH_DTYPES", "CheckpointSection", "DataSection",
           "EngineSection", "EvaluationSection", "FastPathSection", "LossSection", "ModelSection",
           "MonitoringSection", "OnlineSection", "OptimizationSection"]  # fmt: skip

TORCH_DTYPES = ("float32", "bfloat16", "float16", "auto")  # --torch-dtype choices (TRL's names)
ATTN_IMPLEMENTATIONS = ("eager", "sdpa", "flash_attention_2")  # --attn-implementation choices (transformers' names)
LR_SCHEDULERS = SCHEDULES  # transformers.get_scheduler names that need no extra arguments
_LORA_TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


def _at_least(section: Any, names: tuple[str, ...], low: int, unset: str = "") -> None:
    """Each of ``names`` that is set is >= ``low``; ``unset`` says what leaving it unset means."""
    for name in names:
        value = getattr(section, name)
        if value is not None and value < low:
            raise ConfigError(f"{name}={value} must be >= {low}{unset}")


def _in_range(section: Any, name: str, low: float, high: float, closed_high: bool = False) -> None:
    """``low <= value < high`` (``<= high`` with ``closed_high``)."""
    value = getattr(section, name)
    if not (low <= value <= high if closed_high else low <= value < high):
        raise ConfigError(f"{name}={value} must be in [{low:g}, {high:g}{']' if closed_high else ')'}")


def _one_of(section: Any, name: str, choices: tuple[Any, ...]) -> None:
    value = getattr(section, name)
    if value not in choices:
        named = [str(c) for c in choices if c is not None]
        listed = f"{', '.join(named[:-1])} or {named[-1]}" if len(named) > 1 else named[0]
        raise ConfigError(f"{name}={value!r}: choose {listed}{' (or unset)' if None in choices else ''}")


@dataclass
class LossSection:
    """The loss, its modifiers, its reference, and how it meets the data's shape."""

    loss: str = "mmpo"  # a registered loss name or a weighted sum such as "0.8*dpo + 0.2*sft"
    loss_params: dict[str, Any] = field(default_factory=dict)  # validated by the loss's params class
    modifiers: list[Any] = field(default_factory=list)  # loss modifiers in order, 'NAME[:K=V,...]' (prefzoo modifiers)
    pairs_from_lists: str | None = None  # pairwise loss on list data: best-worst | all-pairs | best-vs-rest
    unpair: bool = False  # an unpaired loss (kto, bco) on pairs: chosen desirable, rejected undesirable (as TRL)
    density_ratio: bool = False  # BCO's UDM (TRL: embedding_func): undesirable examples weighted by p(x|D)/p(x|U)
    density_ratio_prompts: int = 1024  # prompts per label the density-ratio classifier is fitted on (TRL's 1024)
    min_density_ratio: float = 0.5  # density-ratio weights are clamped to [min, max] (TRL's defaults 0.5 and 10)
    max_density_ratio: float = 10.0  # upper clamp of the density-ratio weights
    precompute_ref: bool = False  # compute reference log-probs once and cache them on disk
    ref_cache_dir: str | None = None  # where precomputed reference log-probs live (default: prefzoo's cache_root()/ref)

    def check(self) -> None:
        _one_of(self, "pairs_from_lists", (None, "best-worst", "all-pairs", "best-vs-rest"))
        _at_least(self, ("density_ratio_prompts",), 1, " (TRL's default: 1024)")
        lo, hi = self.min_density_ratio, self.max_density_ratio
        if not (math.isfinite(lo) and math.isfinite(hi) and 0 <= lo <= hi and hi > 0):
            raise ConfigError(
                f"min_density_ratio={lo}, max_density_ratio={hi}: need finite 0 <= min <= max with max > 0 "
                "(TRL's defaults: 0.5 and 10)"
            )


@dataclass
class DataSection:
    """The training data: where it is, its format, and how much of each example is kept."""

    dataset: str | list[Any] | None = None  # hub name, jsonl/json/parquet/csv file or folder; several: PATH:WEIGHT
    format: str | None = None  # plain|conversational|ultrafeedback|orca|ultrafeedback-raw|list|unpaired; None = detect
    chat_template: str = "auto"  # conversations only: auto (the tokenizer's) | none | PATH.jinja; strings go as given
    train_split: str = "train"  # the split of --dataset to train on
    max_prompt_length: int | None = None  # prompt tokens kept, from the END; unset = 1800, fitted to the context
    max_completion_length: int | None = None  # completion tokens kept, from the START (eos incl.); unset = 512, fitted
    dataset_num_proc: int | None = None  # processes for tokenization (datasets.map num_proc; pays off on large data)

    def check(self) -> None:
        _at_least(self, ("max_prompt_length", "max_completion_length"), 1, " (or unset to fit the model's context)")
        _at_least(self, ("dataset_num_proc",), 1, " (or unset)")


@dataclass
class ModelSection:
    """The model: where it comes from, how it loads, and LoRA."""

    model: str | None = None  # hub name or local folder; None with dataset None = the embedded default task
    torch_dtype: str = "float32"  # weights' dtype when loading: float32 | bfloat16 | float16 | auto (the checkpoint's)
    attn_implementation: str | None = None  # eager | sdpa | flash_attention_2 (CUDA only); None = transformers' choice
    gradient_checkpointing: bool = False  # recompute activations in backward (non-reentrant): less memory, ~30% slower
    load_in_4bit: bool = False  # QLoRA: 4-bit NF4 base weights (bitsandbytes) + LoRA adapters (needs --lora)
    load_in_8bit: bool = False  # 8-bit base weights (bitsandbytes LLM.int8) + LoRA adapters (needs --lora)
    trust_remote_code: bool = False  # run a model folder's own Python code (auto_map); only for models you trust
    keep_dropout: bool = False  # keep the model's dropout on (off by default, as TRL's disable_dropout: see docs)
    lora: bool = False  # train a LoRA adapter; the reference is the same model with adapters disabled
    lora_r: int = 64  # paper: r = 64
    lora_alpha: int = 64  # paper: α = 64 (scale α/r = 1)
    lora_dropout: float = 0.01  # paper: 0.01; 0 skips the dropout kernel (faster LoRA pass, docs/training.md)
    lora_target_modules: list[str] = field(
        default_factory=lambda: list(_LORA_TARGETS)
    )  # every Llama linear layer except the LM head

    def check(self) -> None:
        _one_of(self, "torch_dtype", TORCH_DTYPES)
        _one_of(self, "attn_implementation", (None, *ATTN_IMPLEMENTATIONS))
        _at_least(self, ("lora_r", "lora_alpha"), 1)
        _in_range(self, "lora_dropout", 0, 1)
        if self.torch_dtype == "float16" and not self.lora:
            raise ConfigError(
                "torch_dtype=float16 without --lora: AdamW cannot update float16 weights (its eps underflows to 0 and "
                "the first steps turn the weights to inf/NaN); use --torch-dtype bfloat16 or float32 (with "
                "--mixed-precision fp16 on a GPU), or add --lora (the adapters train in float32)"
            )
        if self.load_in_4bit and self.load_in_8bit:
            raise ConfigError("load_in_4bit and load_in_8bit are both set: choose one")
        if (self.load_in_4bit or self.load_in_8bit) and not self.lora:
            which = "load_in_4bit" if self.load_in_4bit else "load_in_8bit"
            raise ConfigError(f"{which} needs --lora: quantised base weights cannot be trained, only adapters on them")


@dataclass
class OptimizationSection:
    """Steps, batch sizes, the optimizer, the learning-rate schedule and precision."""

    lr: float = 5e-7  # peak learning rate (paper: 5e-7 full fine-tuning of small models)
    epochs: float = 1  # passes over the training pairs; a fraction (0.5) stops part-way through the last one
    max_steps: int | None = None  # optimizer steps; overrides epochs when set
    per_device_batch_size: int = 2  # pairs per process per micro-step (paper: 2)
    grad_accum: int = 16  # micro-steps per optimizer step: 2 × 16 = 32 pairs per process per step (paper)
    warmup_ratio: float = 0.1  # cosine schedule: 10% of the steps warm up linearly (paper)
    warmup_steps: int = 0  # linear warm-up steps; > 0 overrides warmup_ratio (TRL's rule)
    lr_scheduler_type: str = "cosine"  # after warm-up: cosine (paper) | linear | constant | constant_with_warmup | ...
    weight_decay: float = 0.0  # AdamW decoupled weight decay
    adam_betas: tuple[float, float] = (0.9, 0.999)  # AdamW (β1, β2); on the command line "0.9,0.999"
    max_grad_norm: float = 1.0  # gradient clipping (L2 norm over all trainable parameters)
    optim: str = "adamw"  # adamw (torch) | adamw8bit (bitsandbytes, paper's choice with LoRA)
    mixed_precision: str = "no"  # no | bf16 | fp16 (accelerate autocast)
    seed: int = 42
    skip_batches: int = 0  # micro-batches passed over at the start/resume point (whole steps, counted as skipped)
    max_consecutive_skips: int = 10  # stop (with a checkpoint) after this many non-finite steps in a row; 0 = never

    def check(self) -> None:
        if not self.lr > 0:
            raise ConfigError(f"lr={self.lr} must be > 0")
        if not (self.epochs > 0 and math.isfinite(self.epochs)):
            raise ConfigError(f"epochs={self.epochs} must be > 0 (a fraction such as 0.5 trains on part of the data)")
        _at_least(self, ("max_steps",), 1, " (or unset to use epochs)")
        _at_least(self, ("per_device_batch_size", "grad_accum"), 1)
        _at_least(self, ("skip_batches", "warmup_steps"), 0, " (0 = off)")
        _at_least(self, ("max_consecutive_skips",), 0, " (0 = never stop)")
        _in_range(self, "warmup_ratio", 0, 1)
        _one_of(self, "lr_scheduler_type", LR_SCHEDULERS)
        _one_of(self, "optim", ("adamw", "adamw8bit"))
        _one_of(self, "mixed_precision", ("no", "bf16", "fp16"))


@dataclass
class FastPathSection:
    """The log-prob engine's speed and memory paths: each computes the same log-probs (docs/training-step.md)."""

    logp_chunk_size: int = 1024  # completion positions per LM-head + float32 log-softmax chunk
    fused_head: bool = True  # LM head recomputed per chunk in backward: no (positions × vocab) tensor kept for it
    fused_mlp: bool = True  # gated-SiLU MLPs keep gate(x) and up(x), recompute silu in backward: same bits, less memory
    lean_norms: bool = True  # Llama-style RMSNorms recompute the normalised input in backward: same bits, less memory
    sparse_dropout: bool = True  # dropout at p <= 0.25 on CPU draws only the dropped positions: same distribution
    share_prompt: str = "auto"  # auto|on|off: one forward per pair over [prompt, chosen, rejected] (prompt once)
    logps_fallback: bool = False  # log-prob self-check fails: use the model's own forward (slower) instead of stopping
    group_by_length: str = "auto"  # auto|on|off: batches of pairs of similar length (less padding), seeded order
    packing: str = "auto"  # auto|on|off: decoder over the sequences packed without padding (block-diagonal mask)

    def check(self) -> None:
        """Also normalises the auto|on|off switches (booleans mean on/off)."""
        from prefzoo.model import SWITCHES, switch_value

        _at_least(self, ("logp_chunk_size",), 1)
        for name in SWITCHES:
            try:
                setattr(self, name, switch_value(name, getattr(self, name)))
            except ValueError as e:
                raise ConfigError(str(e)) from None


@dataclass
class EngineSection:
    """How the run spreads over processes and devices."""

    deepspeed: str | None = None  # zero2 | zero3 | path/to/ds_config.json (needs the [deepspeed] extra)
    fsdp: bool = False  # shard the policy (and a frozen reference) with torch FSDP2 per decoder layer; >= 2 processes
    fsdp_sharding: str = "full"  # full (least memory) | shard_grad_op (kept gathered) | hybrid (HSDP: see fsdp.py)
    fsdp_shard_size: int | None = None  # hybrid: ranks per shard group; unset = processes per node (LOCAL_WORLD_SIZE)
    fsdp_cpu_offload: bool = False  # FSDP2 keeps parameters, gradients and optimizer state in CPU memory (GPU only)
    dist_timeout: float = 1800.0  # seconds a collective may wait for a peer before the run fails (hung/dead process)
    cpu: bool = False  # force CPU even when a GPU is present

    def check(self) -> None:
        _one_of(self, "fsdp_sharding", ("full", "shard_grad_op", "hybrid"))
        _at_least(self, ("fsdp_shard_size",), 1, " (or unset: the processes per node)")
        if not self.dist_timeout > 0:
            raise ConfigError(f"dist_timeout={self.dist_timeout} must be > 0 seconds")


@dataclass
class CheckpointSection:
    """What a run writes, where, how often, and where it resumes from."""

    output_dir: str = "runs/prefzoo"  # checkpoints/, metrics.jsonl, final model and run card
    save_steps: int = 0  # optimizer steps between checkpoints (0 = only at epoch ends)
    save_total_limit: int = 2  # complete checkpoints kept (older ones deleted)
    save_only_model: bool = False  # checkpoints are model folders (no optimizer/scheduler/RNG): smaller, not resumable
    merge_lora: bool = False  # save the merged model instead of the adapter
    push_to_hub: str | None = None  # a hub repo id (org/name): upload the final model folder there (huggingface_hub)
    hub_private_repo: bool = False  # --push-to-hub creates the repo private; off: the hub's default (public for users)
    resume: str | None = None  # a checkpoint folder, or 'auto' = the latest complete one in output_dir
    overwrite_output_dir: bool = False  # output_dir holds a run: delete that run's files first (prefzoo's own only)
    stop_after_steps: int | None = None  # testing aid: stop (as if killed) after this many optimizer steps

    def check(self) -> None:
        _at_least(self, ("save_steps",), 0)
        _at_least(self, ("save_total_limit",), 1)
        if self.overwrite_output_dir and self.resume:
            raise ConfigError(
                f"--overwrite-output-dir with --resume {self.resume}: choose one (--resume continues the run in "
                "output_dir, --overwrite-output-dir deletes it and starts over)"
            )
        if self.push_to_hub is not None and (self.push_to_hub.count("/") > 1 or self.push_to_hub.lower() == "true"):
            raise ConfigError(
                f"push_to_hub={self.push_to_hub!r}: give the hub repo id, e.g. --push-to-hub org/name (TRL's "
                "push_to_hub: true + hub_model_id: org/name is written here as push_to_hub: org/name)"
            )


@dataclass
class EvaluationSection:
    """The held-out data and when it is scored."""

    eval_split: str | None = None  # a split name; None = the 'test'/'validation' split if any, else eval_fraction
    eval_fraction: float = 0.05  # held out from train when there is no eval split (0 disables evaluation)
    eval_steps: int = 0  # optimizer steps between evaluations (0 = only at epoch ends)
    eval_at_start: bool = False  # also evaluate before the first step (reward accuracy of the starting policy)

    def check(self) -> None:
        _in_range(self, "eval_fraction", 0, 1)
        _at_least(self, ("eval_steps",), 0, " (0 = off)")


@dataclass
class OnlineSection:
    """On-policy training (--online): the data is prompts; each round the policy samples and a judge scores."""

    online: bool = False  # sample completions from the policy each round and train on them as judged
    samples_per_prompt: int = 4  # completions sampled per prompt and round (n of the MML estimator)
    online_every: int = 1  # optimizer steps per round of fresh samples (1: fully on-policy; N: semi-online)
    judge: str = "oracle"  # oracle | reward-model:PATH | llm:PATH | a plugin judge's name
    judge_params: list[str] = field(default_factory=list)  # the judge's KEY=VALUE options, e.g. tie_tolerance=0.1
    judge_max_skip: float = 0.5  # stop when the judge fails on more than this share of a round's prompts
    engine: str = "hf"  # generation engine: hf (transformers generate) | vllm (GPU, the vllm extra)
    temperature: float = 1.0  # sampling temperature of the online samples
    top_p: float = 1.0  # nucleus sampling of the online samples
    max_new_tokens: int | None = None  # tokens an online sample may generate; unset = the completion token limit
    generation_batch_size: int | None = None  # prompts per generate call; unset = per_device_batch_size
    desirable_threshold: float | None = None  # unpaired losses online: score >= it is desirable; unset = above mean

    def check(self) -> None:
        _at_least(self, ("samples_per_prompt", "online_every"), 1)
        _at_least(self, ("max_new_tokens",), 1, " (or unset for the completion limit)")
        _at_least(self, ("generation_batch_size",), 1, " (or unset)")
        _in_range(self, "judge_max_skip", 0, 1, closed_high=True)
        if not (self.temperature > 0 and math.isfinite(self.temperature)):
            raise ConfigError(f"temperature={self.temperature} must be a positive number")
        if not 0 < self.top_p <= 1:
            raise ConfigError(f"top_p={self.top_p} must be in (0, 1]")


@dataclass
class MonitoringSection:
    """What a run reports while it trains, and the callbacks that watch it."""

    logging_steps: int = 1  # optimizer steps between metric lines
    progress: bool = True  # a bar (terminal) or lines (log) for tokenizing, reference precompute, eval and steps
    report_to: str | None = "auto"  # none | auto (tensorboard if installed) | tensorboard,wandb,mlflow,trackio,...
    callbacks: list[Any] = field(default_factory=list)  # 'module:Class[:K=V,...]' or a callback name (repeatable)

    def check(self) -> None:
        _at_least(self, ("logging_steps",), 1)


# section name -> class, in the order of the docs and of `prefzoo train --help`
SECTIONS: dict[str, type] = {
    "loss": LossSection,
    "data": DataSection,
    "model": ModelSection,
    "optimization": OptimizationSection,
    "fast paths": FastPathSection,
    "engine": EngineSection,
    "checkpointing": CheckpointSection,
    "evaluation": EvaluationSection,
    "online": OnlineSection,
    "monitoring": MonitoringSection,
}
