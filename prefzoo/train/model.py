"""Loading the policy and tokenizer, LoRA via peft, and the optimizer / schedule."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from torch import nn

__all__ = ["LoRATargetError", "ModelSourceError", "apply_lora", "build_optimizer", "check_model_source",
           "load_model_and_tokenizer"]  # fmt: skip

_TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "vocab.json", "spiece.model")


class LoRATargetError(ValueError):
    """LoRA target modules not present in the model."""


class ModelSourceError(FileNotFoundError):
    """``--model`` names a local folder that is missing, or one without a model config or a tokenizer."""


def check_model_source(name: str) -> None:
    """Fail before anything loads when ``name`` is a local path that cannot be a model folder (hub names pass)."""
    path = Path(name).expanduser()
    looks_local = name.startswith((".", "/", "~")) or name.count("/") > 1 or path.exists()
    if not looks_local:
        return  # org/name on the hub
    if not path.is_dir():
        raise ModelSourceError(
            f"--model {name}: no such folder; give a save_pretrained() folder or a hub name such as org/name"
        )
    if (path / "adapter_config.json").is_file():
        return  # a LoRA adapter: the base model and perhaps the tokenizer come from its base_model_name_or_path
    if not (path / "config.json").is_file():
        raise ModelSourceError(f"--model {name}: the folder has no config.json; save the model with save_pretrained()")
    if not any((path / f).is_file() for f in _TOKENIZER_FILES):
        raise ModelSourceError(
            f"--model {name}: the folder has no tokenizer ({', '.join(_TOKENIZER_FILES[:2])}, ...); save it there "
            "with tokenizer.save_pretrained(folder)"
        )


def load_model_and_tokenizer(
    name: str, dtype: Any = None, trust_remote_code: bool = False
) -> tuple[nn.Module, Any, bool]:
    """(model, tokenizer, has_adapter) from a hub name or local folder; a folder with an adapter loads base+adapter.

    ``trust_remote_code`` stays False unless the user passes ``--trust-remote-code``: a model folder's own Python
    code (``auto_map``) is never run otherwise.
    """
    check_model_source(name)
    remote: dict[str, Any] = {"trust_remote_code": True} if trust_remote_code else {}
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    dtype = dtype or torch.float32
    path = Path(name)
    if (path / "adapter_config.json").is_file():
        from peft import AutoPeftModelForCausalLM

        model = AutoPeftModelForCausalLM.from_pretrained(str(path), is_trainable=True, dtype=dtype, **remote)
        base_name = model.peft_config["default"].base_model_name_or_path
        tok_src = str(path) if (path / "tokenizer_config.json").is_file() else base_name
        return model, AutoTokenizer.from_pretrained(tok_src, **remote), True
    model = AutoModelForCausalLM.from_pretrained(name, dtype=dtype, **remote)
    return model, AutoTokenizer.from_pretrained(name, **remote), False


def apply_lora(model: nn.Module, r: int, alpha: int, dropout: float, target_modules: list[str]) -> nn.Module:
    """``model`` wrapped with fresh LoRA adapters on ``target_modules``; missing module names are an error."""
    from peft import LoraConfig, get_peft_model

    linear_names = sorted({n.rsplit(".", 1)[-1] for n, m in model.named_modules() if isinstance(m, nn.Linear)})
    missing = [t for t in target_modules if t not in linear_names]
    if missing:
        raise LoRATargetError(
            f"--lora target modules {missing} are not linear layers of this model; its linear layers are "
            f"{linear_names}: set lora_target_modules to some of them"
        )
    cfg = LoraConfig(
        r=r,
        lora_alpha=alpha,
        lora_dropout=dropout,
        target_modules=list(target_modules),
        task_type="CAUSAL_LM",
        bias="none",
    )
    return get_peft_model(model, cfg)


def build_optimizer(
    params: list[nn.Parameter], name: str, lr: float, betas: tuple[float, float], weight_decay: float
) -> Any:
    """torch AdamW or bitsandbytes AdamW8bit (which also steps on CPU)."""
    if name == "adamw8bit":
        try:
            import bitsandbytes as bnb
        except ImportError:
            raise ImportError("--optim adamw8bit needs bitsandbytes: pip install 'prefzoo[train]'") from None
        return bnb.optim.AdamW8bit(params, lr=lr, betas=betas, weight_decay=weight_decay)
    import torch

    return torch.optim.AdamW(params, lr=lr, betas=betas, weight_decay=weight_decay)


def build_schedule(optimizer: Any, total_steps: int, warmup_ratio: float) -> Any:
    """transformers' cosine schedule with linear warm-up over ``ceil(warmup_ratio × total_steps)`` steps."""
    from transformers import get_cosine_schedule_with_warmup

    return get_cosine_schedule_with_warmup(optimizer, math.ceil(warmup_ratio * total_steps), total_steps)
