"""Purpose-built losses for the kit's own tests: a built-in loss with its function or some of its outputs replaced."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import prefzoo

__all__ = ["changed", "probe_loss"]


def probe_loss(fn: Callable[..., Any], base: str = "dpo", **spec_changes: Any) -> prefzoo.Loss:
    """The built-in ``base`` spec renamed ``probe`` (plugin ``tests``) with ``fn``, bound to its default params."""
    spec = dataclasses.replace(prefzoo.loss_spec(base), name="probe", fn=fn, plugin="tests", **spec_changes)
    return prefzoo.Loss(spec, spec.params())


def changed(base: str, **out_changes: Callable[[Any, Any], Any]) -> Callable[..., Any]:
    """The built-in ``base`` loss function with some of its outputs replaced by functions of (batch, output)."""

    def fn(batch: Any, p: Any, ctx: Any) -> Any:
        out = prefzoo.loss_spec(base).fn(batch, p, ctx)
        return dataclasses.replace(out, **{k: f(batch, out) for k, f in out_changes.items()})

    return fn
