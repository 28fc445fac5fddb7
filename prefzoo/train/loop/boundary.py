"""A run's step boundaries: saving at save_steps and epoch ends, stopping on a signal or a callback's request, and
the stop after too many non-finite steps in a row (each with a checkpoint).

:class:`Boundary` decides when; :class:`Saver` says what goes into a checkpoint and calls
:func:`prefzoo.train.checkpoint.save_checkpoint`, which writes it (what the engine adds:
:meth:`prefzoo.train.engines.Engine.save_shards`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from prefzoo.train.callbacks import CallbackList, RunState
from prefzoo.train.checkpoint import save_checkpoint, save_loss_state, save_model_folder
from prefzoo.train.loop.guard import NonFiniteGuard, NonFiniteStepsError

__all__ = ["Boundary", "SaveSettings", "Saver"]


@dataclass(frozen=True)
class SaveSettings:
    """The configuration the boundary reads."""

    output_dir: str
    save_steps: int  # also a checkpoint every N optimizer steps (0: epoch ends only, which always save)
    save_total_limit: int  # complete checkpoints kept
    save_only_model: bool  # a plain model folder, no optimizer state (not resumable)
    max_steps: int | None  # written into the marker with epochs: a resume checks them
    epochs: float
    max_consecutive_skips: int  # said in the error that stops a run after that many non-finite steps


@dataclass(eq=False, kw_only=True)
class Saver:
    """What a checkpoint holds: the policy and its optimizer (through the engine), the loss's state, the data
    source's, the callbacks' files, and the marker's run identity."""

    accelerator: Any
    engine: Any  # prefzoo.train.engines.Engine
    policy: Any
    optimizer: Any
    tokenizer: Any
    model_defaults: Any  # ModelDefaults, for a model-only folder's config
    loss: Any  # its state is saved when it keeps one
    save_density_ratio: Callable[[Path], None] | None  # --density-ratio: writes the classifier into a folder
    source: Any  # the data source (prefzoo.train.loop.source)
    storage: Any  # prefzoo.train.checkpoint.Storage, or None
    info: dict[str, Any]  # run identity written into every checkpoint marker
    skip_record: list[int] | None  # [start step, N] of --skip-batches N, recorded once
    callbacks: CallbackList
    state: RunState
    settings: SaveSettings

    def save(self, skipped: int) -> Path:
        """Write the checkpoint of ``state.global_step`` (``skipped``: the steps skipped so far); returns its folder."""
        state, cfg, acc = self.state, self.settings, self.accelerator
        info = {**self.info, "epoch": state.epoch - 1, "skipped_steps": skipped,
                "total_steps": state.total_steps, "max_steps": cfg.max_steps, "epochs": cfg.epochs}  # fmt: skip
        if self.skip_record:
            info["skip_batches"] = self.skip_record  # applied once: a later resume does not skip again
        write = None
        if cfg.save_only_model:  # a plain model folder (loadable with --model), no optimizer state: not resumable
            info["model_only"] = True

            def write(tmp: Path) -> None:
                save_model_folder(acc, self.policy, self.tokenizer, tmp, self.model_defaults, engine=self.engine)

        saved = save_checkpoint(acc, cfg.output_dir, state.global_step, info, cfg.save_total_limit,
                                before_marker=self._save_files, node_local=self._node_local(), write=write,
                                save_shards=self._save_shards if write is None else None)  # fmt: skip
        return saved

    def _node_local(self) -> bool:
        return self.storage is not None and not self.storage.shared

    def _save_files(self, folder: Path) -> None:
        """Main process, a checkpoint's files written and its marker not yet: the data source's, the callbacks'."""
        self.source.save(folder)
        self.callbacks.call("on_save_files", self.state, folder)

    def _save_shards(self, tmp: Path) -> None:
        """Every rank, after accelerate's state: what the engine saves beside it (e.g. its model and optimizer
        shards); the folder's writer adds a stateful loss's state and, with --density-ratio, the classifier (a
        resumed run loads both)."""
        acc = self.accelerator
        self.engine.save_shards(self.policy, self.optimizer, tmp)
        if acc.is_local_main_process if self._node_local() else acc.is_main_process:
            save_loss_state(self.loss, tmp)
            if self.save_density_ratio is not None:
                self.save_density_ratio(tmp)


@dataclass(eq=False, kw_only=True)
class Boundary:
    """At each optimizer-step boundary: a checkpoint when one is due, a stop when asked for or steps keep failing."""

    saver: Saver
    accelerator: Any
    callbacks: CallbackList
    state: RunState
    guard: NonFiniteGuard
    preemption: Any  # prefzoo.train.loop.signals.PreemptionHandler
    result: Any  # the run's TrainResult: its checkpoint and stop fields are set here
    bar: Any  # Progress
    saved: Path | None = None  # the checkpoint written at the current step boundary
    stopped_by_callback: bool = False  # the run ended by decision: the final model is written too

    def checkpoint(self, force: bool = False) -> Path | None:
        """Save at ``save_steps`` and epoch ends (or when ``force``d); returns the folder or None."""
        state, every = self.state, self.saver.settings.save_steps
        end_of_epoch = state.global_step % state.steps_per_epoch == 0 or state.global_step == state.total_steps
        if not (force or (every and state.global_step % every == 0) or end_of_epoch):
            return None
        saved = self.saver.save(self.guard.skipped)
        self.result.checkpoint = saved
        self.callbacks.call("on_save", state, saved)
        return saved

    def save_if_due(self) -> None:
        """The step boundary's checkpoint, kept for a stop at the same boundary."""
        self.saved = self.checkpoint()

    def abort_nonfinite(self) -> None:
        saved = self.saved or self.checkpoint(force=True)
        self.bar.close(finished=False)
        g = self.guard
        raise NonFiniteStepsError(
            f"{g.consecutive} optimizer steps in a row (up to step {self.state.global_step}) had non-finite "
            f"log-probs, losses or gradients (last examples {g.last_ids[:8]}); stopped. The weights "
            f"before those steps are saved in {saved}. Lower --lr, check those rows, or raise "
            f"--max-consecutive-skips (now {self.saver.settings.max_consecutive_skips}); resume with --resume auto"
        )

    def stop_requested(self) -> bool:
        """A signal (SIGTERM/SIGINT) or ``state.should_stop`` on any process: checkpoint and stop (True)."""
        state, pre = self.state, self.preemption
        signalled = pre.received is not None
        if not self.guard.any_rank(signalled or state.should_stop):  # one all-reduce: every rank stops alike
            return False
        if signalled or not state.should_stop:
            if state.global_step >= state.total_steps:  # nothing left to preempt: the run finishes (final model)
                self.bar.close()  # the message on a line of its own, after the progress bar's last
                self.accelerator.print(
                    f"prefzoo train: {pre.reason()} arrived during the last step ({state.global_step}/"
                    f"{state.total_steps}): the run is complete, writing the final model"
                )
                return False
            reason = f"preempted by {pre.reason()}"
        else:
            reason = state.stop_reason or "stopped by a callback (state.should_stop)"
            self.stopped_by_callback = True
        saved = self.saved or self.checkpoint(force=True)
        self.result.checkpoint = saved
        self.result.stopped_early, self.result.stop_reason = True, reason
        self.bar.close(finished=False)  # the message on a line of its own, not after the progress bar's
        self.accelerator.print(
            f"prefzoo train: {reason} at step {state.global_step}/{state.total_steps}; checkpoint saved to "
            f"{saved}. Resume with the same command plus --resume auto (same --output-dir "
            f"{self.saver.settings.output_dir})"
        )
        return True
