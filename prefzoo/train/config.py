"""`TrainConfig`: every training setting as one typed dataclass, loadable from YAML and overridable by flags."""

from __future__ import annotations

import dataclasses
import math
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from prefzoo.errors import ConfigError
from prefzoo.train.schedules import SCHEDULES

__all__ = ["ATTN_IMPLEMENTATIONS", "LR_SCHEDULERS", "TORCH_DTYPES", "ConfigError", "TrainConfig", "field_docs",
           "load_yaml_config", "resolve_aliases"]  # fmt: skip


TORCH_DTYPES = ("float32", "bfloat16", "float16", "auto")  # --torch-dtype choices (TRL's names)
ATTN_IMPLEMENTATIONS = ("eager", "sdpa", "flash_attention_2")  # --attn-implementation choices (transformers' names)
LR_SCHEDULERS = SCHEDULES  # transformers.get_scheduler names that need no extra arguments


@dataclass
class TrainConfig:
    """One training run.  The defaults reproduce the paper's setup for small models.

    Global batch = per_device_batch_size × grad_accum × processes: the paper used 2 × 16 × 4 = 128 pairs.
    """

    # what to train
    loss: str = "mmpo"  # a registered loss name or a weighted sum such as "0.8*dpo + 0.2*sft"
    loss_params: dict[str, Any] = field(default_factory=dict)  # validated by the loss's params class
    modifiers: list[Any] = field(default_factory=list)  # loss modifiers in order, 'NAME[:K=V,...]' (prefzoo modifiers)
    model: str | None = None  # hub name or local folder; None with dataset None = the embedded default task
    dataset: str | list[Any] | None = None  # hub name, jsonl/json/parquet/csv file or folder; several: PATH:WEIGHT
    format: str | None = None  # plain|conversational|ultrafeedback|orca|ultrafeedback-raw|list|unpaired; None = detect
    pairs_from_lists: str | None = None  # pairwise loss on list data: best-worst | all-pairs | best-vs-rest
    unpair: bool = False  # an unpaired loss (kto, bco) on pairs: chosen desirable, rejected undesirable (as TRL)
    density_ratio: bool = False  # BCO's UDM (TRL: embedding_func): undesirable examples weighted by p(x|D)/p(x|U)
    density_ratio_prompts: int = 1024  # prompts per label the density-ratio classifier is fitted on (TRL's 1024)
    min_density_ratio: float = 0.5  # density-ratio weights are clamped to [min, max] (TRL's defaults 0.5 and 10)
    max_density_ratio: float = 10.0  # upper clamp of the density-ratio weights
    chat_template: str = "auto"  # conversations only: auto (the tokenizer's) | none | PATH.jinja; strings go as given
    train_split: str = "train"  # the split of --dataset to train on
    eval_split: str | None = None  # a split name; None = the 'test'/'validation' split if any, else eval_fraction
    eval_fraction: float = 0.05  # held out from train when there is no eval split (0 disables evaluation)
    max_prompt_length: int | None = None  # prompt tokens kept, from the END; unset = 1800, fitted to the context
    max_completion_length: int | None = None  # completion tokens kept, from the START (eos incl.); unset = 512, fitted
    dataset_num_proc: int | None = None  # processes for tokenization (datasets.map num_proc; pays off on large data)
    # optimization
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
    # model loading
    torch_dtype: str = "float32"  # weights' dtype when loading: float32 | bfloat16 | float16 | auto (the checkpoint's)
    attn_implementation: str | None = None  # eager | sdpa | flash_attention_2 (CUDA only); None = transformers' choice
    gradient_checkpointing: bool = False  # recompute activations in backward (non-reentrant): less memory, ~30% slower
    load_in_4bit: bool = False  # QLoRA: 4-bit NF4 base weights (bitsandbytes) + LoRA adapters (needs --lora)
    load_in_8bit: bool = False  # 8-bit base weights (bitsandbytes LLM.int8) + LoRA adapters (needs --lora)
    # model surgery
    keep_dropout: bool = False  # keep the model's dropout on (off by default, as TRL's disable_dropout: see docs)
    lora: bool = False  # train a LoRA adapter; the reference is the same model with adapters disabled
    lora_r: int = 64  # paper: r = 64
    lora_alpha: int = 64  # paper: α = 64 (scale α/r = 1)
    lora_dropout: float = 0.01  # paper: 0.01; 0 skips the dropout kernel (faster LoRA pass, docs/training.md)
    lora_target_modules: list[str] = field(
        default_factory=lambda: ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
    )  # every Llama linear layer except the LM head
    merge_lora: bool = False  # save the merged model instead of the adapter
    deepspeed: str | None = None  # zero2 | zero3 | path/to/ds_config.json (needs the [deepspeed] extra)
    fsdp: bool = False  # shard the policy (and a frozen reference) with torch FSDP2 per decoder layer; >= 2 processes
    fsdp_sharding: str = "full"  # full (least memory) | shard_grad_op (kept gathered) | hybrid (HSDP: see fsdp.py)
    fsdp_shard_size: int | None = None  # hybrid: ranks per shard group; unset = processes per node (LOCAL_WORLD_SIZE)
    fsdp_cpu_offload: bool = False  # FSDP2 keeps parameters, gradients and optimizer state in CPU memory (GPU only)
    precompute_ref: bool = False  # compute reference log-probs once and cache them on disk
    ref_cache_dir: str | None = None  # where precomputed reference log-probs live (default: prefzoo's cache_root()/ref)
    logp_chunk_size: int = 1024  # completion positions per LM-head + float32 log-softmax chunk
    fused_head: bool = True  # LM head recomputed per chunk in backward: no (positions × vocab) tensor kept for it
    fused_mlp: bool = True  # gated-SiLU MLPs keep gate(x) and up(x), recompute silu in backward: same bits, less memory
    lean_norms: bool = True  # Llama-style RMSNorms recompute the normalised input in backward: same bits, less memory
    sparse_dropout: bool = True  # dropout at p <= 0.25 on CPU draws only the dropped positions: same distribution
    share_prompt: str = "auto"  # auto|on|off: one forward per pair over [prompt, chosen, rejected] (prompt once)
    logps_fallback: bool = False  # log-prob self-check fails: use the model's own forward (slower) instead of stopping
    group_by_length: str = "auto"  # auto|on|off: batches of pairs of similar length (less padding), seeded order
    packing: str = "auto"  # auto|on|off: decoder over the sequences packed without padding (block-diagonal mask)
    # on-policy training (--online): the data is prompts; each round the policy samples and a judge scores
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
    # bookkeeping
    output_dir: str = "runs/prefzoo"  # checkpoints/, metrics.jsonl, final model and run card
    logging_steps: int = 1  # optimizer steps between metric lines
    save_steps: int = 0  # optimizer steps between checkpoints (0 = only at epoch ends)
    save_total_limit: int = 2  # complete checkpoints kept (older ones deleted)
    save_only_model: bool = False  # checkpoints are model folders (no optimizer/scheduler/RNG): smaller, not resumable
    eval_steps: int = 0  # optimizer steps between evaluations (0 = only at epoch ends)
    push_to_hub: str | None = None  # a hub repo id (org/name): upload the final model folder there (huggingface_hub)
    resume: str | None = None  # a checkpoint folder, or 'auto' = the latest complete one in output_dir
    stop_after_steps: int | None = None  # testing aid: stop (as if killed) after this many optimizer steps
    max_consecutive_skips: int = 10  # stop (with a checkpoint) after this many non-finite steps in a row; 0 = never
    dist_timeout: float = 1800.0  # seconds a collective may wait for a peer before the run fails (hung/dead process)
    trust_remote_code: bool = False  # run a model folder's own Python code (auto_map); only for models you trust
    eval_at_start: bool = False  # also evaluate before the first step (reward accuracy of the starting policy)
    progress: bool = True  # a bar (terminal) or lines (log) for tokenizing, reference precompute, eval and steps
    report_to: str | None = "auto"  # none | auto (tensorboard if installed) | tensorboard,wandb,mlflow,trackio,...
    cpu: bool = False  # force CPU even when a GPU is present
    callbacks: list[Any] = field(default_factory=list)  # 'module:Class[:K=V,...]' or a callback name (repeatable)

    def __post_init__(self) -> None:
        self.validate()

    def validate(self) -> None:
        """Every setting in range, section by section: a ConfigError names the key and the fix."""
        _validate_counts(self)
        self._validate_loading()
        _validate_switches(self)
        _validate_schedule_and_output(self)
        _validate_online(self)
        _validate_data_and_optimizer(self)
        self._validate_density_ratio()
        _validate_engine(self)

    def _validate_density_ratio(self) -> None:
        """BCO's density-ratio options: a sample of at least one prompt, 0 <= min <= max, finite."""
        if self.density_ratio_prompts < 1:
            raise ConfigError(f"density_ratio_prompts={self.density_ratio_prompts} must be >= 1 (TRL's default: 1024)")
        lo, hi = self.min_density_ratio, self.max_density_ratio
        if not (math.isfinite(lo) and math.isfinite(hi) and 0 <= lo <= hi and hi > 0):
            raise ConfigError(
                f"min_density_ratio={lo}, max_density_ratio={hi}: need finite 0 <= min <= max with max > 0 "
                "(TRL's defaults: 0.5 and 10)"
            )

    def _validate_loading(self) -> None:
        """The model-loading options (dtype, attention kernel, quantisation)."""
        if self.torch_dtype not in TORCH_DTYPES:
            raise ConfigError(f"torch_dtype={self.torch_dtype!r}: choose {', '.join(TORCH_DTYPES)}")
        if self.attn_implementation not in (None, *ATTN_IMPLEMENTATIONS):
            raise ConfigError(
                f"attn_implementation={self.attn_implementation!r}: choose {', '.join(ATTN_IMPLEMENTATIONS)}"
            )
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
        if (self.load_in_4bit or self.load_in_8bit) and self.deepspeed:
            raise ConfigError("load_in_4bit/load_in_8bit with --deepspeed is not supported: drop one of them")

    def to_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d["adam_betas"] = list(self.adam_betas)
        return d

    @classmethod
    def keys(cls) -> list[str]:
        return [f.name for f in dataclasses.fields(cls)]

    @classmethod
    def from_dict(
        cls, values: dict[str, Any], where: str = "config", names: dict[str, str] | None = None
    ) -> TrainConfig:
        """A config from ``values`` (TRL's option names accepted, see prefzoo.train.aliases).  An error names a key
        as ``names[key]`` (e.g. the flag it came from), else as ``where: key``."""
        values = resolve_aliases(values, where)
        unknown = sorted(set(values) - set(cls.keys()))
        if unknown:
            raise ConfigError(f"{where}: {unknown_keys_message(unknown, cls.keys())}")
        types_ = typing.get_type_hints(cls)
        names = names or {}
        coerced = {k: _coerce(k, v, types_[k], names.get(k, f"{where}: {k}")) for k, v in values.items()}
        return cls(**coerced)


def _validate_counts(cfg: TrainConfig) -> None:
    """Token limits, batch sizes and other counts, the learning rate and the epochs."""
    for name in ("max_prompt_length", "max_completion_length"):
        if getattr(cfg, name) is not None and int(getattr(cfg, name)) < 1:
            raise ConfigError(f"{name}={getattr(cfg, name)} must be >= 1 (or unset to fit the model's context)")
    positive = (
        "per_device_batch_size",
        "grad_accum",
        "lora_r",
        "lora_alpha",
        "logging_steps",
        "save_total_limit",
        "logp_chunk_size",
        "samples_per_prompt",
        "online_every",
    )
    for name in positive:
        if int(getattr(cfg, name)) < 1:
            raise ConfigError(f"{name}={getattr(cfg, name)} must be >= 1")
    if not cfg.lr > 0:
        raise ConfigError(f"lr={cfg.lr} must be > 0")
    if not (cfg.epochs > 0 and math.isfinite(cfg.epochs)):
        raise ConfigError(f"epochs={cfg.epochs} must be > 0 (a fraction such as 0.5 trains on part of the data)")


def _validate_switches(cfg: TrainConfig) -> None:
    """The fast-path switches: auto | on | off (booleans mean on/off)."""
    from prefzoo.model import SWITCHES, switch_value

    for name in SWITCHES:  # auto (chosen per run from the data's lengths) | on | off; booleans mean on/off
        try:
            setattr(cfg, name, switch_value(name, getattr(cfg, name)))
        except ValueError as e:
            raise ConfigError(str(e)) from None


def _validate_schedule_and_output(cfg: TrainConfig) -> None:
    """The schedule, evaluation and warm-up steps, and the hub repo id."""
    if cfg.lr_scheduler_type not in LR_SCHEDULERS:
        raise ConfigError(f"lr_scheduler_type={cfg.lr_scheduler_type!r}: choose {', '.join(LR_SCHEDULERS)}")
    for name in ("eval_steps", "skip_batches", "warmup_steps"):
        if getattr(cfg, name) < 0:
            raise ConfigError(f"{name}={getattr(cfg, name)} must be >= 0 (0 = off)")
    if cfg.push_to_hub is not None and (cfg.push_to_hub.count("/") > 1 or cfg.push_to_hub.lower() == "true"):
        raise ConfigError(
            f"push_to_hub={cfg.push_to_hub!r}: give the hub repo id, e.g. --push-to-hub org/name (TRL's "
            "push_to_hub: true + hub_model_id: org/name is written here as push_to_hub: org/name)"
        )


def _validate_online(cfg: TrainConfig) -> None:
    """Generation and judging settings of on-policy training."""
    if cfg.max_new_tokens is not None and cfg.max_new_tokens < 1:
        raise ConfigError(f"max_new_tokens={cfg.max_new_tokens} must be >= 1 (or unset for the completion limit)")
    if cfg.generation_batch_size is not None and cfg.generation_batch_size < 1:
        raise ConfigError(f"generation_batch_size={cfg.generation_batch_size} must be >= 1 (or unset)")
    if not 0 <= cfg.judge_max_skip <= 1:
        raise ConfigError(f"judge_max_skip={cfg.judge_max_skip} must be in [0, 1]")
    if not (cfg.temperature > 0 and math.isfinite(cfg.temperature)):
        raise ConfigError(f"temperature={cfg.temperature} must be a positive number")
    if not 0 < cfg.top_p <= 1:
        raise ConfigError(f"top_p={cfg.top_p} must be in (0, 1]")


def _validate_data_and_optimizer(cfg: TrainConfig) -> None:
    """Data processing, steps, fractions, the optimizer, precision and skips."""
    if cfg.dataset_num_proc is not None and cfg.dataset_num_proc < 1:
        raise ConfigError(f"dataset_num_proc={cfg.dataset_num_proc} must be >= 1 (or unset)")
    if cfg.max_steps is not None and cfg.max_steps < 1:
        raise ConfigError(f"max_steps={cfg.max_steps} must be >= 1 (or unset to use epochs)")
    if not 0 <= cfg.warmup_ratio < 1:
        raise ConfigError(f"warmup_ratio={cfg.warmup_ratio} must be in [0, 1)")
    if not 0 <= cfg.eval_fraction < 1:
        raise ConfigError(f"eval_fraction={cfg.eval_fraction} must be in [0, 1)")
    if not 0 <= cfg.lora_dropout < 1:
        raise ConfigError(f"lora_dropout={cfg.lora_dropout} must be in [0, 1)")
    if cfg.optim not in ("adamw", "adamw8bit"):
        raise ConfigError(f"optim={cfg.optim!r}: choose adamw or adamw8bit")
    if cfg.mixed_precision not in ("no", "bf16", "fp16"):
        raise ConfigError(f"mixed_precision={cfg.mixed_precision!r}: choose no, bf16 or fp16")
    if cfg.max_consecutive_skips < 0:
        raise ConfigError(f"max_consecutive_skips={cfg.max_consecutive_skips} must be >= 0 (0 = never stop)")
    if not cfg.dist_timeout > 0:
        raise ConfigError(f"dist_timeout={cfg.dist_timeout} must be > 0 seconds")
    if cfg.pairs_from_lists not in (None, "best-worst", "all-pairs", "best-vs-rest"):
        raise ConfigError(
            f"pairs_from_lists={cfg.pairs_from_lists!r}: choose best-worst, all-pairs or best-vs-rest (or unset)"
        )


def _validate_engine(cfg: TrainConfig) -> None:
    """Checkpoint frequency and the FSDP2 sharding."""
    if cfg.save_steps < 0:
        raise ConfigError(f"save_steps={cfg.save_steps} must be >= 0")
    if cfg.fsdp_sharding not in ("full", "shard_grad_op", "hybrid"):
        raise ConfigError(f"fsdp_sharding={cfg.fsdp_sharding!r}: choose full, shard_grad_op or hybrid")
    if cfg.fsdp_shard_size is not None and cfg.fsdp_shard_size < 1:
        raise ConfigError(f"fsdp_shard_size={cfg.fsdp_shard_size} must be >= 1 (or unset: the processes per node)")


def unknown_keys_message(unknown: list[str], known: list[str]) -> str:
    """``unknown key 'learnig_rate' (did you mean 'learning_rate'?)``: the closest of prefzoo's keys and TRL's names it
    accepts for each; without any close one, where the keys are listed (not all ~100 of them)."""
    import difflib

    from prefzoo.train.aliases import TRL_OPTIONS

    accepted = [*known, *(name for name, opt in TRL_OPTIONS.items() if opt.key is not None)]
    hints = []
    for k in unknown:
        close = difflib.get_close_matches(k, accepted, n=1, cutoff=0.7)
        hints.append(f"{k!r} (did you mean {close[0]!r}?)" if close else repr(k))
    plural = "s" if len(unknown) > 1 else ""
    return f"unknown key{plural} {', '.join(hints)}; `prefzoo train --help` lists every key (flags with _ for -)"


def resolve_aliases(values: dict[str, Any], where: str) -> dict[str, Any]:
    """``values`` with TRL's aliases renamed to prefzoo's keys; a ConfigError names a TRL option that means something
    else here (and what to write instead), or a key given under both names."""
    from prefzoo.train.aliases import TRL_OPTIONS

    out: dict[str, Any] = {}
    for name, value in values.items():
        opt = TRL_OPTIONS.get(name)
        if opt is not None and opt.key is None:
            raise ConfigError(f"{where}: {name} is TRL's option; in prefzoo: {opt.instead}")
        key = opt.key if opt is not None and opt.key is not None else name
        if key in out:
            raise ConfigError(f"{where}: {key} is given twice (under prefzoo's and TRL's name {name}); keep one")
        out[key] = value
    return out


_EXPECTED = {int: "an integer", float: "a number", bool: "true or false", tuple: "numbers separated by commas",
             dict: "a mapping of names to values"}  # fmt: skip


def _coerce(key: str, value: Any, typ: Any, name: str) -> Any:
    """Coerce a YAML/flag value to the declared type; on failure a ConfigError naming the key as ``name``."""
    if value is None:
        return None
    args = [a for a in typing.get_args(typ) if a is not type(None)]
    if isinstance(value, list) and any(typing.get_origin(a) is list for a in args) and str in args:
        return value[0] if len(value) == 1 and isinstance(value[0], str) else list(value)  # one source: a string
    base = typing.get_origin(typ) or typ
    if base is typing.Union or base is types.UnionType:
        base = typing.get_origin(args[0]) or args[0]
    try:
        if base is bool and isinstance(value, str):
            if value.lower() not in ("true", "false", "1", "0", "yes", "no"):
                raise ValueError(value)
            return value.lower() in ("true", "1", "yes")
        if base in (int, float, str, bool):
            if base is int and isinstance(value, float) and not value.is_integer():
                raise ValueError(value)
            return base(value)
        if base is tuple:
            return tuple(float(v) for v in (value.split(",") if isinstance(value, str) else value))
        if base is list and key in ("callbacks", "modifiers"):  # specs may hold commas and YAML mappings: kept as is
            return [value] if isinstance(value, str | dict) else list(value)
        if base is list:
            return [str(v) for v in (value.split(",") if isinstance(value, str) else value)]
        if base is dict:
            if not isinstance(value, dict):
                raise ValueError(value)
            return dict(value)
    except (TypeError, ValueError):
        what = _EXPECTED.get(base, f"a {getattr(base, '__name__', base)}")
        raise ConfigError(f"{name} {value!r}: expected {what}") from None
    return value


def load_yaml_config(path: str | Path) -> dict[str, Any]:
    """The mapping in a YAML run file (keys are TrainConfig field names; '-' may be written for '_')."""
    p = Path(path)
    if not p.is_file():
        raise ConfigError(f"--config {path}: no such file")
    try:
        import yaml
    except ImportError:
        raise ConfigError(f"--config {path}: reading YAML needs pyyaml; pip install 'prefzoo[train]'") from None
    data = yaml.safe_load(p.read_text()) or {}
    if not isinstance(data, dict):
        raise ConfigError(f"--config {path}: expected a mapping of keys to values, got {type(data).__name__}")
    return {str(k).replace("-", "_"): v for k, v in data.items()}


def field_docs() -> dict[str, str]:
    """The comment on every TrainConfig field (the ``--help`` text), read from this module's source."""
    import ast
    import inspect

    src = inspect.getsource(TrainConfig).splitlines()
    docs: dict[str, str] = {}
    for node in ast.parse("\n".join(src)).body[0].body:  # type: ignore[attr-defined]
        if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            line = src[(node.end_lineno or node.lineno) - 1]
            docs[node.target.id] = line.split("#", 1)[1].strip() if "#" in line else ""
    return docs
