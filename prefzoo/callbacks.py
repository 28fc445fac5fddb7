"""The callback API: :class:`Callback` (no-op hooks) and the :class:`RunState` they see.

Below the trainer and evaluation, so both stand on it: the trainer calls the hooks (its ``CallbackList`` turns a
failing one into a one-line error) and loads callbacks by name from the entry-point group ``prefzoo.callbacks``;
evaluation's win-rate callback subclasses :class:`Callback`.  ``prefzoo.train`` re-exports both names.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

__all__ = ["Callback", "RunState"]


@dataclass
class RunState:
    """What callbacks see of a run: one object, updated in place by the run (callbacks may set the stop fields)."""

    cfg: Any  # the TrainConfig
    accelerator: Any  # accelerate's Accelerator (process_index, is_main_process, device, ...)
    model: Any = None  # the accelerate-wrapped policy; accelerator.unwrap_model(model).lm is the causal LM
    tokenizer: Any = None
    has_eval: bool = False  # whether the run has an eval split (evaluations at epoch ends)
    total_steps: int = 0  # optimizer steps of the whole run
    steps_per_epoch: int = 0
    global_step: int = 0  # optimizer steps completed (on_step_begin: the step about to run is global_step + 1)
    epoch: int = 0  # 1-based epoch in progress (on_epoch_end: the epoch just completed; 0 before training)
    loss: float | None = None  # this process's mean training loss in the last optimizer step (NaN if skipped)
    batch: dict[str, Any] | None = None  # the collated micro-batch being trained on (on_batch, on_step_begin)
    metrics: dict[str, float] = field(default_factory=dict)  # the last logged metrics
    timings: dict[str, float] = field(default_factory=dict)  # setup phases in seconds, e.g. 'reference'
    should_stop: bool = False  # set by a callback: stop at the next step boundary with a checkpoint
    stop_reason: str | None = None  # said in the log and in TrainResult.stop_reason when should_stop is set
    writer: Any = None  # the run's metrics.jsonl writer (main process)
    reference: Any = None  # the run's Reference (prefzoo.scoring), None for a reference-free loss
    engine: Any = None  # the run's Engine (the trainer's engines): e.g. engine.partitions_params
    resumed_from: Path | None = None  # the checkpoint this run resumed from (verified), None for a fresh start

    @property
    def is_main_process(self) -> bool:
        return bool(self.accelerator.is_main_process)

    def log_metrics(self, record: dict[str, Any]) -> None:
        """Write a callback's own metrics record to metrics.jsonl and the trackers (main process)."""
        if self.writer is not None:
            self.writer.write(record)
        self.accelerator.log({k: v for k, v in record.items() if isinstance(v, int | float)}, step=self.global_step)


class Callback:
    """Base class: override the hooks you need (each is a no-op here).  Hooks run on every process."""

    def on_train_begin(self, state: RunState) -> None:
        """After setup (model, data, reference, resume), before the first step."""

    def on_step_begin(self, state: RunState) -> None:
        """Before optimizer step ``state.global_step + 1`` (its first micro-batch is in ``state.batch``)."""

    def on_batch(self, state: RunState, fields: dict[str, Any]) -> dict[str, Any] | None:
        """Each micro-batch's PreferenceBatch fields before the finiteness check and the loss; return replaced ones."""
        return None

    def on_before_optimizer_step(self, state: RunState, params: list[Any]) -> None:
        """Gradients of the step are complete in ``params``: before clipping and the non-finite gradient check."""

    def on_step_end(self, state: RunState) -> None:
        """After the optimizer and scheduler step (or the skip); ``state.global_step`` counts it."""

    def on_log(self, state: RunState, metrics: dict[str, float]) -> None:
        """A metrics record was written (every ``logging_steps``)."""

    def on_evaluate(self, state: RunState, metrics: dict[str, float]) -> None:
        """An evaluation finished (``eval/reward_accuracy``, ``eval/loss``, ...; same values on every process)."""

    def on_generation_begin(self, state: RunState) -> None:
        """On-policy runs (--online): before a round's samples are drawn from the policy."""

    def on_generation_end(self, state: RunState) -> None:
        """On-policy runs: the round's samples are drawn (the judge has not scored them yet)."""

    def on_judged(self, state: RunState) -> None:
        """On-policy runs: the round's samples are scored and gathered; its training steps come next."""

    def on_save_files(self, state: RunState, path: Path) -> None:
        """Main process only: a checkpoint's files are in ``path`` and fsynced; its completion marker is not yet."""

    def on_save(self, state: RunState, path: Path) -> None:
        """A complete checkpoint was written to ``path``."""

    def on_epoch_end(self, state: RunState, model: Any) -> None:
        """After an epoch and its evaluation; ``model`` is the unwrapped causal LM (leave its weights unchanged)."""

    def on_train_end(self, state: RunState) -> None:
        """After the final model is written (not called when the run raises)."""
