"""What a model brings that a run settles at its start: dropout turned off (TRL's ``disable_dropout``), token limits.

Dropout left on makes the policy's log-probs at step 0 noisy copies of the reference's (which scores in eval mode):
every implicit reward (DPO's β log π/π_ref, MMPO's R, KTO's reference point) starts biased.  prefzoo sets ``p = 0``
on every ``nn.Dropout`` of the base model and zeroes the dropout rates that architectures read at forward time from
their config or from float attributes stored at init (Llama's ``attention_dropout``, GPT-J's ``attn_pdrop``,
BLOOM's ``hidden_dropout``, ``nn.MultiheadAttention.dropout``, ...), found by name rather than from a fixed list.
Adapter modules (LoRA's own dropout) are left as the user set them.
"""

from __future__ import annotations

import contextlib
import re
import sys
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from torch import nn

from prefzoo._attrs import temporarily
from prefzoo.model.context import ContextLimits, fit_to_context, model_configs

__all__ = ["DropoutReport", "ModelDefaults", "apply_model_defaults", "disable_dropout"]

# attribute names that hold a dropout rate: attention_dropout, hidden_dropout_prob, resid_pdrop, layerdrop, ...
_RATE_NAME = re.compile(r"dropout|pdrop|layerdrop")


def _is_rate(name: str, value: Any) -> bool:
    return bool(_RATE_NAME.search(name)) and isinstance(value, int | float) and not isinstance(value, bool)


def _adapter_module_ids(model: nn.Module) -> set[int]:
    """ids of the modules that belong to peft adapters (everything inside a tuner layer but its base layer)."""
    if "peft" not in sys.modules:  # no adapter without peft loaded: a run without LoRA skips its import (~2 CPU s)
        return set()
    try:
        from peft.tuners.tuners_utils import BaseTunerLayer
    except ImportError:
        return set()
    out: set[int] = set()
    for module in model.modules():
        if isinstance(module, BaseTunerLayer):
            out.add(id(module))
            out.update(id(m) for n, m in module.named_modules() if n and not n.startswith("base_layer"))
    return out


@dataclass
class DropoutReport:
    """The dropout a model had: ``nn.Dropout`` modules, config rates and module float rates (turned off or kept)."""

    kept: bool  # True under --keep-dropout: found, not changed
    modules: Counter[float] = field(default_factory=Counter)  # p -> how many nn.Dropout modules had it
    config: dict[str, float] = field(default_factory=dict)  # "attn_pdrop" -> 0.1 (nested configs: "text_config.x")
    attributes: Counter[str] = field(default_factory=Counter)  # "LlamaAttention.attention_dropout=0.1" -> count
    _config_undo: list[tuple[Any, str, Any]] = field(default_factory=list, repr=False)

    @property
    def found(self) -> bool:
        return bool(self.modules or self.config or self.attributes)

    def summary(self) -> str:
        """'12 nn.Dropout (p=0.1), config attn_pdrop=0.1, 2 × LlamaAttention.attention_dropout=0.1' or 'none'."""
        parts = [f"{n} nn.Dropout (p={p:g})" for p, n in sorted(self.modules.items())]
        parts += [f"config {k}={v:g}" for k, v in sorted(self.config.items())]
        parts += [f"{n} × {k}" for k, n in sorted(self.attributes.items())]
        return ", ".join(parts) or "none"

    def describe(self) -> str:
        """One log line saying what was turned off, or kept and what that costs."""
        if not self.found:
            return "dropout: the model has none"
        if self.kept:
            return (
                f"dropout kept on (--keep-dropout): {self.summary()}; the policy's log-probs differ from the "
                "reference's by noise, so implicit rewards are noisy at initialisation"
            )
        return f"dropout off in the policy (TRL's disable_dropout; --keep-dropout keeps it): {self.summary()}"

    def as_dict(self) -> dict[str, Any]:
        return {
            "kept": self.kept,
            "nn_dropout_modules": {f"{p:g}": n for p, n in sorted(self.modules.items())},
            "config": dict(sorted(self.config.items())),
            "attributes": dict(sorted(self.attributes.items())),
        }

    @contextlib.contextmanager
    def config_restored(self) -> Iterator[None]:
        """The config rates as the model was loaded (for save_pretrained: a saved model keeps its own config)."""
        with contextlib.ExitStack() as stack:
            for cfg, key, old in self._config_undo:
                stack.enter_context(temporarily(cfg, key, old))
            yield


def _config_rates(model: nn.Module) -> Iterator[tuple[Any, str, str, float]]:
    """(config object, key, dotted name, rate) for every positive dropout rate in the model's configs."""
    for prefix, cfg in model_configs(model):
        for key, value in list(vars(cfg).items()):
            if _is_rate(key, value) and value > 0:
                yield cfg, key, prefix + key, float(value)


# torch's dropout modules (every subclass of its private base ``_DropoutNd``, torch 2.13)
DROPOUT_MODULES = (nn.Dropout, nn.Dropout1d, nn.Dropout2d, nn.Dropout3d, nn.AlphaDropout, nn.FeatureAlphaDropout)


def disable_dropout(model: nn.Module, keep: bool = False) -> DropoutReport:
    """Turn off every dropout of ``model`` but its adapters' (``keep=True``: only report them); what was found."""
    report = DropoutReport(kept=keep)
    adapters = _adapter_module_ids(model)
    for module in model.modules():
        if id(module) in adapters:
            continue
        if isinstance(module, DROPOUT_MODULES):
            if module.p > 0:
                report.modules[float(module.p)] += 1
                if not keep:
                    module.p = 0.0
            continue
        for key, value in list(vars(module).items()):
            if _is_rate(key, value) and value > 0:  # a rate read at forward time, e.g. self.attention_dropout
                report.attributes[f"{type(module).__name__}.{key}={value:g}"] += 1
                if not keep:
                    setattr(module, key, 0.0)
    for cfg, key, name, value in _config_rates(model):
        report.config[name] = value
        if not keep:
            report._config_undo.append((cfg, key, getattr(cfg, key)))
            setattr(cfg, key, 0.0)
    return report


@dataclass
class ModelDefaults:
    """What the start of a run decided about the model: its dropout and the token limits."""

    dropout: DropoutReport
    limits: ContextLimits

    def lines(self) -> list[str]:
        return [self.limits.describe(), self.dropout.describe()]

    def as_dict(self) -> dict[str, Any]:
        """For the run card."""
        return {"dropout": self.dropout.as_dict(), "token_limits": self.limits.as_dict()}


def apply_model_defaults(
    model: nn.Module,
    tokenizer: Any,
    max_prompt_length: int | None,
    max_completion_length: int | None,
    keep_dropout: bool = False,
) -> ModelDefaults:
    """Dropout off in ``model`` unless ``keep_dropout``; the run's token limits (unset: the defaults) fitted to the
    model's context.

    Call it before LoRA adapters are added (their dropout is the user's) and before the reference is copied.
    """
    limits = fit_to_context(max_prompt_length, max_completion_length, model, tokenizer)
    return ModelDefaults(disable_dropout(model, keep=keep_dropout), limits)
