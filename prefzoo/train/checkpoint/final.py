"""Saving the final model (full, adapter or merged) with its tokenizer and a run card (config, versions, metrics)."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import platform
import shutil
from collections.abc import Callable
from datetime import datetime, timezone
from importlib import metadata
from pathlib import Path
from typing import Any

from prefzoo._secrets import redact
from prefzoo.train.errors import TrainingAborted

__all__ = [
    "NonFiniteWeightsError",
    "final_state_dict",
    "load_final_model",
    "loss_params",
    "model_card_front_matter",
    "save_model_folder",
    "versions",
    "write_final_model",
]

class NonFiniteWeightsError(TrainingAborted):
    """The trained weights hold NaN or inf: the final model is not written (an earlier one is kept)."""


_PACKAGES = ("prefzoo", "torch", "transformers", "accelerate", "peft", "datasets", "bitsandbytes")


def versions(packages: tuple[str, ...] | None = None, missing: str = "not installed") -> dict[str, str]:
    """Python's and the installed version of each of ``packages`` (default: those a run depends on, the sharding
    engines' included); ``missing`` for one that is not installed."""
    if packages is None:
        from prefzoo.train.engines import ENGINE_PACKAGES

        packages = (*_PACKAGES, *ENGINE_PACKAGES)
    out = {"python": platform.python_version()}
    for name in packages:
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            out[name] = missing
    return out


def save_model_folder(
    accelerator: Any,
    policy: Any,
    tokenizer: Any,
    folder: Path,
    defaults: Any = None,
    merge: bool = False,
    engine: Any = None,
    finite: Callable[[dict[str, Any]], None] | None = None,
) -> str:
    """``save_pretrained`` of the trained model (or adapter, or merged model) and tokenizer into ``folder``.

    Call on every process (the ``engine`` gathers its shards, :class:`prefzoo.train.engines.Engine`); the main
    process writes.  ``finite(state_dict)``, called on every process before anything is written, may refuse the
    weights (the state dict is whole on the main process, empty elsewhere).  Returns what was saved.
    """
    sd = final_state_dict(accelerator, policy, engine)
    if finite is not None:
        finite(sd)
    lm = accelerator.unwrap_model(policy).lm
    is_peft = hasattr(lm, "peft_config")
    if accelerator.is_main_process:
        # the saved config keeps the model's own dropout rates (the run set them to 0 in memory only)
        with defaults.dropout.config_restored() if defaults is not None else contextlib.nullcontext():
            if is_peft and merge:
                import copy

                copy.deepcopy(lm).merge_and_unload().save_pretrained(folder)
            else:
                lm.save_pretrained(folder, state_dict=sd, safe_serialization=True)
        tokenizer.save_pretrained(folder)
    return "merged model" if is_peft and merge else ("LoRA adapter" if is_peft else "full model")


def final_state_dict(accelerator: Any, policy: Any, engine: Any = None) -> dict[str, Any]:
    """The trained model's whole state dict on the main process (empty elsewhere), the same for every engine.

    Call on every process: the ``engine`` gathers its shards (:meth:`prefzoo.train.engines.Engine.full_state_dict`;
    None: accelerate's ``get_state_dict``).  Keys are the model's own (``policy.lm``'s), and parameters the model
    ties (embeddings and LM head) are one tensor under each of their names, as in the unwrapped model, so
    ``save_pretrained`` writes the keys it writes for that model (one of a tied pair) whichever engine trained it (a
    sharded gather may return a separate copy per name, which would save the tied LM head too).
    """
    full = engine.full_state_dict(accelerator, policy) if engine is not None else accelerator.get_state_dict(policy)
    # some engines return None off the main process; keys carry the policy wrapper's 'lm.' prefix
    sd = {k[len("lm.") :]: v for k, v in (full or {}).items() if k.startswith("lm.")}
    lm = accelerator.unwrap_model(policy).lm
    for names in _tied_names(lm):
        present = [n for n in names if n in sd]
        for name in present[1:]:
            sd[name] = sd[present[0]]
    return sd


def _tied_names(module: Any) -> list[list[str]]:
    """Groups of two or more names under which ``module`` holds one and the same parameter (tied weights)."""
    groups: dict[int, list[str]] = {}
    for name, param in module.named_parameters(remove_duplicate=False):
        groups.setdefault(id(param), []).append(name)
    return [names for names in groups.values() if len(names) > 1]


def write_final_model(
    accelerator: Any, policy: Any, tokenizer: Any, cfg: Any, result: Any, engine: Any = None, loss: Any = None
) -> Path:
    """``output_dir/final``: save_pretrained model (or adapter / merged model), tokenizer, run_card.json, README.md.

    ``loss``: the run's :class:`prefzoo.spec.Loss`, whose effective parameters (defaults included) the cards list.

    A full disk (ENOSPC/EDQUOT) on the way removes the partial folder and raises DiskFullError on every process;
    the last checkpoint (the run's last step) is left as it was, so ``--resume auto`` writes the model afterwards.
    Weights that hold NaN or inf are never written: :class:`NonFiniteWeightsError` on every process, and an earlier
    ``final`` stays as it was.
    """
    from prefzoo.train.checkpoint.save import _any_process, _enospc, _move_into_place

    final = Path(cfg.output_dir) / "final"
    tmp = Path(cfg.output_dir) / ".tmp-final"
    accelerator.wait_for_everyone()
    if accelerator.is_main_process and tmp.exists():
        shutil.rmtree(tmp)
    accelerator.wait_for_everyone()  # a leftover folder is gone before any process writes into it
    defaults = getattr(result, "model_defaults", None)
    saved: list[str] = []

    def write() -> None:
        saved.append(save_model_folder(accelerator, policy, tokenizer, tmp, defaults, merge=cfg.merge_lora,
                                        engine=engine, finite=lambda sd: _refuse_nonfinite(accelerator, sd, final)))
        if accelerator.is_main_process:
            params = loss_params(loss) if loss is not None else dict(cfg.loss_params)
            _write_cards(tmp, saved[0], accelerator, cfg.to_dict(), result, defaults, params)

    full = _enospc(write, Path(cfg.output_dir))
    if _any_process(accelerator, full is not None):
        raise _final_disk_full(accelerator, cfg.output_dir, tmp, full)
    if accelerator.is_main_process:
        _move_into_place(tmp, final)
    accelerator.wait_for_everyone()
    return final


def _refuse_nonfinite(accelerator: Any, sd: dict[str, Any], final: Path) -> None:
    """Every process: NonFiniteWeightsError when a floating-point tensor of ``sd`` holds NaN or inf (on any process)."""
    import torch

    from prefzoo.train.checkpoint.save import _any_process

    bad = [k for k, v in sd.items() if torch.is_tensor(v) and v.is_floating_point() and not bool(v.isfinite().all())]
    if not _any_process(accelerator, bool(bad)):
        return
    where = f"{len(bad)} of {len(sd)} tensors, e.g. {bad[0]}" if bad else "on another process"
    kept = f"{final} keeps the model it held" if final.exists() else f"{final} was not written"
    raise NonFiniteWeightsError(
        f"the trained weights hold NaN or inf ({where}), so the final model is not saved: {kept}. The state the run "
        "started from is probably damaged: check it with `prefzoo checkpoint info`, and resume from an earlier "
        "checkpoint with --resume PATH (or start afresh with a new --output-dir)"
    )


def load_final_model(folder: Path) -> Any:
    """The model :func:`write_final_model` saved in ``folder``, whole on this process and in eval mode, whichever
    engine trained it (a sharded run's ``TrainResult.model`` holds only this rank's shards): the full or merged
    model, or the LoRA adapter on its base model."""
    from prefzoo.model import load_model_and_tokenizer

    model, _, _ = load_model_and_tokenizer(str(folder))
    return model.eval()


def _final_disk_full(accelerator: Any, output_dir: str, tmp: Path, err: OSError | None) -> Any:
    from prefzoo.train.checkpoint.save import (
        DiskFullError,
        _bytes,
        _measure_and_remove,
        find_latest_checkpoint,
        free_and_where,
    )

    written = _measure_and_remove(accelerator, tmp, accelerator.is_main_process)
    latest = find_latest_checkpoint(output_dir)
    needed = max(written, _bytes(latest / "model.safetensors") if latest else 0)
    free, where = free_and_where(tmp, err)
    kept = f"the last checkpoint {latest} is intact" if latest else "no checkpoint was written"
    return DiskFullError(
        f"disk full (ENOSPC) writing the final model at {where}: it needs about {needed / 1e6:.1f} MB, "
        f"{free / 1e6:.1f} MB are free in {tmp.parent}; the partial folder was removed and {kept}. Free space and "
        "rerun the same command with --resume auto to write the final model (no step is trained again)"
    )


def loss_params(loss: Any) -> dict[str, Any]:
    """Every parameter of ``loss`` (a Loss; a modifier's are prefixed with its name) with the value the run used,
    defaults included ({} for a loss whose params are not a dataclass)."""
    params = getattr(loss, "params", None)
    if params is None or not dataclasses.is_dataclass(params):
        return {}
    values = {f.name: getattr(params, f.name) for f in dataclasses.fields(params)}
    return {k: v if isinstance(v, bool | int | float | str | type(None)) else str(v) for k, v in values.items()}


def _write_cards(
    folder: Path, saved: str, accelerator: Any, values: dict[str, Any], result: Any, defaults: Any,
    params: dict[str, Any],
) -> None:
    """run_card.json (config ``values``, versions, the loss's parameters, metrics) and README.md (a Hugging Face
    model card with YAML front matter)."""
    card = {
        "created": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "saved": saved,
        "config": redact(values),  # a secret (--judge-params api_key=...) never reaches a card
        "loss_params": redact(params),  # effective: the config's loss_params holds only what was set
        "processes": accelerator.num_processes,
        "global_batch_pairs": accelerator.num_processes * values["per_device_batch_size"] * values["grad_accum"],
        "steps": result.global_step,
        "versions": versions(),
        "data": result.data_stats,
        "model_defaults": defaults.as_dict() if defaults is not None else {},
        "final_metrics": result.last_metrics or (result.history[-1] if result.history else {}),
        "evals": result.evals,
    }
    (folder / "run_card.json").write_text(json.dumps(card, indent=1, default=str))
    lines = [
        f"# prefzoo run: {values['loss']} on {values['model']}",
        "",
        f"- saved: {card['saved']}",
        f"- steps: {result.global_step}, global batch {card['global_batch_pairs']} pairs",
        *([f"- {line}" for line in defaults.lines()] if defaults is not None else []),
        *(f"- {k}: {v:.4f}" for k, v in card["final_metrics"].items() if isinstance(v, float)),
        *(f"- epoch {int(e['epoch'])} eval reward accuracy: {e['eval/reward_accuracy']:.4f}" for e in result.evals),
        "",
        "See run_card.json for the full config and versions.",
    ]
    (folder / "README.md").write_text(model_card_front_matter(values, saved, card) + "\n".join(lines) + "\n")


def model_card_front_matter(values: dict[str, Any], saved: str, card: dict[str, Any]) -> str:
    """The model card's YAML block (``---`` ... ``---``) as the hub reads it (huggingface_hub.ModelCardData), from
    the run's config ``values`` (``TrainConfig.to_dict()``)."""
    from huggingface_hub import ModelCardData

    dataset, loss = values["dataset"], values["loss"]
    datasets = dataset if isinstance(dataset, list) else [dataset] if dataset else []
    data = ModelCardData(
        base_model=values["model"],
        library_name="peft" if saved == "LoRA adapter" else "transformers",
        tags=["prefzoo", loss, "preference-optimization", *(["lora"] if saved != "full model" else [])],
        datasets=[str(d) for d in datasets] or ["prefzoo-default-task"],
        prefzoo={
            "loss": loss,
            "loss_params": card.get("loss_params", redact(dict(values["loss_params"]))),
            "steps": card["steps"],
            "global_batch_pairs": card["global_batch_pairs"],
            "metrics": {k: v for k, v in card["final_metrics"].items() if isinstance(v, int | float)},
            "eval": card["evals"][-1] if card["evals"] else {},
        },
    )
    return f"---\n{data.to_yaml()}\n---\n"
