"""``EarlyStopping``: stop a run when an evaluation metric stops improving (``--callback early-stopping``)."""

from __future__ import annotations

from typing import Any

from prefzoo.train.callbacks.base import Callback, RunState

__all__ = ["EarlyStopping"]


class EarlyStopping(Callback):
    """Stops the run (checkpoint and final model written) after ``patience`` evaluations without improvement.

    Evaluations run at epoch ends (and before training with ``eval_at_start``), on the eval split, so the run
    needs one (``eval_split`` or ``eval_fraction > 0``).  ``mode`` is ``min`` for metrics ending in ``loss`` and
    ``max`` otherwise unless given; an evaluation improves when it beats the best so far by more than ``min_delta``.
    """

    name = "early-stopping"

    def __init__(
        self, metric: str = "eval/loss", patience: int = 1, mode: str | None = None, min_delta: float = 0.0
    ) -> None:
        mode = mode or ("min" if metric.endswith("loss") else "max")
        if mode not in ("min", "max"):
            raise ValueError(f"mode={mode!r}: choose min or max")
        if int(patience) < 1:
            raise ValueError(f"patience={patience} must be >= 1")
        if not float(min_delta) >= 0:
            raise ValueError(f"min_delta={min_delta} must be >= 0")
        self.metric, self.patience, self.mode, self.min_delta = metric, int(patience), mode, float(min_delta)
        self.best: float | None = None
        self.best_step = 0
        self.bad_evaluations = 0  # evaluations in a row without improvement

    def on_train_begin(self, state: RunState) -> None:
        if not state.has_eval:
            raise ValueError(
                "early stopping needs evaluations but this run has no eval split: set eval_split or eval_fraction > 0"
            )

    def on_evaluate(self, state: RunState, metrics: dict[str, Any]) -> None:
        if self.metric not in metrics:
            raise KeyError(f"metric {self.metric!r} is not among the evaluation's {sorted(metrics)}")
        value = float(metrics[self.metric])
        if self.best is None or self._better(value, self.best):
            self.best, self.best_step, self.bad_evaluations = value, state.global_step, 0
            return
        self.bad_evaluations += 1
        if self.bad_evaluations >= self.patience:
            state.should_stop = True
            state.stop_reason = (
                f"early stopping: {self.metric} did not improve on {self.best:.4g} (step {self.best_step}) "
                f"for {self.bad_evaluations} evaluation(s)"
            )

    def _better(self, value: float, best: float) -> bool:
        return value < best - self.min_delta if self.mode == "min" else value > best + self.min_delta
