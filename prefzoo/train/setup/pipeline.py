"""The setup phase of a run as a pipeline of small steps, each taking what it uses and returning a typed result
(:mod:`prefzoo.train.setup.stages`) that later steps take.

check options → start the processes (engine, accelerator, storage, resume point) → read the data and plan its
shape → tokenizer and model → tokenize → adapt the model (LoRA, lean modules) → policy and reference → check the
log-prob fast path → shard and wrap (engine) → density-ratio weights → precomputed reference → resume → the parts.
Every bad setting fails in the first steps, before any model loads.
"""

from __future__ import annotations

import dataclasses
import math
import time
from pathlib import Path
from typing import Any

from prefzoo._dist import is_rank_zero
from prefzoo.data.preview import describe_data
from prefzoo.data.shapes import PAIRS, data_shape
from prefzoo.model import (
    PolicyLogps,
    apply_lora,
    apply_model_defaults,
    first_pairs,
    remote_code_note,
    run_self_check,
)
from prefzoo.scoring import build_reference, make_gather, precompute_reference
from prefzoo.spec import Loss
from prefzoo.train.checkpoint import (
    check_resumable,
    detect_storage,
    fit_batch_to_checkpoint,
    load_resumed_state,
    refuse_pickles,
    resume_point,
)
from prefzoo.train.config import ConfigError, TrainConfig
from prefzoo.train.config.sections import OptimizationSection
from prefzoo.train.engines import Engine, build_accelerator, engine_for
from prefzoo.train.loop.source import EpochBatches
from prefzoo.train.setup import data as d
from prefzoo.train.setup import model as m
from prefzoo.train.setup.density_ratio import (
    DensityRatioWeights,
    check_density_ratio,
    fit_density_ratio,
    read_density_ratio,
    reference_embedding,
)
from prefzoo.train.setup.optimizer import build_optimizer, build_schedule
from prefzoo.train.setup.parts import Parts
from prefzoo.train.setup.preflight import check_run_options
from prefzoo.train.setup.shape_plan import ShapePlan, online_plan, plan_shape
from prefzoo.train.setup.splits import load_splits, prepare_datasets
from prefzoo.train.setup.stages import LoadedModel, PolicyParts, Processes, RunData, Tokenized, Wrapped
from prefzoo.train.setup.trackers import resolve_trackers
from prefzoo.types import Need

__all__ = ["setup", "skip_batches_left"]


def setup(cfg: TrainConfig, train_dataset: Any, eval_dataset: Any, loss: Loss) -> Parts:
    """Build a run: every bad setting fails before the model loads, then model, data, reference, optimizer, resume.

    ``loss``: the run's loss, built once from ``cfg`` (:func:`prefzoo.train.setup.loss.build_loss`).  Each step
    takes what it uses and returns a typed result (:mod:`prefzoo.train.setup.stages`).
    """
    engine = _check_options(cfg, loss)
    procs = _start_processes(cfg, loss, engine)
    data = _read_data(cfg, loss, procs, train_dataset, eval_dataset)
    model = _load_model(cfg, procs, data)
    tok = _tokenize(cfg, loss, procs, data, model)
    built = _build_policy(cfg, loss, procs, data, model, tok)
    _check_fast_path(cfg.logps_fallback, procs, tok, built)
    wrapped = _shard_and_wrap(cfg.optimization, procs, data, tok, built, model.tokenizer.pad_token_id)
    timings: dict[str, float] = {}
    density = _density_ratio(cfg, procs, data, tok, built, model.tokenizer.pad_token_id, timings)
    reference, ref_kind = _precompute_reference(cfg, procs, tok, built, model.identity, timings)
    _report(cfg.optimization, loss, procs, data.plan, ref_kind, wrapped.steps[1])
    acc = procs.accelerator
    info = d.run_info(cfg, model.identity, acc.num_processes, procs.engine, loss)  # every checkpoint marker's
    parts = Parts(
        cfg, loss, procs.engine, acc, model.tokenizer, wrapped.policy, wrapped.trainable, wrapped.optimizer,
        wrapped.schedule, wrapped.train_dl, wrapped.eval_dl, reference, make_gather(acc), info, tok.stats,
        model.defaults, *wrapped.steps, built.collate, procs.storage, density_ratio=density, timings=timings,
    )  # fmt: skip
    return _finish(cfg, parts, procs, data)


def _check_options(cfg: TrainConfig, loss: Loss) -> Engine:
    """Settings that cannot work together, or that this loss or engine would ignore: one line each; the engine."""
    if cfg.model is None:
        raise ConfigError("model is not set: give --model (or neither --model nor --dataset for the default task)")
    check_run_options(loss, cfg)  # options this loss or model would ignore
    return engine_for(cfg)


def _start_processes(cfg: TrainConfig, loss: Loss, engine: Engine) -> Processes:
    """The Accelerator (the engine's), the output dir's storage, and the checkpoint every rank resumes from."""
    from accelerate.utils import set_seed

    acc = build_accelerator(cfg, resolve_trackers(cfg.report_to), cfg.output_dir, engine)
    engine.check(acc.num_processes, acc.device.type == "cpu")
    storage = detect_storage(acc, cfg.output_dir)
    acc.project_configuration.save_on_each_node = not storage.shared  # each node's disk: its state
    if not storage.shared:
        engine.use_node_local_storage(acc)
    path, info = resume_point(cfg, acc, storage, loss)
    procs = Processes(engine, acc, storage, path, info)
    if path is not None:  # processes and engine may change where the checkpoint allows: checked here
        n = acc.num_processes
        fitted = fit_batch_to_checkpoint(cfg, info, n, bool(loss.spec.batch_coupled))
        if fitted:
            procs.say(fitted)
        run = {"seed": cfg.seed, "batch": [n, cfg.per_device_batch_size, cfg.grad_accum], **engine.marker(n)}
        check_resumable(path, info, run, bool(loss.spec.batch_coupled))
        # before the model loads: no file of the checkpoint would need full pickle (one line naming it, every rank)
        refuse_pickles(path, acc, not storage.shared, engine.checkpoint_globals())
    set_seed(cfg.seed)
    return procs


def _read_data(cfg: TrainConfig, loss: Loss, procs: Processes, train_dataset: Any, eval_dataset: Any) -> RunData:
    """The data's splits and the shape the loss trains on (on-policy: prompts, each round's samples as lists)."""
    with procs.accelerator.main_process_first():  # the data's shape is checked against the loss before any model loads
        train_dataset, eval_dataset = load_splits(cfg, train_dataset, eval_dataset)
    if cfg.online:  # the data is prompts; each round's samples are lists (see prefzoo.train.online)
        from prefzoo.train.online import online_prompts

        d.check_online_options(cfg.precompute_ref, cfg.skip_batches)
        prompts = online_prompts(train_dataset)
        plan = online_plan(loss, cfg.pairs_from_lists, cfg.unpair)
        eval_dataset, eval_plan = d.online_eval(loss, cfg.loss_section, eval_dataset, procs.accelerator)
        data = RunData(None, eval_dataset, plan, prompts, eval_plan, d.online_judge(cfg.online_section))
    else:
        data = RunData(train_dataset, eval_dataset, plan_shape(loss, data_shape(train_dataset), cfg.pairs_from_lists,
                                                               cfg.unpair))  # fmt: skip
    d.check_shape_options(cfg, data.plan)
    check_density_ratio(cfg.loss_section, loss, cfg.online)
    # a resumed --density-ratio run loads its classifier, never refits
    data = dataclasses.replace(data, saved_classifier=read_density_ratio(cfg.loss_section, procs.resume_path))
    if data.plan.batches != PAIRS or data.plan.data != PAIRS:  # plain pair runs print what they always printed
        procs.say(data.plan.describe())
    return data


def _load_model(cfg: TrainConfig, procs: Processes, data: RunData) -> LoadedModel:
    """Tokenizer (its chat template rendered once: a broken one fails before the model loads), then the model."""
    note = remote_code_note(cfg.model or "", cfg.trust_remote_code)  # before the tokenizer: it may run code too
    if note:
        procs.say(note)
    tokenizer, template = m.tokenizer_and_template(cfg.model_section, cfg.chat_template, data.train_dataset,
                                                   data.prompts)  # fmt: skip
    lm, tokenizer, has_adapter, identity = m.load_model(
        cfg.model_section, procs.accelerator, procs.resume_path, procs.resume_info, tokenizer
    )
    defaults = apply_model_defaults(cfg, lm, tokenizer)  # dropout off unless --keep-dropout; limits fit
    for line in defaults.lines():
        procs.say(line)
    return LoadedModel(tokenizer, template, lm, has_adapter, identity, defaults)


def _tokenize(cfg: TrainConfig, loss: Loss, procs: Processes, data: RunData, model: LoadedModel) -> Tokenized:
    """The tokenized splits (on-policy: held-out preference data only), described, and agreed on by every rank."""
    acc, tokenizer = procs.accelerator, model.tokenizer
    train_tok: Any = None
    eval_tok: Any = None
    stats: dict[str, Any] = {}
    with acc.main_process_first():
        if data.prompts is None:
            train_tok, eval_tok, stats = prepare_datasets(
                cfg, tokenizer, data.train_dataset, data.eval_dataset, model.defaults.limits, data.plan
            )
        elif data.eval_dataset is not None:  # held-out preference data, in the shape this loss takes it
            whole = dataclasses.replace(cfg, eval_fraction=0.0)
            eval_tok, _, split = prepare_datasets(
                whole, tokenizer, data.eval_dataset, None, model.defaults.limits, data.eval_plan
            )
            stats["eval"] = split["train"]
    m.check_token_ids(cfg.model, model.lm, tokenizer, train_tok, eval_tok)
    for line in describe_data(tokenizer, train_tok, stats, model.template) if train_tok is not None else ():
        procs.say(line)
    d.print_data_stats(acc, stats, d.unit(data.plan))
    agreed = train_tok if data.prompts is None else d.as_dataset(data.prompts)
    d.agree_on_identity(cfg, acc, procs.storage, agreed, eval_tok, model.identity)
    if Need.SCORES in loss.needs and (train_tok is None or "score_chosen" not in train_tok.column_names):
        raise ConfigError(
            f"loss {loss.name!r} needs each pair's scores (ODPO's offset), but the data has no score_chosen and "
            "score_rejected columns; add them (UltraFeedback's names) or drop the modifier"
        )
    return Tokenized(train_tok, eval_tok, stats)


def _build_policy(
    cfg: TrainConfig, loss: Loss, procs: Processes, data: RunData, model: LoadedModel, tok: Tokenized
) -> PolicyParts:
    """A LoRA adapter, the lean modules and the log-prob fast paths this run uses; then the policy (log-probs of
    completions), its reference, and the collator of the batches' shape."""
    lm = model.lm
    if cfg.lora and not model.has_adapter:
        lm = apply_lora(lm, cfg.lora_r, cfg.lora_alpha, cfg.lora_dropout, cfg.lora_target_modules)
    m.lean_modules(cfg.fast_paths, lm, procs.accelerator)
    fast = m.fast_paths(cfg, loss, data.plan, tok.train, lm, procs.engine)
    procs.say(fast.line())
    policy = PolicyLogps(lm, cfg.logp_chunk_size, fused_head=cfg.fused_head, router_aux=True, packing=fast.packing)
    policy.train()
    reference, ref_kind = build_reference(loss, policy, cfg.lora, model.has_adapter, procs.accelerator, procs.engine)
    return PolicyParts(fast, policy, reference, ref_kind, d.collator(data.plan, model.tokenizer.pad_token_id,
                                                                     fast.share_prompt))  # fmt: skip


def _check_fast_path(fallback: bool, procs: Processes, tok: Tokenized, built: PolicyParts) -> None:
    """The log-prob fast path against the model's own forward on the first pairs, on the whole model before the
    engine wraps or shards it (an on-policy run checks on its first samples instead: prefzoo.train.online)."""
    if tok.train is None or not procs.engine.self_check:
        return
    device = procs.accelerator.device
    if any(p.device != device for p in built.policy.parameters()):  # what accelerate's prepare would do anyway
        built.policy.to(device)
    with procs.accelerator.autocast():
        check_batch = first_pairs(tok.train, built.collate, device)
        run_self_check(built.policy, built.reference, check_batch, fallback, procs.accelerator.print)


def _shard_and_wrap(
    opt: OptimizationSection, procs: Processes, data: RunData, tok: Tokenized, built: PolicyParts, pad_token_id: int
) -> Wrapped:
    """The engine shards, the optimizer and schedule are built, and the engine wraps what it owns.  ``opt`` is read
    after :func:`_start_processes`, which may fit the batch to the checkpoint resumed."""
    acc = procs.accelerator
    line = procs.engine.shard(acc, built.policy, built.reference)
    if line:
        procs.say(line)
    trainable = [p for p in built.policy.parameters() if p.requires_grad]  # after sharding: it may replace them
    optimizer = build_optimizer(trainable, opt)
    train_dl, eval_dl = d.dataloaders(opt, built.collate, tok.train, tok.eval, built.fast.group_by_length,
                                      data.eval_plan, pad_token_id)  # fmt: skip
    examples = len(tok.train) if data.prompts is None else len(data.prompts)
    steps = d.step_counts(opt, examples, acc.num_processes)
    schedule = build_schedule(optimizer, steps[1], opt.warmup_ratio, opt.lr_scheduler_type, opt.warmup_steps)
    policy, optimizer, train_dl, schedule = procs.engine.prepare(acc, built.policy, optimizer, train_dl, schedule)
    if eval_dl is not None:
        eval_dl = acc.prepare(eval_dl)
    return Wrapped(policy, trainable, optimizer, schedule, train_dl, eval_dl, steps)


def _density_ratio(
    cfg: TrainConfig, procs: Processes, data: RunData, tok: Tokenized, built: PolicyParts, pad_token_id: int,
    timings: dict[str, float],
) -> Any:
    """BCO's density-ratio weights: the resumed run's classifier, or one fitted once on the reference's embeddings
    (None without --density-ratio)."""
    if data.saved_classifier is not None:  # the classifier of the run this one resumes (saved in its checkpoint)
        density = DensityRatioWeights(reference_embedding(built.reference), data.saved_classifier,
                                      cfg.min_density_ratio, cfg.max_density_ratio)  # fmt: skip
        procs.say(f"density-ratio classifier loaded from {procs.resume_path}")
        return density
    if not cfg.density_ratio:
        return None
    t0 = time.perf_counter()
    density = fit_density_ratio(cfg, built.reference, tok.train, pad_token_id, procs.accelerator,
                                make_gather(procs.accelerator))  # fmt: skip
    timings["density_ratio"] = time.perf_counter() - t0
    return density


def _precompute_reference(
    cfg: TrainConfig, procs: Processes, tok: Tokenized, built: PolicyParts, identity: str, timings: dict[str, float]
) -> tuple[Any, str]:
    """``--precompute-ref``: the reference's log-probs computed once (or read from the cache), then a table; else the
    reference as built."""
    if built.reference is None or not cfg.precompute_ref:
        return built.reference, built.ref_kind
    t0 = time.perf_counter()
    reference, ref_kind = precompute_reference(
        built.reference, procs.accelerator, tok.train, tok.eval, built.collate, identity,
        batch_size=cfg.per_device_batch_size, max_prompt_length=cfg.max_prompt_length,
        max_completion_length=cfg.max_completion_length, mixed_precision=cfg.mixed_precision,
        cache_dir=cfg.ref_cache_dir, progress=cfg.progress and is_rank_zero(),
    )
    timings["reference"] = time.perf_counter() - t0
    return reference, ref_kind


def _report(
    cfg: OptimizationSection, loss: Loss, procs: Processes, plan: ShapePlan, ref_kind: str, total_steps: int
) -> None:
    n, unit = procs.accelerator.num_processes, d.unit(plan)
    procs.say(
        f"loss {loss!r}; reference: {ref_kind}; {n} process(es) × {cfg.per_device_batch_size} {unit} × "
        f"{cfg.grad_accum} accumulation = {n * cfg.per_device_batch_size * cfg.grad_accum} {unit} per step; "
        f"{total_steps} steps"
    )


def _finish(cfg: TrainConfig, parts: Parts, procs: Processes, data: RunData) -> Parts:
    """The Parts completed: the data source, the trackers, the resumed checkpoint's state, the skip record."""
    parts.source = (
        EpochBatches(parts) if data.prompts is None else d.online_rounds(cfg, parts, data.prompts, data.judge,
                                                                          data.plan)
    )  # fmt: skip
    d.start_trackers(cfg.report_to, cfg.to_dict(), procs.accelerator)
    if procs.resume_path is not None:
        _resume(parts, procs.resume_path, procs.resume_info)
        parts.source.load(procs.resume_path)
    parts.skip_record = d.skip_record(cfg.optimization, procs.resume_info, parts.start_step)
    return parts


def _resume(parts: Parts, path: Path, saved: dict[str, Any]) -> None:
    """Load the checkpoint's state (which engine and processes may resume it was checked before the model loaded)."""
    # a stateful loss's state (e.g. BCO's running reward mean) is loss_state.safetensors in every checkpoint
    batch = saved.get("batch")  # [processes, per-device batch, accumulation] of the run that wrote it
    written_by = int(batch[0]) if isinstance(batch, list) and batch else None
    load_resumed_state(parts.accelerator, parts.engine, parts.policy, parts.optimizer, path, loss=parts.loss,
                       saved_processes=written_by)  # fmt: skip
    parts.start_step = int(saved["step"])
    parts.resume_path = path
    parts.start_skipped = int(saved.get("skipped_steps", 0))
    parts.accelerator.print(f"prefzoo train: resumed from {path} at step {parts.start_step}")


def skip_batches_left(cfg: OptimizationSection, start_step: int, record: list[int] | None, say: Any) -> int:
    """Micro-batches ``--skip-batches`` passes over from ``start_step`` (0 when the checkpoint says it was done)."""
    if not cfg.skip_batches or record is None:
        return 0
    if record[0] != start_step:
        say(f"prefzoo train: --skip-batches {cfg.skip_batches} was applied at step {record[0]}; not skipping again")
        return 0
    steps = math.ceil(cfg.skip_batches / cfg.grad_accum)
    say(
        f"prefzoo train: --skip-batches {cfg.skip_batches}: the micro-batches of steps {start_step + 1}.."
        f"{start_step + steps} are passed over (counted as skipped steps; no update, no scheduler step)"
    )
    return steps * cfg.grad_accum
