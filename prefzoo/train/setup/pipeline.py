"""The setup phase of a run: check the config, load model and data, build reference, optimizer and dataloaders, resume.

``setup(cfg, ...)`` returns :class:`Parts`, everything the step needs, already wrapped by ``accelerator.prepare``.
"""

from __future__ import annotations

import dataclasses
import math
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from prefzoo.data.chat import check_chat_template, set_chat_template
from prefzoo.data.collate import PreferenceCollator
from prefzoo.data.groups import GroupCollator, UnpairedCollator
from prefzoo.data.preview import describe_data
from prefzoo.data.shapes import LISTS, PAIRS, PROMPTS, UNPAIRED, data_shape
from prefzoo.data.tokenize import ensure_pad_token
from prefzoo.model import (
    PolicyLogps,
    apply_lora,
    apply_model_defaults,
    enable_gradient_checkpointing,
    first_pairs,
    fuse_gated_mlps,
    lean_rms_norms,
    load_kwargs,
    load_model_and_tokenizer,
    load_tokenizer,
    prepare_quantized,
    run_self_check,
    sparsify_dropout,
)
from prefzoo.spec import Loss
from prefzoo.train.checkpoint import ResumeError, read_marker
from prefzoo.train.config import ConfigError, TrainConfig
from prefzoo.train.data import load_splits, prepare_datasets
from prefzoo.train.density_ratio import (
    DensityRatioWeights,
    check_density_ratio,
    fit_density_ratio,
    read_density_ratio,
    reference_embedding,
)
from prefzoo.train.distributed import build_accelerator, make_gather
from prefzoo.train.fsdp import FsdpEngine, check_fsdp
from prefzoo.train.modifiers import build_loss
from prefzoo.train.nodes import Storage, agree_on_resume, agree_on_values, content_digest, detect_storage
from prefzoo.train.online import OnlineError, OnlineRounds, online_prompts, parse_judge
from prefzoo.train.optim import build_optimizer, build_schedule
from prefzoo.train.preflight import check_run_options
from prefzoo.train.reference import (
    FrozenReference,
    _zero3_enabled,
    build_reference,
    model_identity,
    precompute_reference,
)
from prefzoo.train.shapes import ShapePlan, online_plan, plan_shape
from prefzoo.train.source import EpochBatches
from prefzoo.train.trackers import resolve_trackers
from prefzoo.types import Need, Shape

__all__ = ["Parts", "setup", "skip_batches_left", "trackers"]


@dataclass
class Parts:
    """Everything a run's steps use (built once by :func:`setup`)."""

    cfg: TrainConfig
    loss: Loss
    accelerator: Any
    tokenizer: Any
    policy: Any  # the accelerate-wrapped PolicyLogps
    trainable: list[Any]
    optimizer: Any
    schedule: Any
    train_dl: Any
    eval_dl: Any  # None without an eval split
    reference: Any  # a Reference, or None for reference-free losses
    gather: Any
    info: dict[str, Any]  # run identity written into every checkpoint marker
    data_stats: dict[str, Any]
    model_defaults: Any  # ModelDefaults: the dropout turned off (or kept) and the token limits used
    steps_per_epoch: int
    total_steps: int
    num_epochs: int
    collate: Any = None  # the collator of the batches' shape
    source: Any = None  # where the micro-batches come from: EpochBatches, or OnlineRounds (--online)
    resume_path: Path | None = None  # the checkpoint this run resumed from
    start_step: int = 0  # optimizer steps already done (resume)
    start_skipped: int = 0  # skipped steps already counted (resume)
    skip_record: list[int] | None = None  # [start step, N] of the --skip-batches N this run applies (or applied)
    timings: dict[str, float] = field(default_factory=dict)
    storage: Storage | None = None  # shared or node-local output dir (None: one process)
    fsdp: FsdpEngine | None = None  # --fsdp: shards, saves and gathers the policy (None: accelerate's DDP/DeepSpeed)
    density_ratio: Any = None  # --density-ratio: batch -> (N,) BCO's density-ratio weights (DensityRatioWeights)


def trackers(cfg: TrainConfig) -> list[str] | None:
    return resolve_trackers(cfg.report_to)


def setup(cfg: TrainConfig, train_dataset: Any, eval_dataset: Any) -> Parts:
    """Build a run: every bad setting fails before the model loads, then model, data, reference, optimizer, resume."""
    from accelerate.utils import set_seed

    loss = build_loss(cfg)  # unknown names / bad params / modifiers that do not fit fail before any model loads
    _check_config(cfg)
    check_run_options(loss, cfg)  # options this loss or model would ignore
    accelerator = build_accelerator(cfg, trackers(cfg), cfg.output_dir)
    check_fsdp(cfg, accelerator.num_processes, accelerator.device.type == "cpu")
    storage = detect_storage(accelerator, cfg.output_dir)
    accelerator.project_configuration.save_on_each_node = not storage.shared  # each node's disk gets model + optimizer
    if not storage.shared and cfg.deepspeed:  # DeepSpeed's own switch: model states on every node, not rank 0 only
        ds_config = accelerator.state.deepspeed_plugin.deepspeed_config
        ds_config.setdefault("checkpoint", {})["use_node_local_storage"] = True
    resume_path, resume_info = _resume_point(cfg, accelerator, storage)
    set_seed(cfg.seed)
    with accelerator.main_process_first():  # the data's shape is checked against the loss before any model loads
        train_dataset, eval_dataset = load_splits(cfg, train_dataset, eval_dataset)
    prompts: list[Any] | None = None
    eval_plan: ShapePlan | None = None
    judge: Any = None
    if cfg.online:  # the data is prompts; each round's samples are lists (see prefzoo.train.online)
        if cfg.precompute_ref:
            raise ConfigError("--precompute-ref with --online: generated completions are new each round; drop it")
        if cfg.skip_batches:
            raise ConfigError("--skip-batches with --online: there is no fixed data order to skip in; drop it")
        prompts = online_prompts(train_dataset)
        plan = online_plan(loss, cfg.pairs_from_lists, cfg.unpair)
        train_dataset, eval_dataset, eval_plan = None, *_online_eval(loss, cfg, eval_dataset, accelerator)
        judge = _online_judge(cfg)
    else:
        plan = plan_shape(loss, data_shape(train_dataset), cfg.pairs_from_lists, cfg.unpair)
    _check_shape_options(cfg, plan)
    check_density_ratio(cfg, loss)
    saved_classifier = read_density_ratio(cfg, resume_path)  # a resumed --density-ratio run loads, never refits
    if plan.batches != PAIRS or plan.data != PAIRS:  # plain pair runs print what they always printed
        accelerator.print(f"prefzoo train: {plan.describe()}")
    tokenizer, template = _tokenizer_and_template(cfg, train_dataset, prompts)  # a broken template: before the model
    lm, tokenizer, has_adapter, identity = _load_model(cfg, accelerator, resume_path, resume_info, tokenizer)
    defaults = apply_model_defaults(cfg, lm, tokenizer)  # dropout off unless --keep-dropout; limits fit the context
    for line in defaults.lines():
        accelerator.print(f"prefzoo train: {line}")
    with accelerator.main_process_first():
        if prompts is None:
            train_tok, eval_tok, data_stats = prepare_datasets(
                cfg, tokenizer, train_dataset, eval_dataset, defaults.limits, plan
            )
        else:
            train_tok, eval_tok, data_stats = None, None, {}
            if eval_dataset is not None:  # held-out preference data, in the shape this loss takes it
                whole = dataclasses.replace(cfg, eval_fraction=0.0)
                eval_tok, _, stats = prepare_datasets(whole, tokenizer, eval_dataset, None, defaults.limits, eval_plan)
                data_stats["eval"] = stats["train"]
    for line in describe_data(tokenizer, train_tok, data_stats, template) if train_tok is not None else ():
        accelerator.print(f"prefzoo train: {line}")
    _print_data_stats(accelerator, data_stats, {LISTS: "lists", UNPAIRED: "examples"}.get(plan.batches, "pairs"))
    agreed_data = train_tok if prompts is None else _as_dataset(prompts)
    _agree_on_identity(cfg, accelerator, storage, agreed_data, eval_tok, identity)
    if Need.SCORES in loss.needs and (train_tok is None or "score_chosen" not in train_tok.column_names):
        raise ConfigError(
            f"loss {loss.name!r} needs each pair's scores (ODPO's offset), but the data has no score_chosen and "
            "score_rejected columns; add them (UltraFeedback's names) or drop the modifier"
        )
    if cfg.lora and not has_adapter:
        lm = apply_lora(lm, cfg.lora_r, cfg.lora_alpha, cfg.lora_dropout, cfg.lora_target_modules)
    if cfg.fused_mlp:
        _fuse_mlps(lm, accelerator)
    if cfg.lean_norms:
        _lean_norms(lm, accelerator)
    if cfg.sparse_dropout:
        _sparsify_dropout(lm, accelerator)
    fast = _fast_paths(cfg, loss, plan, train_tok, lm)
    accelerator.print(f"prefzoo train: {fast.line()}")
    policy = PolicyLogps(lm, cfg.logp_chunk_size, fused_head=cfg.fused_head, router_aux=True, packing=fast.packing)
    policy.train()
    reference, ref_kind = build_reference(loss, cfg, policy, has_adapter, accelerator)
    collate = _collator(plan, tokenizer.pad_token_id, fast.share_prompt)
    fsdp = _shard(cfg, accelerator, policy, reference, train_tok, collate)
    trainable = [p for p in policy.parameters() if p.requires_grad]  # after sharding: FSDP2 replaced them
    betas = (float(cfg.adam_betas[0]), float(cfg.adam_betas[1]))
    optimizer = build_optimizer(trainable, cfg.optim, cfg.lr, betas, cfg.weight_decay)
    if prompts is None:
        train_dl, eval_dl = _dataloaders(cfg, collate, train_tok, eval_tok, fast.group_by_length)
        examples = len(train_tok)
    else:  # online: each round's micro-batches are built from its samples (prefzoo.train.online)
        eval_collate = _collator(eval_plan, tokenizer.pad_token_id, False) if eval_plan is not None else collate
        train_dl = None
        eval_dl = None if eval_tok is None else _dataloaders(cfg, eval_collate, eval_tok, eval_tok, False)[1]
        examples = len(prompts)
    steps_per_epoch, total_steps, num_epochs = _step_counts(cfg, examples, accelerator.num_processes)
    schedule = build_schedule(optimizer, total_steps, cfg.warmup_ratio, cfg.lr_scheduler_type, cfg.warmup_steps)
    policy, optimizer, train_dl, schedule = _prepare(accelerator, fsdp, policy, optimizer, train_dl, schedule)
    if eval_dl is not None:
        eval_dl = accelerator.prepare(eval_dl)
    if (
        not _zero3_enabled() and train_tok is not None and fsdp is None
    ):  # the fast path against the model's own forward, first
        check_batch = first_pairs(train_tok, collate, accelerator.device)
        run_self_check(policy, reference, check_batch, cfg.logps_fallback, accelerator.print)
    timings: dict[str, float] = {}
    density = None
    if saved_classifier is not None:  # the classifier of the run this one resumes (saved in its checkpoint)
        density = DensityRatioWeights(reference_embedding(reference), saved_classifier, cfg.min_density_ratio,
                                      cfg.max_density_ratio)  # fmt: skip
        accelerator.print(f"prefzoo train: density-ratio classifier loaded from {resume_path}")
    elif cfg.density_ratio:  # BCO's UDM: the classifier is fitted once, on the frozen reference's prompt embeddings
        t0 = time.perf_counter()
        density = fit_density_ratio(cfg, reference, train_tok, tokenizer.pad_token_id, accelerator,
                                    make_gather(accelerator))  # fmt: skip
        timings["density_ratio"] = time.perf_counter() - t0
    if reference is not None and cfg.precompute_ref:
        t0 = time.perf_counter()
        reference, ref_kind = precompute_reference(cfg, reference, accelerator, train_tok, eval_tok, collate, identity)
        timings["reference"] = time.perf_counter() - t0
    unit = {LISTS: "lists", UNPAIRED: "examples"}.get(plan.batches, "pairs")
    accelerator.print(
        f"prefzoo train: loss {loss!r}; reference: {ref_kind}; {accelerator.num_processes} "
        f"process(es) × {cfg.per_device_batch_size} {unit} × {cfg.grad_accum} accumulation = "
        f"{accelerator.num_processes * cfg.per_device_batch_size * cfg.grad_accum} {unit} per step; "
        f"{total_steps} steps"
    )
    parts = Parts(
        cfg, loss, accelerator, tokenizer, policy, trainable, optimizer, schedule, train_dl, eval_dl, reference,
        make_gather(accelerator), _run_info(cfg, identity, accelerator.num_processes), data_stats, defaults,
        steps_per_epoch, total_steps, num_epochs, timings=timings, storage=storage, fsdp=fsdp,
    )  # fmt: skip
    parts.collate = collate
    parts.density_ratio = density
    parts.source = EpochBatches(parts) if prompts is None else _online_rounds(cfg, parts, prompts, judge, plan)
    _start_trackers(cfg, accelerator)
    if loss.spec.stateful:  # e.g. BCO's running reward mean: saved in every checkpoint, restored on resume
        accelerator.register_for_checkpointing(loss)
    if resume_path is not None:
        _resume(parts, resume_path, resume_info)
        parts.source.load(resume_path)
    if cfg.skip_batches:
        done = resume_info.get("skip_batches")  # the same skip, already applied before this checkpoint
        same = isinstance(done, list) and len(done) == 2 and done[1] == cfg.skip_batches and done[0] < parts.start_step
        parts.skip_record = [int(done[0]), int(done[1])] if same else [parts.start_step, cfg.skip_batches]  # type: ignore[index]
    return parts


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


def _as_dataset(prompts: list[Any]) -> Any:
    """An on-policy run's prompts as a dataset, for the ranks' data agreement (its content digest)."""
    import json

    import datasets

    return datasets.Dataset.from_dict({"prompt": [json.dumps(p, sort_keys=True) for p in prompts]})


def _online_eval(loss: Loss, cfg: TrainConfig, eval_dataset: Any, accelerator: Any) -> tuple[Any, Any]:
    """(held-out data, its ShapePlan) of an on-policy run, or (None, None) when there is none or this loss cannot
    evaluate on it (said in one line)."""
    if eval_dataset is None or len(eval_dataset) == 0 or data_shape(eval_dataset) == PROMPTS:
        return None, None
    try:
        shape = data_shape(eval_dataset)
        return eval_dataset, plan_shape(
            loss, shape, cfg.pairs_from_lists if shape == LISTS else None,
            shape == PAIRS and not loss.spec.accepts(Shape.PAIR) and not loss.spec.accepts(Shape.LIST),
        )  # fmt: skip
    except ConfigError as e:
        accelerator.print(f"prefzoo train: no held-out evaluation: {e}")
        return None, None


def _online_judge(cfg: TrainConfig) -> Any:
    """The judge of an on-policy run, built before the policy loads (bad names and options fail early)."""
    from prefzoo.judge import get_judge

    name, opts = parse_judge(cfg.judge, cfg.judge_params)
    try:
        return get_judge(name, **opts)
    except (ValueError, TypeError, OSError) as e:
        raise OnlineError(f"--judge {cfg.judge!r}: {e}") from None


def _online_rounds(cfg: TrainConfig, parts: Parts, prompts: list[Any], judge: Any, plan: ShapePlan) -> Any:
    from prefzoo.judge import make_engine, prompt_budget, unwrap_model

    lm = unwrap_model(parts.accelerator.unwrap_model(parts.policy).lm)
    try:
        engine = make_engine(cfg.engine, lm, parts.tokenizer)
    except (ValueError, RuntimeError) as e:
        raise OnlineError(str(e)) from None
    rounds = OnlineRounds(cfg, parts, prompts, judge, engine, plan, parts.model_defaults.limits)
    try:
        prompt_budget(lm, parts.tokenizer, rounds.max_new_tokens)
    except ValueError as e:
        raise ConfigError(f"--max-new-tokens: {e}") from None
    return rounds


def _collator(plan: ShapePlan, pad_token_id: int, share_prompt: bool) -> Any:
    """The collator of the batches' shape: pairs, groups of completions, or unpaired examples (with KL rows)."""
    if plan.batches == LISTS:
        return GroupCollator(pad_token_id)
    if plan.batches == UNPAIRED:
        return UnpairedCollator(pad_token_id, kl=plan.kl)
    return PreferenceCollator(pad_token_id, share_prompt=share_prompt)


def _fuse_mlps(lm: Any, accelerator: Any) -> None:
    """Gated-SiLU MLPs through SiluMul (prefzoo/model/fast/fused_mlp.py), said in one line when any was switched."""
    _say_switched(accelerator, fuse_gated_mlps(lm), "gated MLPs recompute silu(gate) and the product in backward: two "
                  "intermediate-width activations fewer kept per layer, same results", "--no-fused-mlp")  # fmt: skip


def _lean_norms(lm: Any, accelerator: Any) -> None:
    """RMSNorms that keep no normalised copy (prefzoo.model.fast.fused_mlp), said in one line when any was switched."""
    _say_switched(accelerator, lean_rms_norms(lm), "RMSNorms recompute the normalised input in backward: one "
                  "hidden-width activation fewer kept per norm, same results", "--no-lean-norms")  # fmt: skip


def _sparsify_dropout(lm: Any, accelerator: Any) -> None:
    """nn.Dropout modules through SparseDropout (prefzoo.model.fast.sparse_dropout), said in one line when any was."""
    rates = {f"at p={p:g}": n for p, n in sorted(sparsify_dropout(lm).items())}
    _say_switched(accelerator, rates, "dropout draws only the dropped positions on CPU: same distribution, less "
                  "time", "--no-sparse-dropout", count_first=True)  # fmt: skip


def _say_switched(accelerator: Any, switched: dict[str, int], what: str, flag: str, count_first: bool = False) -> None:
    """One log line for modules switched to a leaner forward: what changed, which (name × count), and the way out."""
    if switched:
        which = ", ".join(f"{n} {k}" if count_first else f"{k} × {n}" for k, n in switched.items())
        accelerator.print(f"prefzoo train: {what} ({which}; {flag} turns it off)")


def _fast_paths(cfg: TrainConfig, loss: Loss, plan: ShapePlan, train_tok: Any, lm: Any) -> Any:
    """Prompt sharing, packing, length grouping for this run: forced by flags or chosen from the pairs' lengths."""
    from prefzoo.model import fast_paths_for_run

    unavailable = None
    if plan.batches != PAIRS:
        unavailable = f"{plan.batches} batches"
    elif train_tok is None:
        unavailable = "on-policy data"
    elif cfg.deepspeed or cfg.fsdp:
        unavailable = "not measured under --deepspeed/--fsdp: force with on"
    from prefzoo.model import model_capabilities, packing_takes_split, unwrap_causal_lm

    causal: Any = unwrap_causal_lm(lm)
    caps = model_capabilities(causal)  # declared by the architecture (prefzoo.model.arch)
    unavailable = unavailable or caps.fast_path_block()
    refusal, share_refusal = caps.packing_refusal, caps.custom_mask_refusal  # flash: packs, does not share
    split = packing_takes_split(causal.get_decoder(), causal.config)  # packing without a mask: pays sooner
    return fast_paths_for_run(cfg, bool(loss.spec.batch_coupled), train_tok, unavailable, refusal, share_refusal, split)


def _check_shape_options(cfg: TrainConfig, plan: ShapePlan) -> None:
    """Options made for pairs, asked of lists or unpaired batches: one line each, before any model loads."""
    if plan.batches == PAIRS:
        return
    what = f"{plan.batches} (data shape {plan.data})"
    for key, flag in (("share_prompt", "--share-prompt"), ("group_by_length", "--group-by-length")):
        if getattr(cfg, key) in (True, "on"):  # auto turns itself off here
            raise ConfigError(f"{flag} works on pairs only for now; this run trains on {what}: drop {flag}")
    if cfg.precompute_ref and plan.kl:
        raise ConfigError(
            f"--precompute-ref with loss {cfg.loss!r}: its KL rows pair each completion with another prompt of its "
            "batch, which changes with every shuffle, so their reference log-probs cannot be computed once; drop "
            "--precompute-ref (the reference runs alongside the policy instead)"
        )
    if plan.kl and cfg.per_device_batch_size < 2:
        raise ConfigError(
            f"per_device_batch_size={cfg.per_device_batch_size}: loss {cfg.loss!r} estimates KTO's KL term from "
            "mismatched pairs within each batch, which needs at least 2 examples per device (as TRL); raise it"
        )


def _shard(
    cfg: TrainConfig, accelerator: Any, policy: PolicyLogps, reference: Any, train_tok: Any, collate: Any
) -> FsdpEngine | None:
    """The FSDP2 engine phase (``--fsdp``): self-check on the whole model, then shard the policy and a frozen copy."""
    if not cfg.fsdp:
        return None
    run_self_check(policy, reference, first_pairs(train_tok, collate, accelerator.device), cfg.logps_fallback,
                   accelerator.print)  # fmt: skip
    engine = FsdpEngine(cfg, accelerator)
    layers = engine.shard(policy)
    if isinstance(reference, FrozenReference):
        engine.shard(reference.module)  # frozen: sharded like the policy, gathered layer by layer under no_grad
    accelerator.print(
        f"prefzoo train: FSDP2 ({cfg.fsdp_sharding} sharding{', CPU offload' if cfg.fsdp_cpu_offload else ''}): "
        f"{layers} decoder layers and the root sharded over {engine.layout}"
    )
    return engine


def _prepare(
    accelerator: Any, fsdp: FsdpEngine | None, policy: Any, optimizer: Any, train_dl: Any, schedule: Any
) -> tuple[Any, Any, Any, Any]:
    """accelerate wraps what it owns: everything, or under --fsdp all but the sharded policy (no DDP around it)."""
    objs = [x for x in (train_dl, schedule) if x is not None]  # online runs build their batches per round
    if fsdp is None:
        objs = [policy, optimizer, *objs]
    else:
        optimizer = fsdp.wrap_optimizer(optimizer)
    out = accelerator.prepare(*objs)
    out = list(out) if len(objs) > 1 else [out]
    if fsdp is None:
        policy, optimizer, out = out[0], out[1], out[2:]
    return policy, optimizer, out[0] if train_dl is not None else None, out[-1]


def _check_config(cfg: TrainConfig) -> None:
    """Settings that cannot work together."""
    if cfg.model is None:
        raise ConfigError("model is not set: give --model (or neither --model nor --dataset for the default task)")
    if cfg.merge_lora and cfg.fsdp:
        raise ConfigError("--merge-lora is not supported with --fsdp here; save the adapter and merge afterwards")
    if cfg.merge_lora and cfg.deepspeed == "zero3":
        raise ConfigError("--merge-lora is not supported with ZeRO-3 here; save the adapter and merge afterwards")


def _agree_on_identity(
    cfg: TrainConfig, accelerator: Any, storage: Storage, train_tok: Any, eval_tok: Any, identity: str
) -> None:
    """Every rank trains the same data, loss and model (and would key the reference cache alike), or none starts."""
    if accelerator.num_processes == 1:
        return
    data = f"{content_digest(train_tok)}/{content_digest(eval_tok) if eval_tok is not None else '-'}"
    values = {
        "tokenized dataset fingerprint (train/eval content)": data,
        "loss and its parameters": f"{cfg.loss} {dict(sorted((k, str(v)) for k, v in cfg.loss_params.items()))}",
        "model identity": identity,
    }
    notes = {
        "tokenized dataset fingerprint (train/eval content)": f" (--dataset {cfg.dataset})",
        "model identity": f" (--model {cfg.model})",
    }
    if cfg.precompute_ref:
        key = f"{data}|{identity}|p{cfg.max_prompt_length}c{cfg.max_completion_length}|{cfg.mixed_precision}"
        values["precomputed-reference cache key"] = key
    fix = "give every node the same {} (a copy of the same file is fine)"
    hints = {
        "tokenized dataset fingerprint (train/eval content)": fix.format("--dataset, split and length settings"),
        "loss and its parameters": fix.format("--loss and --loss-param values"),
        "model identity": fix.format("--model weights"),
        "precomputed-reference cache key": fix.format("--max-prompt-length, --max-completion-length and precision"),
    }
    agree_on_values(accelerator, storage, values, hints, notes)


def _tokenizer_and_template(cfg: TrainConfig, train_dataset: Any, prompts: list[Any] | None) -> tuple[Any, str]:
    """(the tokenizer with ``--chat-template`` applied, what was decided), its template rendered once on the first
    example: a broken template is one line before the model loads."""
    assert cfg.model is not None  # _check_config
    tokenizer = load_tokenizer(cfg.model, trust_remote_code=cfg.trust_remote_code)
    template = set_chat_template(tokenizer, cfg.chat_template)
    first = {"prompt": prompts[0]} if prompts else (train_dataset[0] if train_dataset is not None else None)
    if first:
        check_chat_template(tokenizer, first, template)
    return tokenizer, template


def _load_model(
    cfg: TrainConfig, accelerator: Any, resume_path: Path | None, resume_info: dict[str, Any], tokenizer: Any
) -> tuple[Any, Any, bool, str]:
    """(causal LM, ``tokenizer`` with a pad token, whether it came with an adapter, weight identity)."""
    assert cfg.model is not None  # _check_config
    load = load_kwargs(cfg.torch_dtype, cfg.attn_implementation, cfg.load_in_4bit, cfg.load_in_8bit,
                       cuda=accelerator.device.type == "cuda")  # fmt: skip
    lm, tokenizer, has_adapter = load_model_and_tokenizer(
        cfg.model, trust_remote_code=cfg.trust_remote_code, tokenizer=tokenizer, **load
    )
    _prepare_for_training(cfg, lm, accelerator)
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
        lm.config.pad_token_id = tokenizer.pad_token_id  # type: ignore[union-attr]
    return lm, tokenizer, has_adapter, identity


def _prepare_for_training(cfg: TrainConfig, lm: Any, accelerator: Any) -> None:
    """Quantised base weights (peft's k-bit preparation) and activation checkpointing, said in one line each."""
    if cfg.load_in_4bit or cfg.load_in_8bit:
        prepare_quantized(lm, cfg.gradient_checkpointing)
        bits = "4-bit NF4" if cfg.load_in_4bit else "8-bit"
        accelerator.print(f"prefzoo train: base weights in {bits} (bitsandbytes); LoRA adapters train on them (QLoRA)")
    elif cfg.gradient_checkpointing:
        enable_gradient_checkpointing(lm)
    if cfg.gradient_checkpointing:
        accelerator.print(
            "prefzoo train: gradient checkpointing on (non-reentrant): activations recomputed in backward"
        )


def _print_data_stats(accelerator: Any, data_stats: dict[str, Any], what: str = "pairs") -> None:
    for split_name, s in data_stats.items():
        tied = f", {s['tied_lists']} lists with every completion tied left out" if s.get("tied_lists") else ""
        same = "with chosen identical to rejected" if what == "pairs" else "with identical completions"
        accelerator.print(
            f"prefzoo train: {split_name}: {s['kept']} {what} kept, {s['dropped']} dropped{tied} "
            f"({s.get('identical', 0)} {same}, {s.get('oversized', 0)} oversized, the "
            f"rest with no completion token left), {s['prompt_truncated']} prompts / "
            f"{s['completion_truncated']} completions truncated ({s['context_truncated']} pairs only because of the "
            "model's context)"
        )


def _dataloaders(cfg: TrainConfig, collate: Any, train_tok: Any, eval_tok: Any, group: bool) -> tuple[Any, Any]:
    """Train DataLoader (shuffled, or length-grouped with ``group``) and eval DataLoader (or None)."""
    if group:
        from prefzoo.data.length_groups import LengthGroupedSampler, pair_lengths

        order: dict[str, Any] = {
            "sampler": LengthGroupedSampler(pair_lengths(train_tok), cfg.per_device_batch_size, cfg.seed)
        }
    else:
        order = {"shuffle": True}
    train_dl = torch.utils.data.DataLoader(train_tok, batch_size=cfg.per_device_batch_size, collate_fn=collate, **order)
    if eval_tok is None:
        return train_dl, None
    return train_dl, torch.utils.data.DataLoader(eval_tok, batch_size=cfg.per_device_batch_size, collate_fn=collate)


def _step_counts(cfg: TrainConfig, pairs: int, processes: int) -> tuple[int, int, int]:
    """(optimizer steps per epoch, total steps, epochs to iterate)."""
    batches_per_process = math.ceil(pairs / (cfg.per_device_batch_size * processes))
    steps_per_epoch = math.ceil(batches_per_process / cfg.grad_accum)  # e.g. 60k pairs / (2 × 16 × 4) ≈ 469
    # a fractional epoch count stops part-way (0.5 × 469 → 235 steps); round() keeps 3 × 1.1 from becoming 4
    total_steps = cfg.max_steps or max(1, math.ceil(round(steps_per_epoch * cfg.epochs, 6)))
    return steps_per_epoch, total_steps, math.ceil(total_steps / steps_per_epoch)


def _run_info(cfg: TrainConfig, identity: str, processes: int) -> dict[str, Any]:
    return {
        "loss": cfg.loss,
        "loss_params": {k: str(v) for k, v in cfg.loss_params.items()},
        **({"modifiers": [str(m) for m in cfg.modifiers]} if cfg.modifiers else {}),
        "model": cfg.model,
        "model_identity": identity,
        "batch": [processes, cfg.per_device_batch_size, cfg.grad_accum],
        "seed": cfg.seed,
    }


def _start_trackers(cfg: TrainConfig, accelerator: Any) -> None:
    if trackers(cfg):
        simple = {k: v for k, v in cfg.to_dict().items() if isinstance(v, int | float | str | bool)}
        accelerator.init_trackers("prefzoo", config=simple)


def _resume_point(cfg: TrainConfig, accelerator: Any, storage: Storage) -> tuple[Path | None, dict[str, Any]]:
    """The checkpoint every rank resumes from (the same step on all; see prefzoo.train.nodes), checked against cfg."""
    path = agree_on_resume(accelerator, storage, cfg.output_dir, cfg.resume)
    if path is None:
        return None, {}  # 'auto' with nothing saved yet: a fresh start
    info = read_marker(path)
    if info.get("model_only"):
        raise ResumeError(
            f"--resume {path}: this checkpoint was saved with --save-only-model (weights only, no optimizer, "
            f"scheduler or data position), so it cannot be resumed; start a new run from it with --model {path}"
        )
    same_mods = info.get("modifiers", []) == [str(m) for m in cfg.modifiers]
    if (not same_mods or info.get("loss") != cfg.loss
            or info.get("loss_params") != {k: str(v) for k, v in cfg.loss_params.items()}):  # fmt: skip
        raise ResumeError(
            f"--resume {path}: checkpoint was trained with loss {info.get('loss')!r} {info.get('loss_params')}, "
            f"this run asks for {cfg.loss!r} {cfg.loss_params}; use the same loss or a new --output-dir"
        )
    return path, info


def _resume(parts: Parts, path: Path, saved: dict[str, Any]) -> None:
    """Load the checkpoint's state; the position in the data is counted in batches, so the geometry must match."""
    for key, what in (("batch", "processes × per-device batch × accumulation"), ("seed", "seed")):
        if key in saved and saved[key] != parts.info[key]:
            raise ResumeError(
                f"--resume {path}: checkpoint used {what} = {saved[key]}, this run {parts.info[key]}; "
                "resume with the same settings (or start a new --output-dir)"
            )
    _load_state(parts.accelerator, path)
    if parts.fsdp is not None:  # this rank's model and optimizer shards (accelerate saved neither)
        parts.fsdp.load(parts.policy, parts.optimizer, path)
    parts.start_step = int(saved["step"])
    parts.resume_path = path
    parts.start_skipped = int(saved.get("skipped_steps", 0))
    parts.accelerator.print(f"prefzoo train: resumed from {path} at step {parts.start_step}")


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
