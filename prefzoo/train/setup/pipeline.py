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
from prefzoo.train.config.sections import (
    CheckpointSection,
    DataSection,
    FastPathSection,
    LossSection,
    ModelSection,
    OnlineSection,
    OptimizationSection,
)
from prefzoo.train.engines import Engine, EngineSettings, build_accelerator, engine_for
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
from prefzoo.train.setup.splits import SplitSettings, load_splits, prepare_datasets
from prefzoo.train.setup.stages import LoadedModel, PolicyParts, Processes, RunData, Tokenized, Wrapped
from prefzoo.train.setup.trackers import resolve_trackers
from prefzoo.types import Need

__all__ = ["setup", "skip_batches_left"]


def setup(cfg: TrainConfig, train_dataset: Any, eval_dataset: Any, loss: Loss) -> Parts:
    """Build a run: every bad setting fails before the model loads, then model, data, reference, optimizer, resume.

    ``loss``: the run's loss, built once from ``cfg`` (:func:`prefzoo.train.setup.loss.build_loss`).  Each step
    takes what it uses and returns a typed result (:mod:`prefzoo.train.setup.stages`).
    """
    settings, ls = EngineSettings.of(cfg), cfg.loss_section  # the engines' and the Accelerator's; the loss's
    engine = _check_options(loss, settings, cfg.model_section, cfg.precompute_ref)
    procs = _start_processes(loss, engine, settings, cfg.checkpointing, ls, cfg.report_to)
    chosen = cfg.was_set("per_device_batch_size") or cfg.was_set("grad_accum")
    opt = _check_resume(loss, procs, cfg.optimization, chosen)
    cfg.per_device_batch_size, cfg.grad_accum = opt.per_device_batch_size, opt.grad_accum  # fitted to a checkpoint
    split = SplitSettings(cfg.data, cfg.evaluation, cfg.seed, cfg.progress)
    data = _read_data(loss, procs, split, ls, cfg.online_section, cfg.skip_batches, train_dataset,
                      eval_dataset)  # fmt: skip
    data = _check_data(loss, procs, data, ls, cfg.fast_paths, cfg.per_device_batch_size, cfg.online)
    model = _load_model(procs, data, cfg.model_section, cfg.data)
    tok = _tokenize(loss, procs, data, model, split, ls, cfg.model, cfg.mixed_precision)
    built = _build_policy(loss, procs, data, model, tok, cfg.model_section, cfg.fast_paths, opt)
    _check_fast_path(cfg.logps_fallback, procs, tok, built)
    wrapped = _shard_and_wrap(opt, procs, data, tok, built, model.tokenizer.pad_token_id)
    timings: dict[str, float] = {}
    gather = make_gather(procs.accelerator)  # the density-ratio fit's and every step's
    density = _density_ratio(ls, opt, procs, data, tok, built, model.tokenizer.pad_token_id, gather, timings)
    reference, ref_kind = _precompute_reference(ls, opt, split, procs, tok, built, model.identity,
                                                timings)  # fmt: skip
    _report(opt, loss, procs, data.plan, ref_kind, wrapped.steps[1])
    acc = procs.accelerator
    info = d.run_info(ls, opt, cfg.model, model.identity, acc.num_processes, procs.engine, loss)
    parts = Parts(
        cfg, loss, procs.engine, acc, model.tokenizer, wrapped.policy, wrapped.trainable, wrapped.optimizer,
        wrapped.schedule, wrapped.train_dl, wrapped.eval_dl, reference, gather, info, tok.stats,
        model.defaults, *wrapped.steps, built.collate, procs.storage, density_ratio=density, timings=timings,
    )  # fmt: skip
    parts.source = (
        EpochBatches(parts) if data.prompts is None else d.online_rounds(cfg.engine, parts, data.prompts, data.judge,
                                                                          data.plan)
    )  # fmt: skip
    d.start_trackers(cfg.report_to, cfg.to_dict(), procs.accelerator)
    return _finish(opt, parts, procs)


def _check_options(loss: Loss, settings: EngineSettings, model: ModelSection, precompute_ref: bool) -> Engine:
    """Settings that cannot work together, or that this loss or engine would ignore: one line each; the engine."""
    if model.model is None:
        raise ConfigError("model is not set: give --model (or neither --model nor --dataset for the default task)")
    check_run_options(loss, precompute_ref, settings.merge_lora, model.model, model.lora)  # what they would ignore
    return engine_for(settings)


def _start_processes(
    loss: Loss, engine: Engine, settings: EngineSettings, ckpt: CheckpointSection, ls: LossSection, report_to: Any
) -> Processes:
    """The Accelerator (the engine's), the output dir's storage, and the checkpoint every rank resumes from."""
    acc = build_accelerator(settings, resolve_trackers(report_to), ckpt.output_dir, engine)
    engine.check(acc.num_processes, acc.device.type == "cpu")
    storage = detect_storage(acc, ckpt.output_dir)
    acc.project_configuration.save_on_each_node = not storage.shared  # each node's disk: its state
    if not storage.shared:
        engine.use_node_local_storage(acc)
    path, info = resume_point(ckpt, ls, acc, storage, loss)
    return Processes(engine, acc, storage, path, info)


def _check_resume(loss: Loss, procs: Processes, opt: OptimizationSection, chosen: bool) -> OptimizationSection:
    """The run's optimization settings, their batch fitted to the checkpoint resumed unless ``chosen`` (a flag
    set it); processes and engine may change where the checkpoint allows: checked here.  Then the seed is set."""
    from accelerate.utils import set_seed

    path, info, acc, engine = procs.resume_path, procs.resume_info, procs.accelerator, procs.engine
    if path is not None:
        n = acc.num_processes
        fitted = fit_batch_to_checkpoint(opt, chosen, info, n, bool(loss.spec.batch_coupled))
        if fitted:
            procs.say(fitted)
        run = {"seed": opt.seed, "batch": [n, opt.per_device_batch_size, opt.grad_accum], **engine.marker(n)}
        check_resumable(path, info, run, bool(loss.spec.batch_coupled))
        # before the model loads: no file of the checkpoint would need full pickle (one line naming it, every rank)
        refuse_pickles(path, acc, not procs.storage.shared, engine.checkpoint_globals())
    set_seed(opt.seed)
    return opt


def _read_data(
    loss: Loss, procs: Processes, split: SplitSettings, ls: LossSection, online: OnlineSection, skip_batches: int,
    train_dataset: Any, eval_dataset: Any,
) -> RunData:
    """The data's splits and the shape the loss trains on (on-policy: prompts, each round's samples as lists)."""
    with procs.accelerator.main_process_first():  # the data's shape is checked against the loss before any model loads
        train_dataset, eval_dataset = load_splits(split, train_dataset, eval_dataset)
    if online.online:  # the data is prompts; each round's samples are lists (see prefzoo.train.online)
        from prefzoo.train.online import online_prompts

        d.check_online_options(ls.precompute_ref, skip_batches)
        prompts = online_prompts(train_dataset)
        plan = online_plan(loss, ls.pairs_from_lists, ls.unpair)
        eval_dataset, eval_plan = d.online_eval(loss, ls, eval_dataset, procs.accelerator)
        return RunData(None, eval_dataset, plan, prompts, eval_plan, d.online_judge(online))
    return RunData(train_dataset, eval_dataset, plan_shape(loss, data_shape(train_dataset), ls.pairs_from_lists,
                                                           ls.unpair))  # fmt: skip


def _check_data(
    loss: Loss, procs: Processes, data: RunData, ls: LossSection, fast: FastPathSection, per_device_batch_size: int,
    online: bool,
) -> RunData:
    """Options the data's shape cannot take, and the density-ratio options: one line each, before any model loads;
    the data with a resumed run's density-ratio classifier."""
    d.check_shape_options(fast, ls, per_device_batch_size, data.plan)
    check_density_ratio(ls, loss, online)
    # a resumed --density-ratio run loads its classifier, never refits
    data = dataclasses.replace(data, saved_classifier=read_density_ratio(ls, procs.resume_path))
    if data.plan.batches != PAIRS or data.plan.data != PAIRS:  # plain pair runs print what they always printed
        procs.say(data.plan.describe())
    return data


def _load_model(procs: Processes, data: RunData, model: ModelSection, data_sec: DataSection) -> LoadedModel:
    """Tokenizer (its chat template rendered once: a broken one fails before the model loads), then the model."""
    note = remote_code_note(model.model or "", model.trust_remote_code)  # before the tokenizer: it may run code too
    if note:
        procs.say(note)
    tokenizer, template = m.tokenizer_and_template(model, data_sec.chat_template, data.train_dataset, data.prompts)
    lm, tokenizer, has_adapter, identity = m.load_model(
        model, procs.accelerator, procs.resume_path, procs.resume_info, tokenizer
    )
    defaults = apply_model_defaults(  # dropout off unless --keep-dropout; limits fit
        lm, tokenizer, data_sec.max_prompt_length, data_sec.max_completion_length, keep_dropout=model.keep_dropout
    )
    for line in defaults.lines():
        procs.say(line)
    return LoadedModel(tokenizer, template, lm, has_adapter, identity, defaults)


def _tokenize(
    loss: Loss, procs: Processes, data: RunData, model: LoadedModel, split: SplitSettings, ls: LossSection,
    model_name: str | None, mixed_precision: str,
) -> Tokenized:
    """The tokenized splits (on-policy: held-out preference data only), described, and agreed on by every rank."""
    acc, tokenizer = procs.accelerator, model.tokenizer
    train_tok: Any = None
    eval_tok: Any = None
    stats: dict[str, Any] = {}
    with acc.main_process_first():
        if data.prompts is None:
            train_tok, eval_tok, stats = prepare_datasets(
                split, tokenizer, data.train_dataset, data.eval_dataset, model.defaults.limits, data.plan
            )
        elif data.eval_dataset is not None:  # held-out preference data, in the shape this loss takes it
            whole = dataclasses.replace(split, evaluation=dataclasses.replace(split.evaluation, eval_fraction=0.0))
            eval_tok, _, held = prepare_datasets(
                whole, tokenizer, data.eval_dataset, None, model.defaults.limits, data.eval_plan
            )
            stats["eval"] = held["train"]
    m.check_token_ids(model_name, model.lm, tokenizer, train_tok, eval_tok)
    for line in describe_data(tokenizer, train_tok, stats, model.template) if train_tok is not None else ():
        procs.say(line)
    d.print_data_stats(acc, stats, d.unit(data.plan))
    agreed = train_tok if data.prompts is None else d.as_dataset(data.prompts)
    d.agree_on_identity(ls, split.data, model_name, mixed_precision, acc, procs.storage, agreed, eval_tok,
                        model.identity)  # fmt: skip
    if Need.SCORES in loss.needs and (train_tok is None or "score_chosen" not in train_tok.column_names):
        raise ConfigError(
            f"loss {loss.name!r} needs each pair's scores (ODPO's offset), but the data has no score_chosen and "
            "score_rejected columns; add them (UltraFeedback's names) or drop the modifier"
        )
    return Tokenized(train_tok, eval_tok, stats)


def _build_policy(
    loss: Loss, procs: Processes, data: RunData, model: LoadedModel, tok: Tokenized, model_sec: ModelSection,
    fast_sec: FastPathSection, opt: OptimizationSection,
) -> PolicyParts:
    """A LoRA adapter, the lean modules and the log-prob fast paths this run uses; then the policy (log-probs of
    completions), its reference, and the collator of the batches' shape."""
    lm = model.lm
    if model_sec.lora and not model.has_adapter:
        lm = apply_lora(lm, model_sec.lora_r, model_sec.lora_alpha, model_sec.lora_dropout,
                        model_sec.lora_target_modules)  # fmt: skip
    m.lean_modules(fast_sec, lm, procs.accelerator)
    fast = m.fast_paths(fast_sec, opt, loss, data.plan, tok.train, lm, procs.engine)
    procs.say(fast.line())
    policy = PolicyLogps(lm, fast_sec.logp_chunk_size, fused_head=fast_sec.fused_head, router_aux=True,
                         packing=fast.packing)  # fmt: skip
    policy.train()
    reference, ref_kind = build_reference(loss, policy, model_sec.lora, model.has_adapter, procs.accelerator,
                                          procs.engine)  # fmt: skip
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
    ls: LossSection, opt: OptimizationSection, procs: Processes, data: RunData, tok: Tokenized, built: PolicyParts,
    pad_token_id: int, gather: Any, timings: dict[str, float],
) -> Any:
    """BCO's density-ratio weights: the resumed run's classifier, or one fitted once on the reference's embeddings
    (None without --density-ratio)."""
    if data.saved_classifier is not None:  # the classifier of the run this one resumes (saved in its checkpoint)
        density = DensityRatioWeights(reference_embedding(built.reference), data.saved_classifier,
                                      ls.min_density_ratio, ls.max_density_ratio)  # fmt: skip
        procs.say(f"density-ratio classifier loaded from {procs.resume_path}")
        return density
    if not ls.density_ratio:
        return None
    t0 = time.perf_counter()
    density = fit_density_ratio(ls, opt, built.reference, tok.train, pad_token_id, procs.accelerator, gather)
    timings["density_ratio"] = time.perf_counter() - t0
    return density


def _precompute_reference(
    ls: LossSection, opt: OptimizationSection, split: SplitSettings, procs: Processes, tok: Tokenized,
    built: PolicyParts, identity: str, timings: dict[str, float],
) -> tuple[Any, str]:
    """``--precompute-ref``: the reference's log-probs computed once (or read from the cache), then a table; else the
    reference as built."""
    if built.reference is None or not ls.precompute_ref:
        return built.reference, built.ref_kind
    t0 = time.perf_counter()
    reference, ref_kind = precompute_reference(
        built.reference, procs.accelerator, tok.train, tok.eval, built.collate, identity,
        batch_size=opt.per_device_batch_size, max_prompt_length=split.data.max_prompt_length,
        max_completion_length=split.data.max_completion_length, mixed_precision=opt.mixed_precision,
        cache_dir=ls.ref_cache_dir, progress=split.progress and is_rank_zero(),
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


def _finish(opt: OptimizationSection, parts: Parts, procs: Processes) -> Parts:
    """The Parts completed (their data source built, the trackers started): the resumed checkpoint's state, the
    skip record."""
    if procs.resume_path is not None:
        _resume(parts, procs.resume_path, procs.resume_info)
        parts.source.load(procs.resume_path)
    parts.skip_record = d.skip_record(opt, procs.resume_info, parts.start_step)
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
