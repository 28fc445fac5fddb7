"""Loading the policy and tokenizer (checked sources, quantization, gradient checkpointing) and LoRA via peft."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from torch import nn

from prefzoo.errors import install_hint

__all__ = ["LoRATargetError", "LoadOptionError", "ModelSourceError", "apply_lora", "check_model_source",
           "enable_gradient_checkpointing", "load_kwargs", "load_model_and_tokenizer", "load_tokenizer",
           "prepare_quantized", "remote_code_note"]  # fmt: skip

# what from_pretrained loads weights from: safetensors or PyTorch files, single or sharded (an index and its shards)
_WEIGHT_FILES = ("model.safetensors", "model-*-of-*.safetensors", "pytorch_model.bin", "pytorch_model-*-of-*.bin",
                 "model.safetensors.index.json", "pytorch_model.bin.index.json", "*.safetensors")  # fmt: skip
_TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "vocab.json", "spiece.model")


class LoRATargetError(ValueError):
    """LoRA target modules not present in the model."""


class LoadOptionError(ValueError):
    """A model-loading option (--torch-dtype, --attn-implementation, --load-in-4bit/8bit) cannot work here."""


class ModelSourceError(FileNotFoundError):
    """``--model`` names a local folder that is missing, one without a model config or a tokenizer, one whose
    safetensors weights are truncated or not safetensors at all, or a hub name that cannot be fetched (offline)."""


def check_model_source(name: str) -> None:
    """Fail before anything loads when ``name`` is a local path that cannot be a model folder (hub names pass)."""
    path = Path(name).expanduser()
    if _is_hub_name(name):
        return  # org/name on the hub
    if not path.is_dir():
        raise ModelSourceError(
            f"--model {name}: no such folder; give a save_pretrained() folder or a hub name such as org/name"
        )
    if (path / "adapter_config.json").is_file():
        return  # a LoRA adapter: the base model and perhaps the tokenizer come from its base_model_name_or_path
    if not (path / "config.json").is_file():
        raise ModelSourceError(f"--model {name}: the folder has no config.json; save the model with save_pretrained()")
    if not any(next(path.glob(pattern), None) for pattern in _WEIGHT_FILES):
        raise ModelSourceError(
            f"--model {name}: the folder has no weights ({', '.join(_WEIGHT_FILES[:3])}, ...); save the model there "
            "with model.save_pretrained(folder)"
        )
    if not any((path / f).is_file() for f in _TOKENIZER_FILES):
        raise ModelSourceError(
            f"--model {name}: the folder has no tokenizer ({', '.join(_TOKENIZER_FILES[:2])}, ...); save it there "
            "with tokenizer.save_pretrained(folder)"
        )
    _check_safetensors(name, path)


def _check_safetensors(name: str, folder: Path) -> None:
    """Each ``*.safetensors`` file's header read (cheap: no tensor loads): a truncated or garbage file is one line
    naming it, before transformers fails on it with a traceback."""
    from safetensors import SafetensorError, safe_open

    for file in sorted(folder.glob("*.safetensors")):
        try:
            with safe_open(str(file), framework="pt"):
                pass
        except (SafetensorError, OSError) as e:
            first = (str(e).strip().splitlines() or [type(e).__name__])[0][:200]
            raise ModelSourceError(
                f"--model {name}: {file.name} is not a complete safetensors file ({first}): it is truncated or "
                "corrupt; copy or save the model again (model.save_pretrained(folder))"
            ) from None


def _hub_error(name: str, e: OSError) -> ModelSourceError:
    """A hub name that did not load (offline, no such repo, no network) as one line with the way out."""
    from huggingface_hub import constants

    first = (str(e).strip().splitlines() or [type(e).__name__])[0][:200]
    if constants.HF_HUB_OFFLINE:
        return ModelSourceError(
            f"--model {name}: a hub model name, and the hub is offline (HF_HUB_OFFLINE is set) with no copy in the "
            f"cache; download it where there is network (hf download {name}), or give a local save_pretrained folder"
        )
    return ModelSourceError(
        f"--model {name}: cannot be loaded from the hub ({first}); check the name, your network and token "
        "(hf auth login), or give a local save_pretrained folder"
    )


def _is_hub_name(name: str) -> bool:
    return not (name.startswith((".", "/", "~")) or name.count("/") > 1 or Path(name).expanduser().exists())


def remote_code_note(name: str, trust_remote_code: bool) -> str | None:
    """With ``--trust-remote-code``, the line saying whose Python will run: the model folder's ``.py`` files by name
    (a hub name: the repo's code, fetched at load); None without the flag."""
    if not trust_remote_code:
        return None
    path = Path(name).expanduser()
    if _is_hub_name(name):
        return f"--trust-remote-code: Python code from the hub repo {name} (its .py files) will run in this process"
    files = sorted(str(p.relative_to(path)) for p in path.rglob("*.py")) if path.is_dir() else []
    if not files:
        return f"--trust-remote-code: {name} holds no .py files, so no code from it runs (the flag can be dropped)"
    return f"--trust-remote-code: Python code from {name} will run in this process: {', '.join(files)}"


def load_kwargs(
    torch_dtype: str = "float32",
    attn_implementation: str | None = None,
    load_in_4bit: bool = False,
    load_in_8bit: bool = False,
    cuda: bool | None = None,
) -> dict[str, Any]:
    """``from_pretrained`` keyword arguments for the loading options, or a LoadOptionError naming the fix.

    ``cuda``: whether a CUDA GPU will run the model (default: ``torch.cuda.is_available()``).
    """
    import torch

    cuda = torch.cuda.is_available() if cuda is None else cuda
    kw: dict[str, Any] = {"dtype": "auto" if torch_dtype == "auto" else getattr(torch, torch_dtype)}
    if attn_implementation == "flash_attention_2":
        if not cuda:
            raise LoadOptionError(
                "--attn-implementation flash_attention_2 needs a CUDA GPU (and pip install flash-attn); on this "
                "machine use --attn-implementation sdpa (or eager)"
            )
        import importlib.util

        if importlib.util.find_spec("flash_attn") is None:
            raise LoadOptionError(
                "--attn-implementation flash_attention_2 needs the flash-attn package: pip install flash-attn "
                "--no-build-isolation (or use --attn-implementation sdpa)"
            )
        if torch_dtype not in ("bfloat16", "float16"):
            raise LoadOptionError(
                "--attn-implementation flash_attention_2 runs in half precision only: add --torch-dtype bfloat16"
            )
    if attn_implementation is not None:
        kw["attn_implementation"] = attn_implementation
    if load_in_4bit or load_in_8bit:
        try:
            import bitsandbytes  # noqa: F401
            from transformers import BitsAndBytesConfig
        except ImportError:
            raise LoadOptionError(
                f"--load-in-4bit/--load-in-8bit need bitsandbytes: {install_hint('qlora')}"
            ) from None
        compute = torch.float32 if torch_dtype in ("float32", "auto") else getattr(torch, torch_dtype)
        kw["quantization_config"] = (
            BitsAndBytesConfig(
                load_in_4bit=True,  # QLoRA (Dettmers et al. 2023): NF4 storage, double quantisation
                bnb_4bit_quant_type="nf4",
                bnb_4bit_use_double_quant=True,
                bnb_4bit_compute_dtype=compute,
            )
            if load_in_4bit
            else BitsAndBytesConfig(load_in_8bit=True)
        )
    return kw


def enable_gradient_checkpointing(model: nn.Module) -> None:
    """Activation checkpointing per decoder layer, non-reentrant (works with frozen inputs, LoRA and DDP)."""
    if not getattr(model, "supports_gradient_checkpointing", True):
        raise LoadOptionError(
            f"--gradient-checkpointing: {type(model).__name__} does not support gradient checkpointing; drop the flag"
        )
    new: Any = getattr(model, "activation_checkpointing_enable", None)  # transformers 5.2x's name
    old: Any = getattr(model, "gradient_checkpointing_enable", None)
    if callable(new):
        new(activation_checkpointing_kwargs={"use_reentrant": False})
    elif callable(old):
        old(gradient_checkpointing_kwargs={"use_reentrant": False})
    else:
        raise LoadOptionError(f"--gradient-checkpointing: {type(model).__name__} cannot checkpoint; drop the flag")


def prepare_quantized(model: nn.Module, gradient_checkpointing: bool) -> nn.Module:
    """peft's ``prepare_model_for_kbit_training`` (layer norms in float32, input grads on) before adapters go on."""
    from peft import prepare_model_for_kbit_training

    return prepare_model_for_kbit_training(  # type: ignore[no-any-return]
        model,
        use_gradient_checkpointing=gradient_checkpointing,
        gradient_checkpointing_kwargs={"use_reentrant": False},
    )


def load_model_and_tokenizer(
    name: str, dtype: Any = None, trust_remote_code: bool = False, tokenizer: Any = None, **load: Any
) -> tuple[nn.Module, Any, bool]:
    """(model, tokenizer, has_adapter) from a hub name or local folder; a folder with an adapter loads base+adapter.

    ``trust_remote_code`` stays False unless the user passes ``--trust-remote-code``: a model folder's own Python
    code (``auto_map``) is never run otherwise.  ``load``: more ``from_pretrained`` arguments (:func:`load_kwargs`);
    ``tokenizer``: one already loaded by :func:`load_tokenizer`.
    """
    check_model_source(name)
    remote: dict[str, Any] = {"trust_remote_code": True} if trust_remote_code else {}
    import torch
    from transformers import AutoModelForCausalLM

    tokenizer = tokenizer if tokenizer is not None else load_tokenizer(name, trust_remote_code)
    dtype = load.pop("dtype", None) or dtype or torch.float32
    path = Path(name)
    if (path / "adapter_config.json").is_file():
        from peft import AutoPeftModelForCausalLM

        model = AutoPeftModelForCausalLM.from_pretrained(
            str(path), is_trainable=True, dtype=dtype, **remote, **load
        )
        return model, tokenizer, True
    try:
        model = AutoModelForCausalLM.from_pretrained(name, dtype=dtype, **remote, **load)
    except OSError as e:
        if not _is_hub_name(name) or isinstance(e, ModelSourceError):
            raise
        raise _hub_error(name, e) from None
    return model, tokenizer, False


def load_tokenizer(name: str, trust_remote_code: bool = False) -> Any:
    """The tokenizer of a model folder or hub name; a LoRA adapter folder's own, else its base model's (cheap: the
    run loads it before the model, to render the chat template once)."""
    import json

    from transformers import AutoTokenizer

    check_model_source(name)
    remote: dict[str, Any] = {"trust_remote_code": True} if trust_remote_code else {}
    path = Path(name)
    source = name
    if (path / "adapter_config.json").is_file() and not (path / "tokenizer_config.json").is_file():
        source = json.loads((path / "adapter_config.json").read_text())["base_model_name_or_path"]
    try:
        return AutoTokenizer.from_pretrained(source, **remote)
    except OSError as e:
        if not _is_hub_name(source):
            raise
        raise _hub_error(source, e) from None


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
