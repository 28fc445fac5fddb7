"""What the trainer does for loss modifiers: build the modified loss, check the run's settings against what the
modifiers declare (before any model loads), and install the callbacks they name.  No modifier name is read here."""

from __future__ import annotations

from typing import Any

from prefzoo.spec import Loss
from prefzoo.train.config import ConfigError, TrainConfig
from prefzoo.types import Need

__all__ = ["build_loss", "check_modifiers", "modifier_callbacks"]


def build_loss(cfg: TrainConfig) -> Loss:
    """``cfg.loss`` with ``cfg.loss_params`` under ``cfg.modifiers``; bad names, params or combinations fail here."""
    from prefzoo.registry import get_loss

    loss = get_loss(cfg.loss, modifiers=list(cfg.modifiers), **cfg.loss_params)
    check_modifiers(loss, cfg)
    return loss


def _modifiers(loss: Loss) -> list[Any]:
    return list(getattr(loss, "modifiers", []))


def check_modifiers(loss: Loss, cfg: TrainConfig) -> None:
    """One-line ConfigErrors for modifiers the run's settings cannot serve, naming both and why."""
    for m in _modifiers(loss):
        if m.spec.updates_reference and cfg.precompute_ref:
            raise ConfigError(
                f"modifier {m.name!r} with --precompute-ref: {m.name} updates the reference model during training, "
                "so its log-probs cannot be computed once; drop --precompute-ref"
            )
        if m.spec.updates_reference and cfg.lora:
            raise ConfigError(
                f"modifier {m.name!r} with --lora: the reference of a LoRA run is the policy with its adapter "
                f"disabled (the frozen base model), which {m.name} cannot update; train without --lora"
            )
        needs_ref_tokens = Need.REF_TOKEN_LOGPS in (m.spec.reference_needs & loss.needs)
        if needs_ref_tokens and cfg.precompute_ref:
            raise ConfigError(
                f"modifier {m.name!r} with --precompute-ref: {m.name} reads the reference's per-token log-probs, "
                "and only sequence sums are cached; drop --precompute-ref"
            )


def modifier_callbacks(loss: Loss) -> list[Any]:
    """The trainer callbacks the run's modifiers install (``ModifierSpec.callback``: a registered callback name or
    ``module:Class``), built with their params and named after the modifier (its errors and metrics say which)."""
    from prefzoo.train.callbacks import load_callback

    out = []
    for m in _modifiers(loss):
        if m.spec.callback:
            kwargs = {k: getattr(m.params, k) for k in type(m.params).__dataclass_fields__}
            cb = load_callback({"callback": m.spec.callback, **kwargs})
            cb.name = m.name
            out.append(cb)
    return out
