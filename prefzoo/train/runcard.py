"""Saving the final model (full, adapter or merged) with its tokenizer and a run card (config, versions, metrics)."""

from __future__ import annotations

import contextlib
import json
import platform
import shutil
from datetime import datetime, timezone
from importlib import metadata
from pathlib import Path
from typing import Any

__all__ = ["versions", "write_final_model"]

_PACKAGES = ("prefzoo", "torch", "transformers", "accelerate", "peft", "datasets", "deepspeed", "bitsandbytes")


def versions() -> dict[str, str]:
    """Installed versions of the packages a run depends on."""
    out = {"python": platform.python_version()}
    for name in _PACKAGES:
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            out[name] = "not installed"
    return out


def write_final_model(accelerator: Any, policy: Any, tokenizer: Any, cfg: Any, result: Any) -> Path:
    """``output_dir/final``: save_pretrained model (or adapter / merged model), tokenizer, run_card.json, README.md."""
    final = Path(cfg.output_dir) / "final"
    tmp = Path(cfg.output_dir) / ".tmp-final"
    accelerator.wait_for_everyone()
    state_dict = accelerator.get_state_dict(policy)  # gathers ZeRO-3 shards; keys prefixed with 'lm.'
    lm = accelerator.unwrap_model(policy).lm
    if accelerator.is_main_process:
        if tmp.exists():
            shutil.rmtree(tmp)
        sd = {k[len("lm.") :]: v for k, v in state_dict.items() if k.startswith("lm.")}
        is_peft = hasattr(lm, "peft_config")
        defaults = getattr(result, "model_defaults", None)
        # the saved config keeps the model's own dropout rates (the run set them to 0 in memory only)
        with defaults.dropout.config_restored() if defaults is not None else contextlib.nullcontext():
            if is_peft and cfg.merge_lora:
                import copy

                copy.deepcopy(lm).merge_and_unload().save_pretrained(tmp)
            else:
                lm.save_pretrained(tmp, state_dict=sd, safe_serialization=True)
        tokenizer.save_pretrained(tmp)
        card = {
            "created": datetime.now(timezone.utc).isoformat(timespec="seconds"),
            "saved": "merged model" if is_peft and cfg.merge_lora else ("LoRA adapter" if is_peft else "full model"),
            "config": cfg.to_dict(),
            "processes": accelerator.num_processes,
            "global_batch_pairs": accelerator.num_processes * cfg.per_device_batch_size * cfg.grad_accum,
            "steps": result.global_step,
            "versions": versions(),
            "data": result.data_stats,
            "model_defaults": defaults.as_dict() if defaults is not None else {},
            "final_metrics": result.history[-1] if result.history else {},
            "evals": result.evals,
        }
        (tmp / "run_card.json").write_text(json.dumps(card, indent=1, default=str))
        lines = [
            f"# prefzoo run: {cfg.loss} on {cfg.model}",
            "",
            f"- saved: {card['saved']}",
            f"- steps: {result.global_step}, global batch {card['global_batch_pairs']} pairs",
            *([f"- {line}" for line in defaults.lines()] if defaults is not None else []),
            *(f"- {k}: {v:.4f}" for k, v in card["final_metrics"].items() if isinstance(v, float)),
            *(f"- epoch {int(e['epoch'])} eval reward accuracy: {e['eval/reward_accuracy']:.4f}" for e in result.evals),
            "",
            "See run_card.json for the full config and versions.",
        ]
        (tmp / "README.md").write_text("\n".join(lines) + "\n")
        if final.exists():
            shutil.rmtree(final)
        tmp.rename(final)
    accelerator.wait_for_everyone()
    return final
