"""The one training loop for every registered loss: it reads the loss's declared needs and never its name."""

from __future__ import annotations

import logging
import math
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from prefzoo.data.chat import set_chat_template
from prefzoo.data.collate import PreferenceCollator
from prefzoo.data.default import cache_root
from prefzoo.data.preview import describe_data
from prefzoo.data.tokenize import ensure_pad_token
from prefzoo.registry import get_loss
from prefzoo.spec import Loss
from prefzoo.train.checkpoint import ResumeError, find_latest_checkpoint, read_marker, save_checkpoint
from prefzoo.train.config import ConfigError, TrainConfig
from prefzoo.train.data import prepare_datasets
from prefzoo.train.distributed import build_accelerator, make_gather
from prefzoo.train.faults import (
    FaultPlan,
    NonFiniteGuard,
    NonFiniteStepsError,
    PeerFailureError,
    TrainingAborted,
    is_peer_failure,
    nonfinite_ids,
)
from prefzoo.train.logps import PolicyLogps
from prefzoo.train.metrics import JsonlWriter, MetricsAccumulator, step_metrics
from prefzoo.train.model import apply_lora, build_optimizer, build_schedule, load_model_and_tokenizer
from prefzoo.train.model_defaults import apply_model_defaults
from prefzoo.train.moe import add_router_loss, router_metrics
from prefzoo.train.reference import (
    AdapterDisabledReference,
    FrozenReference,
    PrecomputedReference,
    Reference,
    load_or_compute_reference_table,
    model_identity,
)
from prefzoo.train.runcard import write_final_model
from prefzoo.train.selfcheck import first_pairs, run_self_check
from prefzoo.train.signals import PreemptionHandler
from prefzoo.train.trackers import resolve_trackers
from prefzoo.types import FLOAT_FIELDS, Need, PreferenceBatch

__all__ = ["TrainResult", "evaluate", "train"]

log = logging.getLogger(__name__)


@dataclass
class TrainResult:
    """What a run produced (on every process; ``model`` is the unwrapped trained causal LM)."""

    global_step: int
    history: list[dict[str, float]] = field(default_factory=list)  # one record per logging step
    evals: list[dict[str, float]] = field(default_factory=list)  # one record per evaluation
    data_stats: dict[str, Any] = field(default_factory=dict)
    final_dir: Path | None = None
    stopped_early: bool = False
    stop_reason: str | None = None  # e.g. 'preempted by SIGTERM'; None when the run finished or stop_after_steps hit
    skipped_steps: int = 0  # optimizer steps skipped for non-finite log-probs, losses or gradients
    checkpoint: Path | None = None  # the newest checkpoint this run wrote
    model: Any = None
    tokenizer: Any = None
    model_defaults: Any = None  # ModelDefaults: the dropout turned off (or kept) and the token limits used


def preference_batch(
    loss: Loss, policy: Any, reference: Reference | None, batch: dict[str, Any], autocast: Any
) -> PreferenceBatch:
    """Policy (and reference) log-probs for a collated batch, as the PreferenceBatch the loss declared it needs."""
    fields = batch_fields(loss, policy, reference, batch, autocast)
    fields.pop("aux_loss", None)  # the router loss is a training term, not a batch field
    return PreferenceBatch(**fields)


def batch_fields(
    loss: Loss, policy: Any, reference: Reference | None, batch: dict[str, Any], autocast: Any
) -> dict[str, Any]:
    """The PreferenceBatch fields of a collated batch (not yet validated: the loop checks finiteness first)."""
    want_tokens, want_ent = Need.TOKEN_LOGPS in loss.needs, Need.TOKEN_ENTROPIES in loss.needs
    out = policy(
        batch["input_ids"],
        batch["attention_mask"],
        batch["completion_mask"],
        token_logps=want_tokens,
        token_entropies=want_ent,
    )
    w, l = out.split()
    fields: dict[str, Any] = {
        "policy_chosen_logps": w["logps"],  # (B,)
        "policy_rejected_logps": l["logps"],  # (B,)
        "chosen_lengths": w["lengths"],  # (B,)
        "rejected_lengths": l["lengths"],  # (B,)
        "example_ids": tuple(batch["ids"]),
    }
    if out.get("aux_loss") is not None:
        fields["aux_loss"] = out["aux_loss"]  # () MoE router term; popped by the loop before PreferenceBatch
    if want_tokens or want_ent:
        fields.update(chosen_mask=w["token_mask"], rejected_mask=l["token_mask"])  # (B, T_c) bool
    if want_tokens:
        fields.update(policy_chosen_token_logps=w["token_logps"], policy_rejected_token_logps=l["token_logps"])
    if want_ent:
        fields.update(chosen_token_entropies=w["token_entropies"], rejected_token_entropies=l["token_entropies"])
    if reference is not None:
        with autocast():
            ref_w, ref_l = reference(batch)  # (B,), (B,) constants
        fields.update(ref_chosen_logps=ref_w.float(), ref_rejected_logps=ref_l.float())
    return fields


@torch.no_grad()
def evaluate(
    loss: Loss, policy: Any, reference: Reference | None, dataloader: Any, accelerator: Any, gather: Any
) -> dict[str, float]:
    """Reward accuracy mean(chosen_rewards > rejected_rewards) with the loss's own scores, and the mean loss."""
    was_training = policy.training
    policy.eval()
    correct, losses = [], []
    for batch in dataloader:
        pb = preference_batch(loss, policy, reference, batch, accelerator.autocast)
        out = loss(pb, gather=gather)
        correct.append(accelerator.gather_for_metrics((out.chosen_rewards > out.rejected_rewards).float()))
        losses.append(accelerator.gather_for_metrics(out.losses.detach().float()))
    policy.train(was_training)
    acc = torch.cat(correct)
    return {
        "eval/reward_accuracy": float(acc.mean()),
        "eval/loss": float(torch.cat(losses).mean()),
        "eval/pairs": float(acc.numel()),
    }


def _resume_point(cfg: TrainConfig) -> tuple[Path | None, dict[str, Any]]:
    if not cfg.resume:
        return None, {}
    path = find_latest_checkpoint(cfg.output_dir) if cfg.resume == "auto" else Path(cfg.resume)
    if path is None:
        return None, {}  # 'auto' with nothing saved yet: a fresh start
    info = read_marker(path)
    if info.get("loss") != cfg.loss or info.get("loss_params") != {k: str(v) for k, v in cfg.loss_params.items()}:
        raise ResumeError(
            f"--resume {path}: checkpoint was trained with loss {info.get('loss')!r} {info.get('loss_params')}, "
            f"this run asks for {cfg.loss!r} {cfg.loss_params}; use the same loss or a new --output-dir"
        )
    return path, info


def _check_same_data_order(path: Path, saved: dict[str, Any], now: dict[str, Any]) -> None:
    """The position in the data is counted in batches: resuming needs the same batch geometry and seed."""
    for key, what in (("batch", "processes × per-device batch × accumulation"), ("seed", "seed")):
        if key in saved and saved[key] != now[key]:
            raise ResumeError(
                f"--resume {path}: checkpoint used {what} = {saved[key]}, this run {now[key]}; "
                "resume with the same settings (or start a new --output-dir)"
            )


def _build_reference(loss: Loss, cfg: TrainConfig, lm: Any, has_adapter: bool) -> tuple[Reference | None, str]:
    """The reference the loss declares it needs (before accelerate wraps the policy), and how it is made."""
    if Need.REFERENCE not in loss.needs:
        return None, "none (reference-free loss)"
    if cfg.lora and not has_adapter:
        return None, "adapter-disabled policy"  # built after prepare, from the wrapped policy
    if _zero3_enabled():
        return None, "frozen ZeRO-3 partitioned copy of the starting model"  # built after prepare
    return FrozenReference(lm, cfg.logp_chunk_size), "frozen copy of the starting model"


def _train_order(cfg: TrainConfig, train_tok: Any) -> dict[str, Any]:
    """DataLoader ordering: plain shuffling, or length-grouped batches (``group_by_length``) that pad less."""
    if not cfg.group_by_length:
        return {"shuffle": True}
    from prefzoo.train.fastpath_batching import LengthGroupedSampler, pair_lengths

    return {"sampler": LengthGroupedSampler(pair_lengths(train_tok), cfg.per_device_batch_size, cfg.seed)}


def _zero3_enabled() -> bool:
    try:
        from transformers.integrations.deepspeed import is_deepspeed_zero3_enabled
    except ImportError:
        return False
    return bool(is_deepspeed_zero3_enabled())


def _trackers(cfg: TrainConfig) -> list[str] | None:
    return resolve_trackers(cfg.report_to)


def train(
    cfg: TrainConfig, train_dataset: Any = None, eval_dataset: Any = None, *, on_epoch_end: Any = None
) -> TrainResult:
    """Train ``cfg.model`` on preference pairs with ``cfg.loss``; datasets given here override ``cfg.dataset``.

    ``on_epoch_end(epoch, model)``, if given, is called after each completed epoch (1-based, after the epoch's
    evaluation) with the unwrapped causal LM, e.g. to generate from it; it must leave the weights unchanged.

    SIGTERM/SIGINT stop the run at the next optimizer step with a checkpoint (``result.stop_reason``); a failed or
    hung peer process raises :class:`PeerFailureError`; too many non-finite steps in a row raise
    :class:`NonFiniteStepsError` after saving a checkpoint.
    """
    with PreemptionHandler() as preemption:
        try:
            return _train(cfg, train_dataset, eval_dataset, preemption, on_epoch_end)
        except TrainingAborted:
            raise
        except Exception as e:
            if not (_world_size() > 1 and is_peer_failure(e)):
                raise
            latest = find_latest_checkpoint(cfg.output_dir)
            raise PeerFailureError(
                f"a collective failed or waited longer than --dist-timeout={cfg.dist_timeout:g}s: another process "
                f"died or hung (see its log above; {type(e).__name__}: {str(e).strip()[:200]!r}). "
                + (
                    f"The newest complete checkpoint is {latest}: rerun with --resume auto."
                    if latest
                    else "No checkpoint was written yet."
                )
            ) from e


def _world_size() -> int:
    import torch.distributed as dist

    return dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1


def _train(
    cfg: TrainConfig, train_dataset: Any, eval_dataset: Any, preemption: PreemptionHandler, on_epoch_end: Any = None
) -> TrainResult:
    from accelerate.utils import set_seed
    from tqdm.auto import tqdm

    loss = get_loss(cfg.loss, **cfg.loss_params)  # unknown names / bad params fail before any model loads
    if cfg.model is None:
        raise ConfigError("model is not set: give --model (or neither --model nor --dataset for the default task)")
    resume_path, resume_info = _resume_point(cfg)
    if cfg.merge_lora and cfg.deepspeed == "zero3":
        raise ConfigError("--merge-lora is not supported with ZeRO-3 here; save the adapter and merge afterwards")
    accelerator = build_accelerator(cfg, _trackers(cfg), cfg.output_dir)
    preemption.accelerator = accelerator
    faults = FaultPlan.from_env()  # empty unless a test sets PREFZOO_FAULTS
    rank = accelerator.process_index
    set_seed(cfg.seed)
    lm, tokenizer, has_adapter = load_model_and_tokenizer(cfg.model, trust_remote_code=cfg.trust_remote_code)
    identity = model_identity(lm, cfg.model)
    if resume_info and resume_info.get("model_identity") != identity:
        raise ResumeError(
            f"--resume {resume_path}: checkpoint was trained from model {resume_info.get('model')!r} "
            f"(identity {resume_info.get('model_identity')}), this run starts from {cfg.model!r} "
            f"({identity}); use the same --model or a new --output-dir"
        )
    pad_note = ensure_pad_token(tokenizer)
    if pad_note:
        accelerator.print(f"prefzoo train: {pad_note}")
        lm.config.pad_token_id = tokenizer.pad_token_id
    defaults = apply_model_defaults(cfg, lm, tokenizer)  # dropout off unless --keep-dropout; limits fit the context
    for line in defaults.lines():
        accelerator.print(f"prefzoo train: {line}")
    template = set_chat_template(tokenizer, cfg.chat_template)
    with accelerator.main_process_first():
        train_tok, eval_tok, data_stats = prepare_datasets(cfg, tokenizer, train_dataset, eval_dataset, defaults.limits)
    for line in describe_data(tokenizer, train_tok, data_stats, template):
        accelerator.print(f"prefzoo train: {line}")
    for split_name, s in data_stats.items():
        accelerator.print(
            f"prefzoo train: {split_name}: {s['kept']} pairs kept, {s['dropped']} dropped "
            f"({s.get('identical', 0)} with chosen identical to rejected, {s.get('oversized', 0)} oversized, the "
            f"rest with no completion token left), {s['prompt_truncated']} prompts / "
            f"{s['completion_truncated']} completions truncated ({s['context_truncated']} pairs only because of the "
            "model's context)"
        )
    reference, ref_kind = _build_reference(loss, cfg, lm, has_adapter)
    if cfg.lora and not has_adapter:
        lm = apply_lora(lm, cfg.lora_r, cfg.lora_alpha, cfg.lora_dropout, cfg.lora_target_modules)
    policy = PolicyLogps(lm, cfg.logp_chunk_size, fused_head=cfg.fused_head, router_aux=True)
    policy.train()
    trainable = [p for p in policy.parameters() if p.requires_grad]
    optimizer = build_optimizer(trainable, cfg.optim, cfg.lr, tuple(cfg.adam_betas), cfg.weight_decay)
    collate = PreferenceCollator(tokenizer.pad_token_id, share_prompt=cfg.share_prompt)
    train_dl = torch.utils.data.DataLoader(
        train_tok, batch_size=cfg.per_device_batch_size, collate_fn=collate, **_train_order(cfg, train_tok)
    )
    eval_dl = (
        torch.utils.data.DataLoader(eval_tok, batch_size=cfg.per_device_batch_size, collate_fn=collate)
        if eval_tok is not None
        else None
    )
    batches_per_process = math.ceil(len(train_tok) / (cfg.per_device_batch_size * accelerator.num_processes))
    steps_per_epoch = math.ceil(batches_per_process / cfg.grad_accum)
    total_steps = cfg.max_steps or steps_per_epoch * cfg.epochs  # e.g. 60k pairs / (2 × 16 × 4) ≈ 469 per epoch
    num_epochs = math.ceil(total_steps / steps_per_epoch)
    schedule = build_schedule(optimizer, total_steps, cfg.warmup_ratio)
    policy, optimizer, train_dl, schedule = accelerator.prepare(policy, optimizer, train_dl, schedule)
    if eval_dl is not None:
        eval_dl = accelerator.prepare(eval_dl)
    if reference is not None:
        assert isinstance(reference, FrozenReference)
        reference.module.to(accelerator.device)
    elif Need.REFERENCE in loss.needs and cfg.lora and not has_adapter:
        reference = AdapterDisabledReference(policy)
    elif Need.REFERENCE in loss.needs:  # ZeRO-3: load the reference again, partitioned like the policy
        ref_lm, _, _ = load_model_and_tokenizer(cfg.model, trust_remote_code=cfg.trust_remote_code)
        ds_config = accelerator.state.deepspeed_plugin.deepspeed_config
        reference = FrozenReference.under_zero3(ref_lm, cfg.logp_chunk_size, ds_config)
    if not _zero3_enabled():  # the fast path against the model's own forward, before any reference is cached
        check_batch = first_pairs(train_tok, collate, accelerator.device)
        run_self_check(policy, reference, check_batch, cfg.logps_fallback, accelerator.print)
    if reference is not None and cfg.precompute_ref:
        reference, ref_kind = _precompute(cfg, reference, accelerator, train_tok, eval_tok, collate, identity)
    gather = make_gather(accelerator)
    accelerator.print(
        f"prefzoo train: loss {loss!r}; reference: {ref_kind}; {accelerator.num_processes} "
        f"process(es) × {cfg.per_device_batch_size} pairs × {cfg.grad_accum} accumulation = "
        f"{accelerator.num_processes * cfg.per_device_batch_size * cfg.grad_accum} pairs per step; "
        f"{total_steps} steps"
    )
    out_dir = Path(cfg.output_dir)
    writer = JsonlWriter(out_dir / "metrics.jsonl", accelerator.is_main_process)
    if _trackers(cfg):
        simple = {k: v for k, v in cfg.to_dict().items() if isinstance(v, int | float | str | bool)}
        accelerator.init_trackers("prefzoo", config=simple)
    info = {
        "loss": cfg.loss,
        "loss_params": {k: str(v) for k, v in cfg.loss_params.items()},
        "model": cfg.model,
        "model_identity": identity,
        "batch": [accelerator.num_processes, cfg.per_device_batch_size, cfg.grad_accum],
        "seed": cfg.seed,
    }
    global_step = 0
    guard = NonFiniteGuard(accelerator, cfg.max_consecutive_skips, writer)
    check_grads = cfg.mixed_precision != "fp16"  # under fp16 the GradScaler already skips inf/NaN gradients
    if resume_path is not None:
        _check_same_data_order(resume_path, resume_info, info)
        _load_state(accelerator, resume_path)
        global_step = int(resume_info["step"])
        guard.skipped = int(resume_info.get("skipped_steps", 0))
        accelerator.print(f"prefzoo train: resumed from {resume_path} at step {global_step}")
    result = TrainResult(global_step=global_step, data_stats=data_stats, tokenizer=tokenizer, model_defaults=defaults)
    acc = MetricsAccumulator()
    bar = tqdm(
        total=total_steps,
        initial=global_step,
        disable=not (cfg.progress and accelerator.is_main_process),
        desc="prefzoo train",
        dynamic_ncols=True,
    )
    t0 = time.perf_counter()
    start_epoch = global_step // steps_per_epoch
    skip = (global_step - start_epoch * steps_per_epoch) * cfg.grad_accum  # micro-batches already seen this epoch
    done = global_step >= total_steps
    step_bad, bad_reason, bad_ids = False, "", []  # this optimizer step is skipped (agreed on by every process)
    step_ids: list[str] = []  # example ids of this optimizer step on this process
    if cfg.eval_at_start and global_step == 0 and eval_dl is not None:
        ev = evaluate(loss, policy, reference, eval_dl, accelerator, gather)
        ev.update(epoch=0, step=0)
        result.evals.append(ev)
        writer.write(ev)
        _say(
            accelerator,
            f"prefzoo train: before training: eval reward accuracy {ev['eval/reward_accuracy']:.3f}, "
            f"eval loss {ev['eval/loss']:.4f}",
        )
    for epoch in range(start_epoch, num_epochs):
        if done:
            break
        train_dl.set_epoch(epoch)
        batches = accelerator.skip_first_batches(train_dl, skip) if skip else train_dl
        skip = 0
        for batch in batches:
            faults.at_step_start(global_step + 1, rank)
            with accelerator.accumulate(policy):
                grad_norm = None
                if not step_bad:  # once a step is bad, its remaining micro-batches are not computed
                    ids = [str(i) for i in batch["ids"]]
                    step_ids += ids
                    fields = batch_fields(loss, policy, reference, batch, accelerator.autocast)
                    aux = fields.pop("aux_loss", None)  # () MoE router term (coef × aux) or None
                    fields["policy_chosen_logps"] = faults.poison_logps(
                        fields["policy_chosen_logps"], global_step + 1, rank
                    )
                    local_bad = nonfinite_ids(ids, *(fields.get(k) for k in FLOAT_FIELDS))
                    out = None
                    if not guard.any_rank(bool(local_bad)):  # every rank agrees before the loss gathers
                        pb = PreferenceBatch(**fields)
                        out = loss(pb, gather=gather)
                        local_bad = nonfinite_ids(ids, out.losses)
                    if out is None or guard.any_rank(bool(local_bad)):
                        step_bad, bad_reason = True, "non-finite log-probs or loss"
                        bad_ids = guard.all_ids(local_bad)
                        if cfg.deepspeed:
                            raise _deepspeed_nonfinite(cfg, global_step + 1, bad_ids)
                        # settle DDP's pending gradient reduction with zeros; the step is discarded below
                        accelerator.backward(sum((p * 0.0).sum() for p in trainable))
                    else:
                        loss_value = out.losses.mean()  # mean over this process's pairs; DDP averages over processes
                        loss_value = add_router_loss(loss_value, aux)
                        accelerator.backward(loss_value)
                        metrics_now = {**step_metrics(pb, out, loss_value), **router_metrics(aux)}
                        acc.add(metrics_now, int(batch["attention_mask"].sum()))
                if accelerator.sync_gradients and not step_bad:
                    faults.poison_grads(trainable, global_step + 1, rank)
                    grad_norm = accelerator.clip_grad_norm_(trainable, cfg.max_grad_norm)
                    norm_bad = grad_norm is not None and not math.isfinite(float(grad_norm))
                    if check_grads and guard.any_rank(norm_bad):
                        step_bad, bad_reason = True, f"non-finite gradient norm {float(grad_norm)}"
                        bad_ids = guard.all_ids(step_ids)
                if not step_bad:
                    optimizer.step()
                optimizer.zero_grad()
            if not accelerator.sync_gradients:
                continue
            if step_bad:
                guard.record_skip(global_step + 1, bad_reason, bad_ids)
            else:
                schedule.step()
                guard.record_ok()
            step_bad, step_ids = False, []
            global_step += 1
            bar.update(1)
            if global_step % cfg.logging_steps == 0 or global_step == total_steps:
                metrics, tokens = acc.reduce(accelerator)
                elapsed = time.perf_counter() - t0
                metrics.update(
                    skipped_steps=guard.skipped,
                    grad_norm=float(grad_norm) if grad_norm is not None else float("nan"),
                    lr=float(schedule.get_last_lr()[0]),
                    tokens_per_second=tokens / max(elapsed, 1e-9),
                    epoch=epoch + 1,
                    step=global_step,
                )
                t0 = time.perf_counter()
                result.history.append(metrics)
                writer.write(metrics)
                accelerator.log(metrics, step=global_step)
                bar.set_postfix(
                    loss=f"{metrics.get('loss', math.nan):.4f}",
                    acc=f"{metrics.get('rewards/accuracies', math.nan):.2f}",
                )
            end_of_epoch = global_step % steps_per_epoch == 0 or global_step == total_steps
            ckpt_info = {**info, "epoch": epoch, "skipped_steps": guard.skipped}
            saved = None
            if (cfg.save_steps and global_step % cfg.save_steps == 0) or end_of_epoch:
                saved = save_checkpoint(accelerator, out_dir, global_step, ckpt_info, cfg.save_total_limit, faults)
                result.checkpoint = saved
            if guard.exhausted():
                saved = saved or save_checkpoint(accelerator, out_dir, global_step, ckpt_info, cfg.save_total_limit)
                bar.close()
                raise NonFiniteStepsError(
                    f"{guard.consecutive} optimizer steps in a row (up to step {global_step}) had non-finite "
                    f"log-probs, losses or gradients (last examples {guard.last_ids[:8]}); stopped. The weights "
                    f"before those steps are saved in {saved}. Lower --lr, check those rows, or raise "
                    f"--max-consecutive-skips (now {cfg.max_consecutive_skips}); resume with --resume auto"
                )
            if preemption.should_stop():
                if saved is None:
                    saved = save_checkpoint(accelerator, out_dir, global_step, ckpt_info, cfg.save_total_limit)
                result.checkpoint = saved
                result.stopped_early, result.stop_reason = True, f"preempted by {preemption.reason()}"
                accelerator.print(
                    f"prefzoo train: {result.stop_reason} at step {global_step}/{total_steps}; checkpoint saved to "
                    f"{saved}. Resume with the same command plus --resume auto (same --output-dir {out_dir})"
                )
                break
            if cfg.stop_after_steps is not None and global_step >= cfg.stop_after_steps:
                result.stopped_early = True
                break
            if global_step >= total_steps:
                done = True
                break
        if result.stopped_early:
            break
        if eval_dl is not None:
            ev = evaluate(loss, policy, reference, eval_dl, accelerator, gather)
            ev.update(epoch=epoch + 1, step=global_step)
            result.evals.append(ev)
            writer.write(ev)
            accelerator.log(ev, step=global_step)
            _say(
                accelerator,
                f"prefzoo train: epoch {epoch + 1}: eval reward accuracy "
                f"{ev['eval/reward_accuracy']:.3f}, eval loss {ev['eval/loss']:.4f}",
            )
        if on_epoch_end is not None:
            on_epoch_end(epoch + 1, accelerator.unwrap_model(policy).lm)
    bar.close()
    result.global_step = global_step
    result.skipped_steps = guard.skipped
    if not result.stopped_early:
        result.final_dir = write_final_model(accelerator, policy, tokenizer, cfg, result)
    result.model = accelerator.unwrap_model(policy).lm
    accelerator.end_training()
    return result


def _precompute(
    cfg: TrainConfig, reference: Reference, accelerator: Any, train_tok: Any, eval_tok: Any, collate: Any, identity: str
) -> tuple[Reference, str]:
    """Reference log-probs of every train and eval pair, computed once (or read from the cache)."""
    import datasets

    both = datasets.concatenate_datasets([d for d in (train_tok, eval_tok) if d is not None])
    dl = accelerator.prepare(
        torch.utils.data.DataLoader(both, batch_size=cfg.per_device_batch_size * 2, collate_fn=collate)
    )
    key = "|".join(
        [
            str(train_tok._fingerprint),
            str(getattr(eval_tok, "_fingerprint", None)),
            identity,
            f"p{cfg.max_prompt_length}c{cfg.max_completion_length}",
            str(cfg.mixed_precision),
        ]
    )
    cache_dir = cfg.ref_cache_dir or str(cache_root() / "ref")
    with accelerator.autocast():
        table, hit = load_or_compute_reference_table(reference, dl, accelerator, key, list(both["id"]), cache_dir)
    if isinstance(reference, FrozenReference):
        del reference.module  # the copy is no longer needed: free its memory
    return PrecomputedReference(table), f"precomputed ({'cache hit' if hit else 'computed'}, {len(table)} pairs)"


def _say(accelerator: Any, line: str) -> None:
    """A line on stdout from the main process, written around the progress bar (stderr) so the two do not mix."""
    from tqdm.auto import tqdm

    if accelerator.is_main_process:
        tqdm.write(line)


def _load_state(accelerator: Any, path: Path) -> None:
    """accelerate's load_state (safetensors weights, ``torch.load(weights_only=True)`` for the rest), errors named."""
    import pickle

    try:
        accelerator.load_state(str(path))
    except (pickle.UnpicklingError, EOFError, RuntimeError, ValueError, OSError) as e:
        first = str(e).strip().splitlines()[0][:300] if str(e).strip() else type(e).__name__
        raise ResumeError(
            f"--resume {path}: the checkpoint's state files cannot be loaded ({type(e).__name__}: {first}); prefzoo "
            "reads only safetensors and torch.load(weights_only=True) data, so pickled objects are refused. Resume "
            "from another checkpoint"
        ) from e


def _deepspeed_nonfinite(cfg: TrainConfig, step: int, ids: list[str]) -> NonFiniteStepsError:
    latest = find_latest_checkpoint(cfg.output_dir)
    return NonFiniteStepsError(
        f"non-finite log-probs or loss in step {step} (examples {ids[:8]}); under DeepSpeed the engine steps inside "
        "backward, so prefzoo cannot skip the step and stops instead. "
        + (f"Resume from {latest} with --resume auto (perhaps with a lower --lr)." if latest else "No checkpoint yet.")
    )
