"""The setup phase of a run as a pipeline of small steps, each reading what earlier steps built and adding its own.

check options → start the processes (engine, accelerator, storage, resume point) → read the data and plan its
shape → tokenizer and model → tokenize → adapt the model (LoRA, lean modules) → policy and reference → check the
log-prob fast path → shard and wrap (engine) → density-ratio weights → precomputed reference → resume → the parts.
Every bad setting fails in the first steps, before any model loads.
"""

from __future__ import annotations

import dataclasses
import math
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

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
    Storage,
    check_resumable,
    detect_storage,
    fit_batch_to_checkpoint,
    load_resumed_state,
    refuse_pickles,
    resume_point,
)
from prefzoo.train.config import ConfigError, TrainConfig
from prefzoo.train.data import load_splits, prepare_datasets
from prefzoo.train.density_ratio import (
    DensityRatioWeights,
    check_density_ratio,
    fit_density_ratio,
    read_density_ratio,
    reference_embedding,
)
from prefzoo.train.engines import Engine, build_accelerator, engine_for
from prefzoo.train.modifiers import build_loss
from prefzoo.train.optim import build_optimizer, build_schedule
from prefzoo.train.preflight import check_run_options
from prefzoo.train.setup import data as d
from prefzoo.train.setup import model as m
from prefzoo.train.setup.parts import Parts
from prefzoo.train.shapes import ShapePlan, online_plan, plan_shape
from prefzoo.train.source import EpochBatches
from prefzoo.train.trackers import resolve_trackers
from prefzoo.types import Need

__all__ = ["setup", "skip_batches_left"]


@dataclass
class _Build:
    """What the steps have built so far (each step reads earlier fields and fills its own)."""

    cfg: TrainConfig
    train_dataset: Any
    eval_dataset: Any
    loss: Loss
    engine: Engine = None  # type: ignore[assignment]
    accelerator: Any = None
    storage: Storage = None  # type: ignore[assignment]
    resume_path: Path | None = None
    resume_info: dict[str, Any] = field(default_factory=dict)
    plan: ShapePlan = None  # type: ignore[assignment]
    prompts: list[Any] | None = None  # an on-policy run's prompts (its data is generated)
    eval_plan: ShapePlan | None = None
    judge: Any = None
    saved_classifier: Any = None
    tokenizer: Any = None
    template: str = ""
    lm: Any = None
    has_adapter: bool = False
    identity: str = ""
    defaults: Any = None
    train_tok: Any = None
    eval_tok: Any = None
    data_stats: dict[str, Any] = field(default_factory=dict)
    fast: Any = None
    policy: Any = None
    reference: Any = None
    ref_kind: str = ""
    collate: Any = None
    trainable: list[Any] = field(default_factory=list)
    optimizer: Any = None
    schedule: Any = None
    train_dl: Any = None
    eval_dl: Any = None
    steps: tuple[int, int, int] = (0, 0, 0)  # steps per epoch, total steps, epochs to iterate
    density: Any = None
    timings: dict[str, float] = field(default_factory=dict)

    def say(self, line: str) -> None:
        self.accelerator.print(f"prefzoo train: {line}")


def setup(cfg: TrainConfig, train_dataset: Any, eval_dataset: Any, loss: Loss | None = None) -> Parts:
    """Build a run: every bad setting fails before the model loads, then model, data, reference, optimizer, resume.

    ``loss``: the run's loss built from ``cfg`` (:func:`prefzoo.train.modifiers.build_loss`), built here if None.
    """
    b = _Build(cfg, train_dataset, eval_dataset, loss if loss is not None else build_loss(cfg))
    for step in _STEPS:
        step(b)
    return _parts(b)


def _check_options(b: _Build) -> None:
    """Settings that cannot work together, or that this loss or engine would ignore: one line each."""
    cfg = b.cfg
    if cfg.model is None:
        raise ConfigError("model is not set: give --model (or neither --model nor --dataset for the default task)")
    check_run_options(b.loss, cfg)  # options this loss or model would ignore
    b.engine = engine_for(cfg)


def _start_processes(b: _Build) -> None:
    """The Accelerator (the engine's), the output dir's storage, and the checkpoint every rank resumes from."""
    from accelerate.utils import set_seed

    cfg = b.cfg
    b.accelerator = build_accelerator(cfg, resolve_trackers(cfg.report_to), cfg.output_dir, b.engine)
    b.engine.check(b.accelerator.num_processes, b.accelerator.device.type == "cpu")
    b.storage = detect_storage(b.accelerator, cfg.output_dir)
    b.accelerator.project_configuration.save_on_each_node = not b.storage.shared  # each node's disk: its state
    if not b.storage.shared:
        b.engine.use_node_local_storage(b.accelerator)
    b.resume_path, b.resume_info = resume_point(cfg, b.accelerator, b.storage, b.loss)
    if b.resume_path is not None:  # processes and engine may change where the checkpoint allows: checked here
        n = b.accelerator.num_processes
        fitted = fit_batch_to_checkpoint(cfg, b.resume_info, n, bool(b.loss.spec.batch_coupled))
        if fitted:
            b.say(fitted)
        run = {"seed": cfg.seed, "batch": [n, cfg.per_device_batch_size, cfg.grad_accum], **b.engine.marker(n)}
        check_resumable(b.resume_path, b.resume_info, run, bool(b.loss.spec.batch_coupled))
        # before the model loads: no file of the checkpoint would need full pickle (one line naming it, every rank)
        refuse_pickles(b.resume_path, b.accelerator, not b.storage.shared, b.engine.checkpoint_globals())
    set_seed(cfg.seed)


def _read_data(b: _Build) -> None:
    """The data's splits and the shape the loss trains on (on-policy: prompts, each round's samples as lists)."""
    cfg, loss = b.cfg, b.loss
    with b.accelerator.main_process_first():  # the data's shape is checked against the loss before any model loads
        b.train_dataset, b.eval_dataset = load_splits(cfg, b.train_dataset, b.eval_dataset)
    if cfg.online:  # the data is prompts; each round's samples are lists (see prefzoo.train.online)
        from prefzoo.train.online import online_prompts

        d.check_online_options(cfg)
        b.prompts = online_prompts(b.train_dataset)
        b.plan = online_plan(loss, cfg.pairs_from_lists, cfg.unpair)
        b.eval_dataset, b.eval_plan = d.online_eval(loss, cfg, b.eval_dataset, b.accelerator)
        b.train_dataset, b.judge = None, d.online_judge(cfg)
    else:
        b.plan = plan_shape(loss, data_shape(b.train_dataset), cfg.pairs_from_lists, cfg.unpair)
    d.check_shape_options(cfg, b.plan)
    check_density_ratio(cfg, loss)
    b.saved_classifier = read_density_ratio(cfg, b.resume_path)  # a resumed --density-ratio run loads, never refits
    if b.plan.batches != PAIRS or b.plan.data != PAIRS:  # plain pair runs print what they always printed
        b.say(b.plan.describe())


def _load_model(b: _Build) -> None:
    """Tokenizer (its chat template rendered once: a broken one fails before the model loads), then the model."""
    note = remote_code_note(b.cfg.model or "", b.cfg.trust_remote_code)  # before the tokenizer: it may run code too
    if note:
        b.say(note)
    b.tokenizer, b.template = m.tokenizer_and_template(b.cfg, b.train_dataset, b.prompts)
    b.lm, b.tokenizer, b.has_adapter, b.identity = m.load_model(
        b.cfg, b.accelerator, b.resume_path, b.resume_info, b.tokenizer
    )
    b.defaults = apply_model_defaults(b.cfg, b.lm, b.tokenizer)  # dropout off unless --keep-dropout; limits fit
    for line in b.defaults.lines():
        b.say(line)


def _tokenize(b: _Build) -> None:
    """The tokenized splits (on-policy: held-out preference data only), described, and agreed on by every rank."""
    cfg = b.cfg
    with b.accelerator.main_process_first():
        if b.prompts is None:
            b.train_tok, b.eval_tok, b.data_stats = prepare_datasets(
                cfg, b.tokenizer, b.train_dataset, b.eval_dataset, b.defaults.limits, b.plan
            )
        elif b.eval_dataset is not None:  # held-out preference data, in the shape this loss takes it
            whole = dataclasses.replace(cfg, eval_fraction=0.0)
            b.eval_tok, _, stats = prepare_datasets(
                whole, b.tokenizer, b.eval_dataset, None, b.defaults.limits, b.eval_plan
            )
            b.data_stats["eval"] = stats["train"]
    m.check_token_ids(cfg, b.lm, b.tokenizer, b.train_tok, b.eval_tok)
    for line in describe_data(b.tokenizer, b.train_tok, b.data_stats, b.template) if b.train_tok is not None else ():
        b.say(line)
    d.print_data_stats(b.accelerator, b.data_stats, d.unit(b.plan))
    agreed = b.train_tok if b.prompts is None else d.as_dataset(b.prompts)
    d.agree_on_identity(cfg, b.accelerator, b.storage, agreed, b.eval_tok, b.identity)
    if Need.SCORES in b.loss.needs and (b.train_tok is None or "score_chosen" not in b.train_tok.column_names):
        raise ConfigError(
            f"loss {b.loss.name!r} needs each pair's scores (ODPO's offset), but the data has no score_chosen and "
            "score_rejected columns; add them (UltraFeedback's names) or drop the modifier"
        )


def _adapt_model(b: _Build) -> None:
    """A LoRA adapter, the lean modules, and the log-prob fast paths this run uses."""
    cfg = b.cfg
    if cfg.lora and not b.has_adapter:
        b.lm = apply_lora(b.lm, cfg.lora_r, cfg.lora_alpha, cfg.lora_dropout, cfg.lora_target_modules)
    m.lean_modules(cfg, b.lm, b.accelerator)
    b.fast = m.fast_paths(cfg, b.loss, b.plan, b.train_tok, b.lm, b.engine)
    b.say(b.fast.line())


def _build_policy(b: _Build) -> None:
    """The policy (log-probs of completions), its reference, and the collator of the batches' shape."""
    cfg = b.cfg
    b.policy = PolicyLogps(
        b.lm, cfg.logp_chunk_size, fused_head=cfg.fused_head, router_aux=True, packing=b.fast.packing
    )
    b.policy.train()
    b.reference, b.ref_kind = build_reference(b.loss, b.policy, cfg.lora, b.has_adapter, b.accelerator, b.engine)
    b.collate = d.collator(b.plan, b.tokenizer.pad_token_id, b.fast.share_prompt)


def _check_fast_path(b: _Build) -> None:
    """The log-prob fast path against the model's own forward on the first pairs, on the whole model before the
    engine wraps or shards it (an on-policy run checks on its first samples instead: prefzoo.train.online)."""
    if b.train_tok is None or not b.engine.self_check:
        return
    device = b.accelerator.device
    if any(p.device != device for p in b.policy.parameters()):  # what accelerate's prepare would do anyway
        b.policy.to(device)
    with b.accelerator.autocast():
        check_batch = first_pairs(b.train_tok, b.collate, device)
        run_self_check(b.policy, b.reference, check_batch, b.cfg.logps_fallback, b.accelerator.print)


def _shard_and_wrap(b: _Build) -> None:
    """The engine shards, the optimizer and schedule are built, and the engine wraps what it owns."""
    cfg, acc = b.cfg, b.accelerator
    line = b.engine.shard(acc, b.policy, b.reference)
    if line:
        b.say(line)
    b.trainable = [p for p in b.policy.parameters() if p.requires_grad]  # after sharding: it may replace them
    betas = (float(cfg.adam_betas[0]), float(cfg.adam_betas[1]))
    b.optimizer = build_optimizer(b.trainable, cfg.optim, cfg.lr, betas, cfg.weight_decay)
    b.train_dl, b.eval_dl = d.dataloaders(cfg, b.collate, b.train_tok, b.eval_tok, b.fast.group_by_length, b.eval_plan,
                                          b.tokenizer.pad_token_id)  # fmt: skip
    examples = len(b.train_tok) if b.prompts is None else len(b.prompts)
    b.steps = d.step_counts(cfg, examples, acc.num_processes)
    b.schedule = build_schedule(b.optimizer, b.steps[1], cfg.warmup_ratio, cfg.lr_scheduler_type, cfg.warmup_steps)
    b.policy, b.optimizer, b.train_dl, b.schedule = b.engine.prepare(
        acc, b.policy, b.optimizer, b.train_dl, b.schedule
    )
    if b.eval_dl is not None:
        b.eval_dl = acc.prepare(b.eval_dl)


def _density_ratio(b: _Build) -> None:
    """BCO's density-ratio weights: the resumed run's classifier, or one fitted once on the reference's embeddings."""
    cfg = b.cfg
    if b.saved_classifier is not None:  # the classifier of the run this one resumes (saved in its checkpoint)
        b.density = DensityRatioWeights(reference_embedding(b.reference), b.saved_classifier, cfg.min_density_ratio,
                                        cfg.max_density_ratio)  # fmt: skip
        b.say(f"density-ratio classifier loaded from {b.resume_path}")
    elif cfg.density_ratio:
        t0 = time.perf_counter()
        b.density = fit_density_ratio(cfg, b.reference, b.train_tok, b.tokenizer.pad_token_id, b.accelerator,
                                      make_gather(b.accelerator))  # fmt: skip
        b.timings["density_ratio"] = time.perf_counter() - t0


def _precompute_reference(b: _Build) -> None:
    """``--precompute-ref``: the reference's log-probs computed once (or read from the cache), then a table."""
    if b.reference is None or not b.cfg.precompute_ref:
        return
    t0 = time.perf_counter()
    cfg = b.cfg
    b.reference, b.ref_kind = precompute_reference(
        b.reference, b.accelerator, b.train_tok, b.eval_tok, b.collate, b.identity,
        batch_size=cfg.per_device_batch_size, max_prompt_length=cfg.max_prompt_length,
        max_completion_length=cfg.max_completion_length, mixed_precision=cfg.mixed_precision,
        cache_dir=cfg.ref_cache_dir,
    )
    b.timings["reference"] = time.perf_counter() - t0


def _report(b: _Build) -> None:
    cfg, n = b.cfg, b.accelerator.num_processes
    unit = d.unit(b.plan)
    b.say(
        f"loss {b.loss!r}; reference: {b.ref_kind}; {n} process(es) × {cfg.per_device_batch_size} {unit} × "
        f"{cfg.grad_accum} accumulation = {n * cfg.per_device_batch_size * cfg.grad_accum} {unit} per step; "
        f"{b.steps[1]} steps"
    )


_STEPS = (
    _check_options,
    _start_processes,
    _read_data,
    _load_model,
    _tokenize,
    _adapt_model,
    _build_policy,
    _check_fast_path,
    _shard_and_wrap,
    _density_ratio,
    _precompute_reference,
    _report,
)


def _parts(b: _Build) -> Parts:
    """The Parts, with the data source, trackers, checkpointed loss state and the resumed checkpoint's state."""
    cfg, acc = b.cfg, b.accelerator
    info = d.run_info(cfg, b.identity, acc.num_processes, b.engine, b.loss)
    parts = Parts(
        cfg, b.loss, b.engine, acc, b.tokenizer, b.policy, b.trainable, b.optimizer, b.schedule, b.train_dl,
        b.eval_dl, b.reference, make_gather(acc), info, b.data_stats, b.defaults, *b.steps, b.collate, b.storage,
        density_ratio=b.density, timings=b.timings,
    )  # fmt: skip
    parts.source = EpochBatches(parts) if b.prompts is None else d.online_rounds(cfg, parts, b.prompts, b.judge, b.plan)
    d.start_trackers(cfg, acc)
    if b.resume_path is not None:
        _resume(parts, b.resume_path, b.resume_info)
        parts.source.load(b.resume_path)
    parts.skip_record = d.skip_record(cfg, b.resume_info, parts.start_step)
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


def skip_batches_left(cfg: TrainConfig, start_step: int, record: list[int] | None, say: Any) -> int:
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
