"""Setup's data helpers: shape options, on-policy pieces, collators, dataloaders, step counts, the ranks' agreement."""

from __future__ import annotations

import math
from typing import Any

import torch

from prefzoo._secrets import redact
from prefzoo.data.collate import PreferenceCollator
from prefzoo.data.groups import GroupCollator, UnpairedCollator
from prefzoo.data.shapes import LISTS, PAIRS, PROMPTS, UNPAIRED, data_shape
from prefzoo.spec import Loss
from prefzoo.train.checkpoint import Storage
from prefzoo.train.checkpoint.final import loss_params
from prefzoo.train.checkpoint.nodes import agree_on_values, content_digest
from prefzoo.train.config import ConfigError
from prefzoo.train.config.sections import DataSection, FastPathSection, LossSection, OnlineSection, OptimizationSection
from prefzoo.train.setup.shape_plan import ShapePlan, plan_shape
from prefzoo.train.setup.trackers import resolve_trackers
from prefzoo.types import Shape

__all__ = [
    "agree_on_identity",
    "as_dataset",
    "check_online_options",
    "check_shape_options",
    "collator",
    "dataloaders",
    "online_eval",
    "online_judge",
    "online_rounds",
    "print_data_stats",
    "run_info",
    "skip_record",
    "start_trackers",
    "step_counts",
    "unit",
]


def unit(plan: ShapePlan) -> str:
    """What one example of the batches is called in log lines."""
    return {LISTS: "lists", UNPAIRED: "examples"}.get(plan.batches, "pairs")


def check_online_options(precompute_ref: bool, skip_batches: int) -> None:
    if precompute_ref:
        raise ConfigError("--precompute-ref with --online: generated completions are new each round; drop it")
    if skip_batches:
        raise ConfigError("--skip-batches with --online: there is no fixed data order to skip in; drop it")


def check_shape_options(fast: FastPathSection, cfg: LossSection, per_device_batch_size: int, plan: ShapePlan) -> None:
    """Options made for pairs, asked of lists or unpaired batches: one line each, before any model loads."""
    if plan.batches == PAIRS:
        return
    what = f"{plan.batches} (data shape {plan.data})"
    for key, flag in (("share_prompt", "--share-prompt"), ("group_by_length", "--group-by-length")):
        if getattr(fast, key) in (True, "on"):  # auto turns itself off here
            raise ConfigError(f"{flag} works on pairs only for now; this run trains on {what}: drop {flag}")
    if cfg.precompute_ref and plan.kl:
        raise ConfigError(
            f"--precompute-ref with loss {cfg.loss!r}: its KL rows pair each completion with another prompt of its "
            "batch, which changes with every shuffle, so their reference log-probs cannot be computed once; drop "
            "--precompute-ref (the reference runs alongside the policy instead)"
        )
    if plan.kl and per_device_batch_size < 2:
        raise ConfigError(
            f"per_device_batch_size={per_device_batch_size}: loss {cfg.loss!r} estimates KTO's KL term from "
            "mismatched pairs within each batch, which needs at least 2 examples per device (as TRL); raise it"
        )


def as_dataset(prompts: list[Any]) -> Any:
    """An on-policy run's prompts as a dataset, for the ranks' data agreement (its content digest)."""
    import json

    import datasets

    return datasets.Dataset.from_dict({"prompt": [json.dumps(p, sort_keys=True) for p in prompts]})


def online_eval(loss: Loss, cfg: LossSection, eval_dataset: Any, accelerator: Any) -> tuple[Any, Any]:
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


def online_judge(cfg: OnlineSection) -> Any:
    """The judge of an on-policy run, built before the policy loads (bad names and options fail early)."""
    from prefzoo.judge import get_judge
    from prefzoo.train.online import OnlineError, parse_judge

    name, opts = parse_judge(cfg.judge, cfg.judge_params)
    try:
        return get_judge(name, **opts)
    except (ValueError, TypeError, OSError) as e:
        raise OnlineError(f"--judge {cfg.judge!r}: {e}") from None


def online_rounds(generation_engine: str, parts: Any, prompts: list[Any], judge: Any, plan: ShapePlan) -> Any:
    """The on-policy source: rounds of sampling, judging and training (:class:`prefzoo.train.online.OnlineRounds`,
    which reads the run's settings from ``parts``); ``generation_engine``: ``--engine`` (hf or vllm)."""
    from prefzoo.judge import make_engine, prompt_budget
    from prefzoo.model import unwrap
    from prefzoo.train.online import OnlineError, OnlineRounds

    lm = unwrap(parts.accelerator.unwrap_model(parts.policy).lm)
    try:
        engine = make_engine(generation_engine, lm, parts.tokenizer)
    except (ValueError, RuntimeError) as e:
        raise OnlineError(str(e)) from None
    rounds = OnlineRounds(parts.cfg, parts, prompts, judge, engine, plan, parts.model_defaults.limits)
    try:
        prompt_budget(lm, parts.tokenizer, rounds.max_new_tokens)
    except ValueError as e:
        raise ConfigError(f"--max-new-tokens: {e}") from None
    return rounds


def collator(plan: ShapePlan, pad_token_id: int, share_prompt: bool) -> Any:
    """The collator of the batches' shape: pairs, groups of completions, or unpaired examples (with KL rows)."""
    if plan.batches == LISTS:
        return GroupCollator(pad_token_id)
    if plan.batches == UNPAIRED:
        return UnpairedCollator(pad_token_id, kl=plan.kl)
    return PreferenceCollator(pad_token_id, share_prompt=share_prompt)


def dataloaders(
    cfg: OptimizationSection, collate: Any, train_tok: Any, eval_tok: Any, group: bool, eval_plan: ShapePlan | None,
    pad_token_id: int,
) -> tuple[Any, Any]:
    """(train DataLoader: shuffled, or length-grouped with ``group``; eval DataLoader or None).  An on-policy run
    (``train_tok`` None) has no train DataLoader, and evaluates in its held-out data's own shape (``eval_plan``)."""
    if eval_tok is not None:
        own_shape = train_tok is None and eval_plan is not None  # on-policy: the held-out data's own shape
        eval_collate = collator(eval_plan, pad_token_id, False) if own_shape else collate  # type: ignore[arg-type]
        eval_dl = torch.utils.data.DataLoader(eval_tok, batch_size=cfg.per_device_batch_size, collate_fn=eval_collate)
    else:
        eval_dl = None
    if train_tok is None:
        return None, eval_dl
    if group:
        from prefzoo.data.length_groups import LengthGroupedSampler, pair_lengths

        order: dict[str, Any] = {
            "sampler": LengthGroupedSampler(pair_lengths(train_tok), cfg.per_device_batch_size, cfg.seed)
        }
    else:
        order = {"shuffle": True}
    train_dl = torch.utils.data.DataLoader(train_tok, batch_size=cfg.per_device_batch_size, collate_fn=collate, **order)
    return train_dl, eval_dl


def step_counts(cfg: OptimizationSection, examples: int, processes: int) -> tuple[int, int, int]:
    """(optimizer steps per epoch, total steps, epochs to iterate)."""
    batches_per_process = math.ceil(examples / (cfg.per_device_batch_size * processes))
    steps_per_epoch = math.ceil(batches_per_process / cfg.grad_accum)  # e.g. 60k pairs / (2 × 16 × 4) ≈ 469
    # a fractional epoch count stops part-way (0.5 × 469 → 235 steps); round() keeps 3 × 1.1 from becoming 4
    total_steps = cfg.max_steps or max(1, math.ceil(round(steps_per_epoch * cfg.epochs, 6)))
    return steps_per_epoch, total_steps, math.ceil(total_steps / steps_per_epoch)


def run_info(
    cfg: LossSection, opt: OptimizationSection, model: str | None, identity: str, processes: int, engine: Any,
    loss: Any = None,
) -> dict[str, Any]:
    """The run's identity, written into every checkpoint marker and checked on resume; ``loss_params`` holds every
    parameter of the run's ``loss`` with the value it trains with, defaults included."""
    return {
        **engine.marker(processes),
        "loss": cfg.loss,
        "loss_params": loss_params(loss) if loss is not None else {k: str(v) for k, v in cfg.loss_params.items()},
        **({"modifiers": [str(m) for m in cfg.modifiers]} if cfg.modifiers else {}),
        "model": model,
        "model_identity": identity,
        "batch": [processes, opt.per_device_batch_size, opt.grad_accum],
        "seed": opt.seed,
    }


def skip_record(cfg: OptimizationSection, resume_info: dict[str, Any], start_step: int) -> list[int] | None:
    """[start step, N] of ``--skip-batches N``: the resumed checkpoint's when it already applied the same skip."""
    if not cfg.skip_batches:
        return None
    done = resume_info.get("skip_batches")  # the same skip, already applied before this checkpoint
    same = isinstance(done, list) and len(done) == 2 and done[1] == cfg.skip_batches and done[0] < start_step
    return [int(done[0]), int(done[1])] if same else [start_step, cfg.skip_batches]  # type: ignore[index]


def start_trackers(report_to: str | None, values: dict[str, Any], accelerator: Any) -> None:
    """The trackers of ``--report-to``, given the run's config ``values`` (secrets redacted, scalars only)."""
    if resolve_trackers(report_to):
        simple = {k: v for k, v in redact(values).items() if isinstance(v, int | float | str | bool)}
        accelerator.init_trackers("prefzoo", config=simple)


def print_data_stats(accelerator: Any, data_stats: dict[str, Any], what: str = "pairs") -> None:
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


def agree_on_identity(
    cfg: LossSection, data: DataSection, model: str | None, mixed_precision: str, accelerator: Any, storage: Storage,
    train_tok: Any, eval_tok: Any, identity: str,
) -> None:
    """Every rank trains the same data, loss and model (and would key the reference cache alike), or none starts."""
    if accelerator.num_processes == 1:
        return
    digest = f"{content_digest(train_tok)}/{content_digest(eval_tok) if eval_tok is not None else '-'}"
    data_key, model_key = "tokenized dataset fingerprint (train/eval content)", "model identity"
    values = {
        data_key: digest,
        "loss and its parameters": f"{cfg.loss} {dict(sorted((k, str(v)) for k, v in cfg.loss_params.items()))}",
        model_key: identity,
    }
    notes = {data_key: f" (--dataset {data.dataset})", model_key: f" (--model {model})"}
    if cfg.precompute_ref:
        key = f"{digest}|{identity}|p{data.max_prompt_length}c{data.max_completion_length}|{mixed_precision}"
        values["precomputed-reference cache key"] = key
    fix = "give every node the same {} (a copy of the same file is fine)"
    hints = {
        data_key: fix.format("--dataset, split and length settings"),
        "loss and its parameters": fix.format("--loss and --loss-param values"),
        model_key: fix.format("--model weights"),
        "precomputed-reference cache key": fix.format("--max-prompt-length, --max-completion-length and precision"),
    }
    agree_on_values(accelerator, storage, values, hints, notes)
