"""`prefzoo export`: a LoRA adapter (or a run's final adapter) merged into a plain transformers model folder."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from prefzoo.cli.main import CLIError

_HELP = "Merge a trained LoRA adapter into its base model and save a plain transformers folder (no peft needed)."


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    p = subparsers.add_parser("export", help=_HELP, description=_HELP)
    p.add_argument("source", metavar="ADAPTER", help="an adapter folder (adapter_config.json) or a run's --output-dir")
    p.add_argument("--output", "-o", required=True, metavar="DIR", help="where the merged model goes (must not exist)")
    p.add_argument("--torch-dtype", default="float32", choices=("float32", "bfloat16", "float16", "auto"),
                   help="dtype of the merged weights (default: float32)")  # fmt: skip
    p.add_argument("--trust-remote-code", action="store_true", help="run the base model folder's own code")
    return p


def adapter_folder(source: str) -> Path:
    """The adapter folder ``source`` names (a run's output dir means its ``final/``), or a CLIError saying why not."""
    path = Path(source)
    if (path / "final").is_dir() and not (path / "adapter_config.json").is_file():
        path = path / "final"
    if not path.is_dir():
        raise CLIError(f"{source}: no such folder; give a LoRA adapter folder or a prefzoo run's --output-dir")
    if not (path / "adapter_config.json").is_file():
        what = "a full model (config.json): it is already a plain folder" if (path / "config.json").is_file() else ""
        raise CLIError(f"{path}: no adapter_config.json, so nothing to merge{'; ' + what if what else ''}")
    return path


def merge_adapter(source: str | Path, output: str | Path, torch_dtype: str = "float32", **load: Any) -> Path:
    """Load base + adapter, ``merge_and_unload`` and ``save_pretrained`` model and tokenizer into ``output``."""
    import torch
    from peft import AutoPeftModelForCausalLM
    from transformers import AutoTokenizer

    src = Path(source)
    dtype = "auto" if torch_dtype == "auto" else getattr(torch, torch_dtype)
    model = AutoPeftModelForCausalLM.from_pretrained(str(src), dtype=dtype, **load)
    base = model.peft_config["default"].base_model_name_or_path
    merged = model.merge_and_unload()
    out = Path(output)
    merged.save_pretrained(out, safe_serialization=True)
    tok_src = str(src) if (src / "tokenizer_config.json").is_file() else base
    AutoTokenizer.from_pretrained(tok_src, **load).save_pretrained(out)
    readme = src / "README.md"
    if readme.is_file():  # the run's model card, now describing a merged model
        text = readme.read_text().replace("library_name: peft", "library_name: transformers", 1)
        (out / "README.md").write_text(text.replace("- saved: LoRA adapter", "- saved: merged model (prefzoo export)"))
    return out


def run(args: argparse.Namespace) -> int:
    src = adapter_folder(args.source)
    out = Path(args.output)
    if out.exists():
        raise CLIError(f"--output {out} exists; give a new folder")
    load = {"trust_remote_code": True} if args.trust_remote_code else {}
    try:
        merge_adapter(src, out, args.torch_dtype, **load)
    except (OSError, ValueError) as e:
        first = (str(e).strip().splitlines() or [type(e).__name__])[0][:300]
        raise CLIError(f"{src}: cannot load the adapter or its base model ({type(e).__name__}: {first})") from None
    print(f"prefzoo export: merged {src} into its base model; plain transformers folder {out}")
    return 0
