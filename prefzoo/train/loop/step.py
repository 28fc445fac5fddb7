"""The micro-batch step of a run: batch → log-probs → loss → backward; at a step's last micro-batch, clip and step.

:class:`Step` is built by :class:`prefzoo.train.loop.run.Run` from what it uses (the accelerator, the engine, the
policy and its optimizer, the loss and its reference, the callbacks and the run state).  A non-finite value on any
process skips the whole optimizer step on every process (:mod:`prefzoo.train.loop.guard`), and an engine that steps
inside backward is told to drop it its own way (:attr:`prefzoo.train.engines.Engine.steps_in_backward`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import torch

from prefzoo.model import add_router_loss, router_metrics
from prefzoo.scoring import batch_fields, batch_type, float_fields
from prefzoo.train.callbacks import CallbackList, RunState
from prefzoo.train.checkpoint import checkpoint_step, find_latest_checkpoint
from prefzoo.train.loop.guard import NonFiniteGuard, NonFiniteStepsError, nonfinite_ids
from prefzoo.train.loop.metrics import MetricsAccumulator, step_metrics

__all__ = ["InFlight", "Step", "StepSettings"]


@dataclass
class InFlight:
    """The optimizer step in flight on this process."""

    bad: bool = False  # skipped (agreed on by every process); its remaining micro-batches are not computed
    reason: str = ""
    bad_ids: list[str] = field(default_factory=list)
    ids: list[str] = field(default_factory=list)  # example ids of this step on this process
    losses: list[float] = field(default_factory=list)  # micro-batch mean losses
    micro: int = 0  # micro-batches done
    grad_norm: Any = None
    poisoned: bool = False  # stepping in backward, accumulation > 1: NaN gradients make the engine drop the step
    by_request: bool = False  # skipped by --skip-batches (not a fault: not counted towards max_consecutive_skips)


@dataclass(frozen=True)
class StepSettings:
    """The configuration a step reads."""

    grad_accum: int  # micro-batches per optimizer step
    max_grad_norm: float  # clipping threshold
    check_grads: bool  # non-finite gradient norms skip the step (under fp16 the GradScaler already does)
    output_dir: str  # where the advice after a step the engine could not drop looks for a checkpoint


@dataclass(eq=False, kw_only=True)
class Step:
    """One micro-batch at a time (``micro_batch``), then ``end()`` when the accelerator says the step is complete."""

    accelerator: Any
    engine: Any  # prefzoo.train.engines.Engine
    policy: Any  # the engine-wrapped PolicyLogps
    trainable: list[Any]  # the parameters clipped (and, for a bad step, given zero gradients)
    optimizer: Any
    schedule: Any
    loss: Any  # prefzoo.spec.Loss
    reference: Any  # a Reference, or None for reference-free losses
    gather: Any
    density_ratio: Any  # --density-ratio weights, or None
    callbacks: CallbackList
    state: RunState
    guard: NonFiniteGuard
    metrics: MetricsAccumulator  # this logging window's step metrics
    bar: Any  # Progress
    settings: StepSettings
    skip_left: int = 0  # --skip-batches micro-batches still to pass over
    grad_norm: Any = None  # the last optimizer step's gradient norm
    flight: InFlight = field(default_factory=InFlight)

    def micro_batch(self, batch: dict[str, Any]) -> None:
        """One micro-batch: log-probs → loss → backward; at the step's last micro-batch clip and step the optimizer."""
        acc, s = self.accelerator, self.flight
        self.state.batch = batch
        if s.micro == 0:
            self.callbacks.call("on_step_begin", self.state)
        s.micro += 1
        if self.skip_left > 0:  # --skip-batches: the whole optimizer step holding these micro-batches is skipped
            self.skip_left -= 1
            s.bad, s.reason, s.by_request = True, "--skip-batches", True
            s.bad_ids += [str(i) for i in batch["ids"]]
        with acc.accumulate(self.policy):
            s.grad_norm = None
            if not s.bad:  # once a step is bad, its remaining micro-batches are not computed
                self.forward_backward(batch)
            elif s.poisoned:  # the engine steps in backward: backward must reach its boundary, where it drops the step
                self.poison_backward(batch_fields(self.loss, self.policy, None, batch, acc.autocast))
            if s.poisoned and acc.sync_gradients and self.policy.was_step_applied():
                raise RuntimeError(f"{self.engine.label} applied a step with NaN gradients; its overflow check is off")
            if acc.sync_gradients and not s.bad:
                self.clip_gradients()
            if not s.bad:
                self.optimizer.step()
            self.optimizer.zero_grad()

    def forward_backward(self, batch: dict[str, Any]) -> None:
        acc, s, guard = self.accelerator, self.flight, self.guard
        ids = [str(i) for i in batch["ids"]]
        s.ids += ids
        cls = batch_type(batch)  # PreferenceBatch, or GroupBatch / UnpairedBatch for lists and unpaired data
        stats: dict[str, Any] = {}  # logits/chosen, logits/rejected metrics (pairs)
        fields = batch_fields(self.loss, self.policy, self.reference, batch, acc.autocast, stats, self.density_ratio)
        aux = fields.pop("aux_loss", None)  # () MoE router term (coef × aux) or None
        fields = self.callbacks.on_batch(self.state, fields)
        local_bad = nonfinite_ids(ids, *(fields.get(k) for k in float_fields(cls)))
        out = None
        if not guard.any_rank(bool(local_bad)):  # every rank agrees before the loss gathers
            pb = cls(**fields)
            out = self.loss(pb, gather=self.gather)
            local_bad = nonfinite_ids(ids, out.losses)
        if out is None or guard.any_rank(bool(local_bad)):
            s.bad, s.reason, s.bad_ids = True, "non-finite log-probs or loss", guard.all_ids(local_bad)
            self.settle_bad_step(fields)
            return
        loss_value = out.losses.mean()  # mean over this process's pairs; DDP averages over processes
        loss_value = add_router_loss(loss_value, aux)
        acc.backward(loss_value)
        m = {**step_metrics(pb, out, loss_value, stats), **router_metrics(aux)}
        self.metrics.add(m, int(batch["attention_mask"].sum()))
        s.losses.append(m["loss"])

    def settle_bad_step(self, fields: dict[str, Any]) -> None:
        """A micro-batch found bad: what backward still has to do so that every rank discards the step alike."""
        engine, s = self.engine, self.flight
        if engine.steps_in_backward:
            # the engine steps inside backward at its accumulation boundary: with one micro-batch per step no
            # rank calls backward; with several the rest of the step backpropagates NaN and the engine's
            # overflow check drops the step (weights, moments and scheduler untouched)
            if self.settings.grad_accum == 1:
                return
            if not engine.drops_nonfinite_steps(self.policy):
                raise _stepped_nonfinite(self.settings, engine, self.state.global_step + 1, s.bad_ids)
            s.poisoned = True
            self.poison_backward(fields)
            return
        # settle DDP's pending gradient reduction with zeros; the step is discarded
        self.accelerator.backward(sum((q * 0.0).sum() for q in self.trainable))

    def poison_backward(self, fields: dict[str, Any]) -> None:
        """Backward of NaN × the log-probs: every gradient the step accumulated in the engine becomes NaN."""
        logps = sum(v.sum() for v in fields.values() if isinstance(v, torch.Tensor) and v.requires_grad)  # ()
        self.accelerator.backward(logps * math.nan)  # any shape: pairs, (G, K) groups, unpaired rows

    def clip_gradients(self) -> None:
        s = self.flight
        self.callbacks.call("on_before_optimizer_step", self.state, self.trainable)
        s.grad_norm = self.accelerator.clip_grad_norm_(self.trainable, self.settings.max_grad_norm)
        norm_bad = s.grad_norm is not None and not math.isfinite(float(s.grad_norm))
        if self.settings.check_grads and self.guard.any_rank(norm_bad):
            s.bad, s.reason = True, f"non-finite gradient norm {float(s.grad_norm)}"
            s.bad_ids = self.guard.all_ids(s.ids)

    def end(self) -> None:
        """The optimizer step is complete (or skipped): scheduler, skip bookkeeping, counters."""
        s, state = self.flight, self.state
        if s.bad:
            self.guard.record_skip(state.global_step + 1, s.reason, s.bad_ids, fault=not s.by_request)
        else:
            self.schedule.step()
            self.guard.record_ok()
        state.global_step += 1
        state.loss = sum(s.losses) / len(s.losses) if s.losses and not s.bad else math.nan
        self.grad_norm = s.grad_norm
        self.flight = InFlight()
        self.bar.update(1)
        self.callbacks.call("on_step_end", state)


def _stepped_nonfinite(settings: StepSettings, engine: Any, step: int, ids: list[str]) -> NonFiniteStepsError:
    latest = find_latest_checkpoint(settings.output_dir)
    return NonFiniteStepsError(
        f"non-finite log-probs or loss in step {step} (examples {ids[:8]}); {engine.nonfinite_advice()}. "
        + (
            f"Resume from {latest} with --resume auto, adding --skip-batches "
            f"{(step - checkpoint_step(latest)) * settings.grad_accum} to pass over the steps up to this one "
            "(or a lower --lr)."
            if latest
            else f"No checkpoint yet: rerun with --skip-batches {step * settings.grad_accum} to pass over steps "
            f"1..{step}."
        )
    )
