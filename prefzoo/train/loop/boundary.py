"""Checkpoints and stops at a run's step boundaries: saving at save_steps and epoch ends, stopping on a signal or a
callback's request, and the stop after too many non-finite steps in a row (each with a checkpoint).

:class:`BoundaryPhase` is that part of :class:`prefzoo.train.loop.run.Run`; what is written and how is
:mod:`prefzoo.train.checkpoint`, what the engine adds :meth:`prefzoo.train.engines.Engine.save_shards`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from prefzoo.train.checkpoint import save_checkpoint, save_loss_state, save_model_folder
from prefzoo.train.loop.guard import NonFiniteStepsError
from prefzoo.train.loop.step import RunFields

__all__ = ["BoundaryPhase"]


class BoundaryPhase(RunFields):
    """Saving and stopping (mixed into :class:`prefzoo.train.loop.run.Run`, which builds the state)."""

    result: Any  # TrainResult
    preemption: Any  # PreemptionHandler
    saved: Path | None  # the checkpoint written at the current step boundary
    stopped_by_callback: bool

    def checkpoint(self, force: bool = False) -> Path | None:
        """Save at ``save_steps`` and epoch ends (or when ``force``d); returns the folder or None."""
        state, cfg = self.state, self.cfg
        end_of_epoch = state.global_step % state.steps_per_epoch == 0 or state.global_step == state.total_steps
        if not (force or (cfg.save_steps and state.global_step % cfg.save_steps == 0) or end_of_epoch):
            return None
        info = {**self.parts.info, "epoch": state.epoch - 1, "skipped_steps": self.guard.skipped,
                "total_steps": state.total_steps, "max_steps": cfg.max_steps, "epochs": cfg.epochs}  # fmt: skip
        if self.parts.skip_record:
            info["skip_batches"] = self.parts.skip_record  # applied once: a later resume does not skip again
        acc, p, storage = self.parts.accelerator, self.parts, self.parts.storage
        write = None
        if cfg.save_only_model:  # a plain model folder (loadable with --model), no optimizer state: not resumable
            info["model_only"] = True

            def write(tmp: Path) -> None:
                save_model_folder(acc, p.policy, p.tokenizer, tmp, p.model_defaults, engine=p.engine)

        saved = save_checkpoint(acc, cfg.output_dir, state.global_step, info, cfg.save_total_limit,
                                before_marker=self._save_files,
                                node_local=storage is not None and not storage.shared, write=write,
                                save_shards=self._save_shards if write is None else None)  # fmt: skip
        self.result.checkpoint = saved
        self.callbacks.call("on_save", state, saved)
        return saved

    def _save_files(self, folder: Path) -> None:
        """Main process, a checkpoint's files written and its marker not yet: the data source's, the callbacks'."""
        self.parts.source.save(folder)
        self.callbacks.call("on_save_files", self.state, folder)

    def _save_shards(self, tmp: Path) -> None:
        """Every rank, after accelerate's state: what the engine saves beside it (e.g. its model and optimizer
        shards); the folder's writer adds a stateful loss's state and, with --density-ratio, the classifier (a
        resumed run loads both)."""
        p = self.parts
        p.engine.save_shards(p.policy, p.optimizer, tmp)
        node_local = p.storage is not None and not p.storage.shared
        if p.accelerator.is_local_main_process if node_local else p.accelerator.is_main_process:
            save_loss_state(p.loss, tmp)
            if p.density_ratio is not None:
                p.density_ratio.save(tmp, self.cfg)

    def abort_nonfinite(self) -> None:
        saved = self.saved or self.checkpoint(force=True)
        self.bar.close(finished=False)
        g = self.guard
        raise NonFiniteStepsError(
            f"{g.consecutive} optimizer steps in a row (up to step {self.state.global_step}) had non-finite "
            f"log-probs, losses or gradients (last examples {g.last_ids[:8]}); stopped. The weights "
            f"before those steps are saved in {saved}. Lower --lr, check those rows, or raise "
            f"--max-consecutive-skips (now {self.cfg.max_consecutive_skips}); resume with --resume auto"
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
                self.parts.accelerator.print(
                    f"prefzoo train: {pre.reason()} arrived during the last step ({state.global_step}/"
                    f"{state.total_steps}): the run is complete, writing the final model"
                )
                return False
            reason = f"preempted by {pre.reason()}"
        else:
            reason = state.stop_reason or "stopped by a callback (state.should_stop)"
            self.stopped_by_callback = True  # the run ended by decision: the final model is written too
        saved = self.saved or self.checkpoint(force=True)
        self.result.checkpoint = saved
        self.result.stopped_early, self.result.stop_reason = True, reason
        self.bar.close(finished=False)  # the message on a line of its own, not after the progress bar's
        self.parts.accelerator.print(
            f"prefzoo train: {reason} at step {state.global_step}/{state.total_steps}; checkpoint saved to "
            f"{saved}. Resume with the same command plus --resume auto (same --output-dir {self.cfg.output_dir})"
        )
        return True


