"""A training run as small phases: ``setup`` → (a micro-batch ``step`` → ``after_step``)* → ``evaluate`` → ``finish``.

:class:`Run` builds the run's pieces once and calls them: the micro-batch :class:`~prefzoo.train.loop.step.Step`
(batch → log-probs → loss → backward → optimizer, top to bottom) and the step
:class:`~prefzoo.train.loop.boundary.Boundary` (checkpoints and stops); logging and evaluation are its own, and
callbacks see each phase through the hooks of :class:`prefzoo.train.callbacks.Callback`.  The loop never looks at a
loss's name.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from prefzoo.data.progress import Progress
from prefzoo.train.callbacks import CallbackList, RunState
from prefzoo.train.checkpoint.final import write_final_model
from prefzoo.train.checkpoint.hub import push_folder, visibility_line
from prefzoo.train.checkpoint.outdir import mark_finished
from prefzoo.train.engines import end_accelerator
from prefzoo.train.evaluation import evaluate, tie_note
from prefzoo.train.loop.boundary import Boundary, Saver, SaveSettings
from prefzoo.train.loop.guard import NonFiniteGuard
from prefzoo.train.loop.metrics import JsonlWriter, MetricsAccumulator, last_logged
from prefzoo.train.loop.step import Step, StepSettings
from prefzoo.train.setup import Parts, setup, skip_batches_left

__all__ = ["Run", "TrainResult"]


@dataclass
class TrainResult:
    """What a run produced (on every process; ``model`` is the unwrapped trained causal LM)."""

    global_step: int
    history: list[dict[str, float]] = field(default_factory=list)  # one record per logging step
    # the last training metrics logged: history's last, or for a resume that trained nothing the resumed run's last
    last_metrics: dict[str, float] = field(default_factory=dict)
    evals: list[dict[str, float]] = field(default_factory=list)  # one record per evaluation
    data_stats: dict[str, Any] = field(default_factory=dict)
    final_dir: Path | None = None
    stopped_early: bool = False
    stop_reason: str | None = None  # e.g. 'preempted by SIGTERM'; None when the run finished or stop_after_steps hit
    skipped_steps: int = 0  # optimizer steps skipped for non-finite log-probs, losses or gradients
    checkpoint: Path | None = None  # the newest checkpoint this run wrote
    already_complete: bool = False  # resumed a finished run: nothing was trained or written
    model: Any = None  # this process's trained LM (only its shards under a sharding engine: load_final_model)
    tokenizer: Any = None
    model_defaults: Any = None  # ModelDefaults: the dropout turned off (or kept) and the token limits used


class Run:
    """One training run: ``Run(cfg, callbacks, preemption, loss).train(train_dataset, eval_dataset)``.

    ``setup`` builds the :class:`Parts` once, then the pieces that use them: the micro-batch :class:`Step`, the step
    :class:`Boundary` and its :class:`Saver`, the metrics writer and the non-finite guard; the phases call them.
    """

    # built by setup()
    parts: Parts
    state: RunState  # what callbacks see
    result: TrainResult
    writer: JsonlWriter  # metrics.jsonl (main process)
    guard: NonFiniteGuard
    metrics: MetricsAccumulator  # this logging window's step metrics
    bar: Progress
    show_progress: bool
    step: Step  # the micro-batch step
    boundary: Boundary  # checkpoints and stops at step boundaries

    def __init__(self, cfg: Any, callbacks: CallbackList, preemption: Any, loss: Any = None) -> None:
        self.cfg, self.callbacks, self.preemption = cfg, callbacks, preemption
        self.loss = loss  # the run's loss (built from cfg by setup when None)
        self.done = False  # every step of the run is trained
        self.t0 = 0.0  # start of the current logging window (perf_counter)

    # -- phases -------------------------------------------------------------------------------------------------
    def train(self, train_dataset: Any, eval_dataset: Any) -> TrainResult:
        """Setup, then the source's chunks (:mod:`prefzoo.train.loop.source`: offline epochs or on-policy rounds)
        through the same steps; evaluation and ``on_epoch_end`` where a pass over the data ends."""
        self.setup(train_dataset, eval_dataset)
        p, state, source = self.parts, self.state, self.parts.source
        self.step.skip_left = skip_batches_left(self.cfg, p.start_step, p.skip_record, p.accelerator.print)
        self.preemption.start_training()  # from here a signal is a checkpoint at the next step boundary
        for epoch, batches in source.chunks(state, self.callbacks):
            if self.done:
                break
            state.epoch = epoch
            if self.train_epoch(batches):
                break
            if source.pass_ended(state):
                if p.eval_dl is not None:
                    self.evaluate()
                self.callbacks.call("on_epoch_end", state, p.accelerator.unwrap_model(p.policy).lm)
            if not self.done and self.boundary.stop_requested():
                break
        return self.finish()

    def setup(self, train_dataset: Any, eval_dataset: Any) -> None:
        cfg = self.cfg
        self.parts = p = setup(cfg, train_dataset, eval_dataset, self.loss)
        acc = p.accelerator
        self.show_progress = cfg.progress and acc.is_main_process
        self.preemption.accelerator = acc
        self.writer = JsonlWriter(Path(cfg.output_dir) / "metrics.jsonl", acc.is_main_process)
        self.guard = NonFiniteGuard(acc, cfg.max_consecutive_skips, self.writer)
        self.guard.skipped = p.start_skipped
        self.metrics = MetricsAccumulator()
        self.result = TrainResult(
            global_step=p.start_step, data_stats=p.data_stats, tokenizer=p.tokenizer, model_defaults=p.model_defaults
        )
        self.state = RunState(
            cfg, acc, p.policy, p.tokenizer, p.eval_dl is not None, p.total_steps, p.steps_per_epoch, p.start_step,
            timings=dict(p.timings), writer=self.writer, reference=p.reference, engine=p.engine,
            resumed_from=p.resume_path,
        )  # fmt: skip
        if cfg.resume:  # the records a killed run logged after the checkpoint this one resumes from are logged again
            self.drop_logged_after(p.start_step)
        self.done = p.start_step >= p.total_steps
        self.bar = Progress(p.total_steps, "prefzoo train", unit="steps", initial=p.start_step, delay=0.0,
                            leave=True, enabled=self.show_progress)  # a bar on a terminal, a line every 10 s in a log
        self.step = self.build_step(p)
        self.boundary = self.build_boundary(p)
        self.callbacks.call("on_train_begin", self.state)
        if cfg.eval_at_start and p.start_step == 0 and p.eval_dl is not None:
            self.evaluate()
        self.t0 = time.perf_counter()

    def build_step(self, p: Parts) -> Step:
        cfg = self.cfg
        settings = StepSettings(
            grad_accum=cfg.grad_accum,
            max_grad_norm=cfg.max_grad_norm,
            check_grads=cfg.mixed_precision != "fp16",  # under fp16 the GradScaler already skips inf/NaN gradients
            output_dir=str(cfg.output_dir),
        )
        return Step(
            accelerator=p.accelerator, engine=p.engine, policy=p.policy, trainable=p.trainable, optimizer=p.optimizer,
            schedule=p.schedule, loss=p.loss, reference=p.reference, gather=p.gather, density_ratio=p.density_ratio,
            callbacks=self.callbacks, state=self.state, guard=self.guard, metrics=self.metrics, bar=self.bar,
            settings=settings,
        )  # fmt: skip

    def build_boundary(self, p: Parts) -> Boundary:
        cfg, ratio = self.cfg, p.density_ratio
        settings = SaveSettings(
            output_dir=str(cfg.output_dir), save_steps=cfg.save_steps, save_total_limit=cfg.save_total_limit,
            save_only_model=cfg.save_only_model, max_steps=cfg.max_steps, epochs=cfg.epochs,
            max_consecutive_skips=cfg.max_consecutive_skips,
        )  # fmt: skip
        saver = Saver(
            accelerator=p.accelerator, engine=p.engine, policy=p.policy, optimizer=p.optimizer, tokenizer=p.tokenizer,
            model_defaults=p.model_defaults, loss=p.loss,
            save_density_ratio=None if ratio is None else lambda folder: ratio.save(folder, cfg),
            source=p.source, storage=p.storage, info=p.info, skip_record=p.skip_record, callbacks=self.callbacks,
            state=self.state, settings=settings,
        )  # fmt: skip
        return Boundary(saver=saver, accelerator=p.accelerator, callbacks=self.callbacks, state=self.state,
                        guard=self.guard, preemption=self.preemption, result=self.result, bar=self.bar)  # fmt: skip

    def drop_logged_after(self, step: int) -> None:
        """Resuming at ``step``: metrics.jsonl keeps no record of a later step (each step is logged once)."""
        dropped = self.writer.drop_after(step)
        if dropped:
            self.parts.accelerator.print(
                f"prefzoo train: dropped {dropped} line(s) of {self.writer.path} logged after step {step} (the step "
                "this run resumes from): those steps are trained and logged again"
            )
        self.result.last_metrics = last_logged(self.writer.path, step) if step else {}

    def train_epoch(self, batches: Any) -> bool:
        """One pass over ``batches``; True when the run stops early (preemption, a callback, stop_after_steps)."""
        for batch in batches:
            self.step.micro_batch(batch)
            if not self.parts.accelerator.sync_gradients:
                continue
            self.step.end()
            if self.after_step():
                return self.result.stopped_early
        return False

    def after_step(self) -> bool:
        """Logging, checkpoint, preemption and stop checks at a step boundary; True ends the epoch loop."""
        state, total, boundary = self.state, self.parts.total_steps, self.boundary
        self.log()
        if self.eval_due():
            self.evaluate()
        boundary.save_if_due()
        if self.guard.exhausted():
            boundary.abort_nonfinite()
        if boundary.stop_requested():
            return True
        if self.cfg.stop_after_steps is not None and state.global_step >= self.cfg.stop_after_steps:
            self.result.stopped_early = True
            return True
        if state.global_step >= total:
            self.done = True
            return True
        return False

    def eval_due(self) -> bool:
        """``--eval-steps N``: every N optimizer steps (epoch ends evaluate anyway, so not twice there)."""
        state, p, n = self.state, self.parts, self.cfg.eval_steps
        if not n or p.eval_dl is None or state.global_step % n:
            return False
        return not (state.global_step % p.steps_per_epoch == 0 or state.global_step >= p.total_steps)

    def evaluate(self) -> None:
        p, state = self.parts, self.state
        ev = evaluate(p.loss, p.policy, p.reference, p.eval_dl, p.accelerator, p.gather, p.density_ratio,
                      progress=self.show_progress)  # fmt: skip
        ev.update(epoch=state.epoch, step=state.global_step)
        self.result.evals.append(ev)
        self.writer.write(ev)
        if state.epoch == 0:
            where = "before training"
        else:
            p.accelerator.log(ev, step=state.global_step)
            at_end = state.global_step % p.steps_per_epoch == 0 or state.global_step >= p.total_steps
            where = f"epoch {state.epoch}" if at_end else f"step {state.global_step}"
        if p.accelerator.is_main_process:  # written around the progress bar (stderr) so the two do not mix
            self.bar.write(
                f"prefzoo train: {where}: eval reward accuracy {ev['eval/reward_accuracy']:.3f}{tie_note(ev)}, "
                f"eval loss {ev['eval/loss']:.4f}"
            )
        self.callbacks.call("on_evaluate", state, ev)

    def finish(self) -> TrainResult:
        p, result, cfg = self.parts, self.result, self.cfg
        self.bar.close()
        result.global_step = self.state.global_step
        result.skipped_steps = self.guard.skipped
        if result.history:
            result.last_metrics = result.history[-1]
        if not result.stopped_early or self.boundary.stopped_by_callback:
            result.final_dir = write_final_model(p.accelerator, p.policy, p.tokenizer, cfg, result, p.engine, p.loss)
            if p.storage is None or p.storage.writer:  # after write_final_model's last barrier: final/ is complete
                mark_finished(cfg.output_dir, result.global_step, result.final_dir)
            if cfg.push_to_hub and p.accelerator.is_main_process:
                push_final(result.final_dir, cfg.push_to_hub, cfg.loss, cfg.hub_private_repo, p.accelerator.print)
        result.model = p.accelerator.unwrap_model(p.policy).lm
        self.callbacks.call("on_train_end", self.state)
        end_accelerator(p.accelerator, p.engine)  # also what the engine turned on process-wide
        return result

    # -- after-step pieces ----------------------------------------------------------------------------------------
    def log(self) -> None:
        state, cfg, p = self.state, self.cfg, self.parts
        if not (state.global_step % cfg.logging_steps == 0 or state.global_step == p.total_steps):
            return
        metrics, tokens = self.metrics.reduce(p.accelerator)
        elapsed = time.perf_counter() - self.t0
        grad_norm = self.step.grad_norm  # the last optimizer step's
        metrics.update(
            skipped_steps=self.guard.skipped,
            grad_norm=float(grad_norm) if grad_norm is not None else float("nan"),
            lr=float(p.schedule.get_last_lr()[0]),
            learning_rate=float(p.schedule.get_last_lr()[0]),  # TRL's / transformers' name for the same value
            tokens_per_second=tokens / max(elapsed, 1e-9),
            epoch=round(state.global_step / p.steps_per_epoch, 4),  # fractional, as TRL logs it (1.5 = mid-epoch 2)
            step=state.global_step,
        )
        self.t0 = time.perf_counter()
        self.result.history.append(metrics)
        self.writer.write(metrics)
        p.accelerator.log(metrics, step=state.global_step)
        self.bar.set_postfix(
            loss=f"{metrics.get('loss', math.nan):.4f}", acc=f"{metrics.get('rewards/accuracies', math.nan):.2f}"
        )
        state.metrics = metrics
        self.callbacks.call("on_log", state, metrics)


def push_final(folder: Path, repo: str, loss_name: str, asked_private: bool, say: Any) -> None:
    """``--push-to-hub``: upload the final model folder and say who can read it (main process)."""
    private = True if asked_private else None  # None: the hub's default visibility
    url, is_private = push_folder(folder, repo, f"prefzoo {loss_name} run", private)
    say(f"prefzoo train: pushed {folder} to {url}; {visibility_line(repo, is_private, asked_private)}")
