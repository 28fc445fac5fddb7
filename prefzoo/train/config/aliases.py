"""TRL's option names in prefzoo: one table, read by the YAML loader, the ``prefzoo train`` flags and the docs.

An entry with ``key`` set is an alias: TRL's name means what that :class:`~prefzoo.train.config.TrainConfig` key
means, and is accepted for it (``TrainConfig.from_dict`` renames it).  An entry without ``key`` means something else
in prefzoo; giving it is an error whose message is ``instead`` (what to write).  docs/training.md's "Coming from
TRL" table is :func:`trl_table_markdown` (a test fails when they drift).
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["TRL_OPTIONS", "TRLOption", "trl_table_markdown"]


@dataclass(frozen=True)
class TRLOption:
    key: str | None = None  # the TrainConfig key with the same meaning (accepted as an alias); None: not the same
    instead: str = ""  # when key is None: what to write in prefzoo instead, and why

    def flag(self) -> str:
        assert self.key is not None
        return "--" + ("loss-param" if self.key == "loss_params" else self.key.replace("_", "-"))


TRL_OPTIONS: dict[str, TRLOption] = {
    # same meaning, prefzoo spells it differently
    "learning_rate": TRLOption("lr"),
    "per_device_train_batch_size": TRLOption("per_device_batch_size"),
    "gradient_accumulation_steps": TRLOption("grad_accum"),
    "num_train_epochs": TRLOption("epochs"),
    "model_name_or_path": TRLOption("model"),
    "dataset_name": TRLOption("dataset"),
    "use_peft": TRLOption("lora"),
    "precompute_ref_log_probs": TRLOption("precompute_ref"),
    "dtype": TRLOption("torch_dtype"),
    "hub_model_id": TRLOption("push_to_hub"),
    # same meaning, same name
    "max_steps": TRLOption("max_steps"),
    "warmup_ratio": TRLOption("warmup_ratio"),
    "max_prompt_length": TRLOption("max_prompt_length"),
    "max_completion_length": TRLOption("max_completion_length"),
    "seed": TRLOption("seed"),
    "output_dir": TRLOption("output_dir"),
    "logging_steps": TRLOption("logging_steps"),
    "save_steps": TRLOption("save_steps"),
    "save_total_limit": TRLOption("save_total_limit"),
    "weight_decay": TRLOption("weight_decay"),
    "max_grad_norm": TRLOption("max_grad_norm"),
    "report_to": TRLOption("report_to"),
    "dataset_num_proc": TRLOption("dataset_num_proc"),
    "lora_r": TRLOption("lora_r"),
    "lora_alpha": TRLOption("lora_alpha"),
    "lora_dropout": TRLOption("lora_dropout"),
    "lora_target_modules": TRLOption("lora_target_modules"),
    "trust_remote_code": TRLOption("trust_remote_code"),
    "hub_private_repo": TRLOption("hub_private_repo"),
    "torch_dtype": TRLOption("torch_dtype"),
    "attn_implementation": TRLOption("attn_implementation"),
    "gradient_checkpointing": TRLOption("gradient_checkpointing"),
    "load_in_4bit": TRLOption("load_in_4bit"),
    "load_in_8bit": TRLOption("load_in_8bit"),
    "eval_steps": TRLOption("eval_steps"),
    "save_only_model": TRLOption("save_only_model"),
    "lr_scheduler_type": TRLOption("lr_scheduler_type"),
    "warmup_steps": TRLOption("warmup_steps"),
    "prompt_sample_size": TRLOption("density_ratio_prompts"),
    "min_density_ratio": TRLOption("min_density_ratio"),
    "max_density_ratio": TRLOption("max_density_ratio"),
    # not the same meaning: what to write instead
    "beta": TRLOption(
        instead="--loss-param beta=VALUE (YAML: loss_params: {beta: VALUE}); β is a parameter of the loss"
    ),
    "loss_type": TRLOption(instead="--loss NAME (e.g. --loss dpo; `prefzoo losses` lists them)"),
    "max_length": TRLOption(
        instead="--max-prompt-length N and --max-completion-length N (prefzoo caps prompt and completion separately)"
    ),
    "disable_dropout": TRLOption(instead="leave it out: dropout is off by default (--keep-dropout keeps it on)"),
    "bf16": TRLOption(instead="--mixed-precision bf16"),
    "fp16": TRLOption(instead="--mixed-precision fp16"),
    "adam_beta1": TRLOption(instead="--adam-betas B1,B2 (both AdamW betas in one option)"),
    "adam_beta2": TRLOption(instead="--adam-betas B1,B2 (both AdamW betas in one option)"),
}


def trl_table_markdown() -> str:
    """The "Coming from TRL" table of docs/training.md."""
    rows = ["| TRL option | prefzoo | TRL's name accepted (flag and YAML) |", "|---|---|---|"]
    for name, opt in TRL_OPTIONS.items():
        if opt.key is None:
            rows.append(f"| `{name}` | {opt.instead} | no: it would not mean the same; the error says this |")
        else:
            rows.append(f"| `{name}` | `{opt.flag()}` | yes{' (same name)' if opt.key == name else ''} |")
    return "\n".join(rows) + "\n"
