"""The run's loss, built once: ``cfg.loss`` with its parameters under its modifiers, the run's settings checked
against what the modifiers declare (before any model loads), and the callbacks they install.  No modifier name is
read here.

The CLI builds the loss while it reads its flags and hands it to :func:`prefzoo.train.train` (``loss=``); a run
started from Python with a config alone builds it in :func:`prefzoo.train.train` with :func:`build_loss`.
"""

from __future__ import annotations

from typing import Any

from prefzoo.spec import Loss
from prefzoo.train.config import ConfigError, TrainConfig
from prefzoo.types import Need

__all__ = ["build_loss", "check_modifiers", "make_loss", "modifier_callbacks"]


def make_loss(name: str, params: dict[str, Any], modifiers: list[Any]) -> Loss:
    """Loss ``name`` bound to ``params`` (typed) under ``modifiers``: bad names, values or modifier fits fail here."""
    from prefzoo.registry import get_loss

    return get_loss(name, modifiers=list(modifiers), **params)


def build_loss(cfg: TrainConfig) -> Loss:
    """``cfg.loss`` with ``cfg.loss_params`` under ``cfg.modifiers``, checked against the run's settings."""
    loss = make_loss(cfg.loss, cfg.loss_params, cfg.modifiers)
    check_modifiers(loss, precompute_ref=cfg.precompute_ref, lora=cfg.lora)
    return loss


def _modifiers(loss: Loss) -> list[Any]:
    return list(getattr(loss, "modifiers", []))


def check_modifiers(loss: Loss, *, precompute_ref: bool, lora: bool) -> None:
    """One-line ConfigErrors for modifiers the run's settings (``--precompute-ref``, ``--lora``) cannot serve,
    naming both and why."""
    for m in _modifiers(loss):
        if m.spec.updates_reference and precompute_ref:
            raise ConfigError(
                f"modifier {m.name!r} with --precompute-ref: {m.name} updates the reference model during training, "
                "so its log-probs cannot be computed once; drop --precompute-ref"
            )
        if m.spec.updates_reference and lora:
            raise ConfigError(
                f"modifier {m.name!r} with --lora: the reference of a LoRA run is the policy with its adapter "
                f"disabled (the frozen base model), which {m.name} cannot update; train without --lora"
            )
        needs_ref_tokens = Need.REF_TOKEN_LOGPS in (m.spec.reference_needs & loss.needs)
        if needs_ref_tokens and precompute_ref:
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
