"""A training run as small phases: ``setup`` → (``step`` per micro-batch → ``after_step``)* → ``evaluate`` → ``finish``.

The step reads top to bottom: batch → log-probs → loss → backward → optimizer; everything else (logging,
checkpoints, preemption, evaluation) happens in ``after_step`` and at epoch ends, and callbacks see each phase
through the hooks of :class:`prefzoo.train.callbacks.Callback`.  The loop never looks at a loss's name.
"""

from __future__ import annotations

import math
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from prefzoo.data.progress import Progress, length, showing
from prefzoo.model import add_router_loss, router_metrics
from prefzoo.train.batch import batch_fields, batch_type, float_fields
from prefzoo.train.callbacks import CallbackList, RunState
from prefzoo.train.checkpoint import checkpoint_step, find_latest_checkpoint, save_checkpoint
from prefzoo.train.distributed import end_accelerator
from prefzoo.train.guard import NonFiniteGuard, NonFiniteStepsError, deepspeed_drops_nonfinite_steps, nonfinite_ids
from prefzoo.train.hub import push_folder
from prefzoo.train.metrics import JsonlWriter, MetricsAccumulator, correct_rows, last_logged, step_metrics
from prefzoo.train.outdir import mark_finished
from prefzoo.train.runcard import save_model_folder, write_final_model
from prefzoo.train.setup import setup, skip_batches_left

__all__ = ["Run", "TrainResult", "evaluate"]


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
    model: Any = None  # this process's trained LM (only its shards under FSDP2 / ZeRO-3: runcard.load_final_model)
    tokenizer: Any = None
    model_defaults: Any = None  # ModelDefaults: the dropout turned off (or kept) and the token limits used


@torch.no_grad()
def evaluate(
    loss: Any, policy: Any, reference: Any, dataloader: Any, accelerator: Any, gather: Any, density_ratio: Any = None
) -> dict[str, float]:
    """Reward accuracy mean(chosen_rewards > rejected_rewards) with the loss's own scores, and the mean loss.

    A pair with a non-finite log-prob, loss or reward is counted in ``eval/skipped_pairs`` and left out of both
    means.  Its inputs are replaced by zeros before the loss, so every process calls the loss (and its gathers) with
    the same batch and a NaN in one process's shard cannot desynchronise or hang the others.
    """
    was_training = policy.training
    policy.eval()
    correct, losses = [], []
    with Progress(length(dataloader), "evaluating", unit="batches") as bar:  # shown if over 2 s (see showing())
        for batch in dataloader:
            cls = batch_type(batch)
            fields = batch_fields(loss, policy, reference, batch, accelerator.autocast, density_ratio=density_ratio)
            fields.pop("aux_loss", None)
            ok = _finite_rows(fields, float_fields(cls))  # (B,) bool
            fields = {k: _zero_rows(v, ok) if k in float_fields(cls) else v for k, v in fields.items()}
            pb = cls(**fields)
            out = loss(pb, gather=gather)
            ok &= torch.isfinite(out.losses) & torch.isfinite(out.chosen_rewards) & torch.isfinite(out.rejected_rewards)
            nan = torch.full_like(out.losses, math.nan, dtype=torch.float32)
            correct.append(accelerator.gather_for_metrics(torch.where(ok, correct_rows(pb, out), nan)))
            losses.append(accelerator.gather_for_metrics(torch.where(ok, out.losses.detach().float(), nan)))
            bar.update(1)
    policy.train(was_training)
    acc, mean_loss = torch.cat(correct), torch.cat(losses)
    kept = torch.isfinite(acc)
    skipped = int((~kept).sum())
    if skipped:
        accelerator.print(
            f"prefzoo train: evaluation skipped {skipped} of {acc.numel()} pairs with non-finite log-probs, loss or "
            "rewards (left out of eval reward accuracy and loss; counted in eval/skipped_pairs)"
        )
    return {
        "eval/reward_accuracy": float(acc[kept].mean()) if kept.any() else math.nan,
        "eval/loss": float(mean_loss[kept].mean()) if kept.any() else math.nan,
        "eval/pairs": float(kept.sum()),
        "eval/skipped_pairs": float(skipped),
    }


def _finite_rows(fields: dict[str, Any], names: tuple[str, ...]) -> Any:
    """(B,) True where every float field of the example (pair, group or completion) is finite."""
    first = next(fields[k] for k in names if fields.get(k) is not None)
    ok = torch.ones(first.shape[0], dtype=torch.bool, device=first.device)
    for k in names:
        t = fields.get(k)
        if t is not None:
            ok &= torch.isfinite(t.detach()).reshape(t.shape[0], -1).all(dim=1)
    return ok


def _zero_rows(t: Any, ok: Any) -> Any:
    """``t`` ((B,) or (B, T)) with the rows where ``ok`` is False set to 0."""
    if t is None:
        return None
    return torch.where(ok.reshape(-1, *([1] * (t.dim() - 1))), t, torch.zeros_like(t))


@dataclass
class _Step:
    """The optimizer step in flight on this process."""

    bad: bool = False  # skipped (agreed on by every process); its remaining micro-batches are not computed
    reason: str = ""
    bad_ids: list[str] = field(default_factory=list)
    ids: list[str] = field(default_factory=list)  # example ids of this step on this process
    losses: list[float] = field(default_factory=list)  # micro-batch mean losses
    micro: int = 0  # micro-batches done
    grad_norm: Any = None
    poisoned: bool = False  # DeepSpeed, accumulation > 1: NaN gradients make the engine drop the step at its boundary
    by_request: bool = False  # skipped by --skip-batches (not a fault: not counted towards max_consecutive_skips)


class Run:
    """One training run: ``Run(cfg, callbacks, preemption).train(train_dataset, eval_dataset)``."""

    def __init__(self, cfg: Any, callbacks: CallbackList, preemption: Any) -> None:
        self.cfg, self.callbacks, self.preemption = cfg, callbacks, preemption

    # -- phases -------------------------------------------------------------------------------------------------
    def train(self, train_dataset: Any, eval_dataset: Any) -> TrainResult:
        """Setup, then the source's chunks (:mod:`prefzoo.train.source`: offline epochs or on-policy rounds) through
        the same steps; evaluation and ``on_epoch_end`` where a pass over the data ends."""
        self.setup(train_dataset, eval_dataset)
        p, state, source = self.parts, self.state, self.parts.source
        self.skip_left = skip_batches_left(self.cfg, p.start_step, p.skip_record, p.accelerator.print)
        self.preemption.start_training()  # from here a signal is a checkpoint at the next step boundary
        for epoch, batches in source.chunks(self):
            if self.done:
                break
            state.epoch = epoch
            if self.train_epoch(batches):
                break
            if source.pass_ended(state):
                if p.eval_dl is not None:
                    self.evaluate()
                self.callbacks.call("on_epoch_end", state, p.accelerator.unwrap_model(p.policy).lm)
            if not self.done and self.stop_requested():
                break
        return self.finish()

    def setup(self, train_dataset: Any, eval_dataset: Any) -> None:
        cfg = self.cfg
        with showing(cfg.progress and os.environ.get("RANK", "0") == "0"):  # tokenizing, the reference precompute
            self.parts = p = setup(cfg, train_dataset, eval_dataset)
        acc = p.accelerator
        self.show_progress = cfg.progress and acc.is_main_process
        self.preemption.accelerator = acc
        self.writer = JsonlWriter(Path(cfg.output_dir) / "metrics.jsonl", acc.is_main_process)
        self.guard = NonFiniteGuard(acc, cfg.max_consecutive_skips, self.writer)
        self.guard.skipped = p.start_skipped
        self.check_grads = cfg.mixed_precision != "fp16"  # under fp16 the GradScaler already skips inf/NaN gradients
        self.metrics = MetricsAccumulator()
        self.result = TrainResult(
            global_step=p.start_step, data_stats=p.data_stats, tokenizer=p.tokenizer, model_defaults=p.model_defaults
        )
        self.state = RunState(
            cfg, acc, p.policy, p.tokenizer, p.eval_dl is not None, p.total_steps, p.steps_per_epoch, p.start_step,
            timings=dict(p.timings), writer=self.writer, reference=p.reference,
        )  # fmt: skip
        if cfg.resume:  # the records a killed run logged after the checkpoint this one resumes from are logged again
            self.drop_logged_after(p.start_step)
        self.step_state = _Step()
        self.skip_left = 0  # --skip-batches micro-batches still to pass over (set by train())
        self.done = p.start_step >= p.total_steps
        self.saved: Path | None = None  # checkpoint written at the current step boundary
        self.stopped_by_callback = False
        with showing(self.show_progress):  # a bar on a terminal, a line every 10 s in a log
            self.bar = Progress(p.total_steps, "prefzoo train", unit="steps", initial=p.start_step, delay=0.0,
                                leave=True)  # fmt: skip
        self.callbacks.call("on_train_begin", self.state)
        if cfg.eval_at_start and p.start_step == 0 and p.eval_dl is not None:
            self.evaluate()
        self.t0 = time.perf_counter()

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
            self.step(batch)
            if not self.parts.accelerator.sync_gradients:
                continue
            self.end_step()
            if self.after_step():
                return self.result.stopped_early
        return False

    def step(self, batch: dict[str, Any]) -> None:
        """One micro-batch: log-probs → loss → backward; at the step's last micro-batch clip and step the optimizer."""
        p, s = self.parts, self.step_state
        self.state.batch = batch
        if s.micro == 0:
            self.callbacks.call("on_step_begin", self.state)
        s.micro += 1
        if self.skip_left > 0:  # --skip-batches: the whole optimizer step holding these micro-batches is skipped
            self.skip_left -= 1
            s.bad, s.reason, s.by_request = True, "--skip-batches", True
            s.bad_ids += [str(i) for i in batch["ids"]]
        with p.accelerator.accumulate(p.policy):
            s.grad_norm = None
            if not s.bad:  # once a step is bad, its remaining micro-batches are not computed
                self.forward_backward(batch)
            elif s.poisoned:  # DeepSpeed: backward must still reach the engine's boundary, where it drops the step
                self.poison_backward(batch_fields(p.loss, p.policy, None, batch, p.accelerator.autocast))
            if s.poisoned and p.accelerator.sync_gradients and p.policy.was_step_applied():
                raise RuntimeError("DeepSpeed applied a step with NaN gradients; its overflow check is off")
            if p.accelerator.sync_gradients and not s.bad:
                self.clip_gradients()
            if not s.bad:
                p.optimizer.step()
            p.optimizer.zero_grad()

    def forward_backward(self, batch: dict[str, Any]) -> None:
        p, s, guard = self.parts, self.step_state, self.guard
        ids = [str(i) for i in batch["ids"]]
        s.ids += ids
        cls = batch_type(batch)  # PreferenceBatch, or GroupBatch / UnpairedBatch for lists and unpaired data
        stats: dict[str, Any] = {}  # logits/chosen, logits/rejected metrics (pairs)
        fields = batch_fields(p.loss, p.policy, p.reference, batch, p.accelerator.autocast, stats, p.density_ratio)
        aux = fields.pop("aux_loss", None)  # () MoE router term (coef × aux) or None
        fields = self.callbacks.on_batch(self.state, fields)
        local_bad = nonfinite_ids(ids, *(fields.get(k) for k in float_fields(cls)))
        out = None
        if not guard.any_rank(bool(local_bad)):  # every rank agrees before the loss gathers
            pb = cls(**fields)
            out = p.loss(pb, gather=p.gather)
            local_bad = nonfinite_ids(ids, out.losses)
        if out is None or guard.any_rank(bool(local_bad)):
            s.bad, s.reason, s.bad_ids = True, "non-finite log-probs or loss", guard.all_ids(local_bad)
            if self.cfg.deepspeed:
                # the engine steps inside backward at its accumulation boundary (prefzoo.train.guard): with one
                # micro-batch per step no rank calls backward; with several the rest of the step backpropagates NaN
                # and ZeRO's overflow check drops the step (weights, moments and scheduler untouched)
                if self.cfg.grad_accum == 1:
                    return
                if not deepspeed_drops_nonfinite_steps(p.policy):
                    raise _deepspeed_nonfinite(self.cfg, self.state.global_step + 1, s.bad_ids)
                s.poisoned = True
                self.poison_backward(fields)
                return
            # settle DDP's pending gradient reduction with zeros; the step is discarded
            p.accelerator.backward(sum((q * 0.0).sum() for q in p.trainable))
            return
        loss_value = out.losses.mean()  # mean over this process's pairs; DDP averages over processes
        loss_value = add_router_loss(loss_value, aux)
        p.accelerator.backward(loss_value)
        m = {**step_metrics(pb, out, loss_value, stats), **router_metrics(aux)}
        self.metrics.add(m, int(batch["attention_mask"].sum()))
        s.losses.append(m["loss"])

    def poison_backward(self, fields: dict[str, Any]) -> None:
        """Backward of NaN × the log-probs: every gradient the step accumulated in DeepSpeed becomes NaN."""
        logps = sum(v.sum() for v in fields.values() if isinstance(v, torch.Tensor) and v.requires_grad)  # ()
        self.parts.accelerator.backward(logps * math.nan)  # any shape: pairs, (G, K) groups, unpaired rows

    def clip_gradients(self) -> None:
        p, s = self.parts, self.step_state
        self.callbacks.call("on_before_optimizer_step", self.state, p.trainable)
        s.grad_norm = p.accelerator.clip_grad_norm_(p.trainable, self.cfg.max_grad_norm)
        norm_bad = s.grad_norm is not None and not math.isfinite(float(s.grad_norm))
        if self.check_grads and self.guard.any_rank(norm_bad):
            s.bad, s.reason = True, f"non-finite gradient norm {float(s.grad_norm)}"
            s.bad_ids = self.guard.all_ids(s.ids)

    def end_step(self) -> None:
        """The optimizer step is complete (or skipped): scheduler, skip bookkeeping, counters."""
        s, state = self.step_state, self.state
        if s.bad:
            self.guard.record_skip(state.global_step + 1, s.reason, s.bad_ids, fault=not s.by_request)
        else:
            self.parts.schedule.step()
            self.guard.record_ok()
        state.global_step += 1
        state.loss = sum(s.losses) / len(s.losses) if s.losses and not s.bad else math.nan
        self.grad_norm = s.grad_norm
        self.step_state = _Step()
        self.bar.update(1)
        self.callbacks.call("on_step_end", state)

    def after_step(self) -> bool:
        """Logging, checkpoint, preemption and stop checks at a step boundary; True ends the epoch loop."""
        state, total = self.state, self.parts.total_steps
        self.log()
        if self.eval_due():
            self.evaluate()
        self.saved = self.checkpoint()
        if self.guard.exhausted():
            self.abort_nonfinite()
        if self.stop_requested():
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
        with showing(self.show_progress):
            ev = evaluate(p.loss, p.policy, p.reference, p.eval_dl, p.accelerator, p.gather, p.density_ratio)
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
                f"prefzoo train: {where}: eval reward accuracy {ev['eval/reward_accuracy']:.3f}, "
                f"eval loss {ev['eval/loss']:.4f}"
            )
        self.callbacks.call("on_evaluate", state, ev)

    def finish(self) -> TrainResult:
        p, result = self.parts, self.result
        self.bar.close()
        result.global_step = self.state.global_step
        result.skipped_steps = self.guard.skipped
        if result.history:
            result.last_metrics = result.history[-1]
        if not result.stopped_early or self.stopped_by_callback:
            result.final_dir = write_final_model(p.accelerator, p.policy, p.tokenizer, self.cfg, result, p.fsdp, p.loss)
            if p.storage is None or p.storage.writer:  # after write_final_model's last barrier: final/ is complete
                mark_finished(self.cfg.output_dir, result.global_step, result.final_dir)
            if self.cfg.push_to_hub and p.accelerator.is_main_process:
                url = push_folder(result.final_dir, self.cfg.push_to_hub, f"prefzoo {self.cfg.loss} run")
                p.accelerator.print(f"prefzoo train: pushed {result.final_dir} to {url}")
        result.model = p.accelerator.unwrap_model(p.policy).lm
        self.callbacks.call("on_train_end", self.state)
        end_accelerator(p.accelerator)  # also ends DeepSpeed's hold on later model loads
        return result

    # -- after-step pieces ----------------------------------------------------------------------------------------
    def log(self) -> None:
        state, cfg, p = self.state, self.cfg, self.parts
        if not (state.global_step % cfg.logging_steps == 0 or state.global_step == p.total_steps):
            return
        metrics, tokens = self.metrics.reduce(p.accelerator)
        elapsed = time.perf_counter() - self.t0
        metrics.update(
            skipped_steps=self.guard.skipped,
            grad_norm=float(self.grad_norm) if self.grad_norm is not None else float("nan"),
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
                save_model_folder(acc, p.policy, p.tokenizer, tmp, p.model_defaults, fsdp=p.fsdp)

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
        """Every rank, after accelerate's state: with --fsdp its own model and optimizer shards (accelerate saves
        none); with --density-ratio the folder's writer adds the classifier (a resumed run loads it)."""
        p = self.parts
        if p.fsdp is not None:
            p.fsdp.save(p.policy, p.optimizer, tmp)
        if p.density_ratio is not None:
            node_local = p.storage is not None and not p.storage.shared
            if p.accelerator.is_local_main_process if node_local else p.accelerator.is_main_process:
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


def _deepspeed_nonfinite(cfg: Any, step: int, ids: list[str]) -> NonFiniteStepsError:
    latest = find_latest_checkpoint(cfg.output_dir)
    return NonFiniteStepsError(
        f"non-finite log-probs or loss in step {step} (examples {ids[:8]}); under DeepSpeed the engine steps inside "
        "backward, and this engine does not drop a step with NaN gradients (no ZeRO, or bf16 without "
        "bf16.check_grad_overflow), so with --grad-accum > 1 prefzoo stops instead (with --grad-accum 1 it skips it). "
        + (
            f"Resume from {latest} with --resume auto, adding --skip-batches "
            f"{(step - checkpoint_step(latest)) * cfg.grad_accum} to pass over the steps up to this one "
            "(or a lower --lr)."
            if latest
            else f"No checkpoint yet: rerun with --skip-batches {step * cfg.grad_accum} to pass over steps 1..{step}."
        )
    )
