"""Purpose-built losses for the kit's own tests: a built-in loss with its function or some of its outputs replaced."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import torch

import prefzoo
from prefzoo.types import LossOutput

__all__ = ["changed", "drifting", "probe_loss"]


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


def drifting(
    base: str,
    read: Callable[[Any, Any], torch.Tensor],
    picks: Callable[[int, Any, Any], bool],
    value: float = 0.0,
    grad: float = 0.0,
    level: float = 0.0,
    slope: float = 0.0,
    **spec_changes: Any,
) -> prefzoo.Loss:
    """L = level + slope·read(batch, params) per example; on the calls ``picks(call index, batch, ctx)`` chooses,
    ``value`` more, and ``grad`` more on the gradient of what ``read`` sums with the value unchanged.  Zero scores;
    ``base``'s spec, not batch-coupled unless ``spec_changes`` say so.  A check's tolerance is pinned by a drift just
    past it failing and one within passing."""
    calls = [0]

    def fn(b: Any, p: Any, ctx: Any) -> LossOutput:
        on = picks(calls[0], b, ctx)
        calls[0] += 1
        x = read(b, p)
        z = torch.zeros(b.batch_size, dtype=x.dtype)
        return LossOutput(level + value * on + slope * x + grad * on * (x - x.detach()), z, z)

    return probe_loss(fn, base, **{"batch_coupled": False, **spec_changes})
