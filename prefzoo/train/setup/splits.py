"""Train/eval splits for a run: load or take the normalized data, hold out an eval split, reach the loss's shape,
tokenize once; and the same for rows made during a run (on-policy samples), in memory."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

from prefzoo._dist import is_rank_zero
from prefzoo.data.cache import checked_map
from prefzoo.data.formats import DataFormatError, detected_format, load_preference_dataset, normalize, normalize_rows
from prefzoo.data.groups import completion_encoder, tokenize_lists, tokenize_unpaired
from prefzoo.data.mixing import load_mixture
from prefzoo.data.shapes import LISTS, UNPAIRED, list_rows_to_pairs
from prefzoo.data.tokenize import TokenizeStats, encode_rows, pair_encoder, tokenize_pairs
from prefzoo.model import DEFAULT_MAX_COMPLETION_LENGTH, DEFAULT_MAX_PROMPT_LENGTH, ContextLimits
from prefzoo.train.config.sections import DataSection, EvaluationSection

__all__ = ["SplitSettings", "load_splits", "prepare_datasets", "prepare_rows"]

_TOKENIZE = {LISTS: tokenize_lists, UNPAIRED: tokenize_unpaired}  # every other shape: tokenize_pairs

log = logging.getLogger(__name__)


def _prefix_ids(ds: Any, prefix: str) -> Any:
    return checked_map(ds, lambda row: {"id": f"{prefix}:{row['id']}"}, desc=f"naming {prefix} ids")


@dataclass(frozen=True)
class SplitSettings:
    """What reading, splitting and tokenizing a run's data reads of its settings: ``SplitSettings(cfg.data,
    cfg.evaluation, cfg.seed, cfg.progress)``."""

    data: DataSection
    evaluation: EvaluationSection
    seed: int = 42  # the mixture's order and the held-out split
    progress: bool = True  # a progress bar while tokenizing (rank 0)


def load_splits(split: SplitSettings, train: Any = None, eval_: Any = None) -> tuple[Any, Any]:
    """(normalized train, normalized eval or None) of ``split.data.dataset``; ``train``/``eval_`` override it.

    Called before any model loads, so the data's shape can be checked against the loss first.
    """
    cfg, seed, eval_split = split.data, split.seed, split.evaluation.eval_split
    if train is None:
        if cfg.dataset is None:
            raise DataFormatError("no training data: set --dataset (or neither --model nor --dataset for the default)")
        train = load_mixture(cfg.dataset, cfg.train_split, cfg.format, seed)
        if eval_split is not None:
            eval_ = load_mixture(cfg.dataset, eval_split, cfg.format, seed)
        elif isinstance(cfg.dataset, list):
            pass  # several sources: eval_fraction of the mixture is held out
        else:
            for name in ("test", "validation", "test_prefs"):
                try:
                    eval_ = load_preference_dataset(cfg.dataset, name, cfg.format)
                    break
                except (DataFormatError, ValueError, KeyError):
                    continue
    else:
        train = normalize(train, cfg.format) if not _normalized(train) else train  # load_splits ran already
        if eval_ is not None and len(eval_) > 0 and not _normalized(eval_):
            eval_ = normalize(eval_, cfg.format)
    return train, eval_


def _normalized(ds: Any) -> bool:
    return detected_format(ds) is not None


def prepare_datasets(
    split: SplitSettings,
    tokenizer: Any,
    train: Any = None,
    eval_: Any = None,
    limits: ContextLimits | None = None,
    plan: Any = None,
) -> tuple[Any, Any, dict[str, Any]]:
    """(tokenized train, tokenized eval or None, stats) of ``split.data``; ``train``/``eval_`` override its dataset.

    ``limits``: the token limits fitted to the model's context (default: ``split.data``'s, unset ones at defaults).
    ``plan``: the :class:`prefzoo.train.setup.shape_plan.ShapePlan` that brings the data to the loss's shape
    (default: as is).
    """
    from prefzoo.train.setup.shape_plan import convert

    cfg = split.data
    if limits is None:
        p = cfg.max_prompt_length or DEFAULT_MAX_PROMPT_LENGTH
        c = cfg.max_completion_length or DEFAULT_MAX_COMPLETION_LENGTH
        limits = ContextLimits(p, c, (p, c), None, "not fitted to a model")
    lengths = (limits.max_prompt_length, limits.max_completion_length)
    train, eval_ = load_splits(split, train, eval_)
    fmt = detected_format(train)
    if eval_ is None and split.evaluation.eval_fraction > 0 and len(train) >= 20:  # prompts held out before pairing
        held = train.train_test_split(test_size=split.evaluation.eval_fraction, seed=split.seed)
        train, eval_ = held["train"], held["test"]
    tied = 0
    if plan is not None:
        train, tied = convert(train, plan)
        if eval_ is not None and len(eval_) > 0:
            eval_, _ = convert(eval_, plan)
    tokenize = _TOKENIZE.get(plan.batches if plan is not None else "", tokenize_pairs)
    train_tok, train_stats = tokenize(
        _prefix_ids(train, "train"), tokenizer, *lengths, cfg.dataset_num_proc, requested=limits.requested,
        progress=split.progress and is_rank_zero(),
    )
    stats: dict[str, Any] = {"train": {**vars(train_stats), "format": fmt}}
    if tied:
        stats["train"]["tied_lists"] = tied  # lists whose completions all tie: no pair (--pairs-from-lists)
    eval_tok = None
    if eval_ is not None and len(eval_) > 0:
        eval_tok, eval_stats = tokenize(
            _prefix_ids(eval_, "eval"), tokenizer, *lengths, cfg.dataset_num_proc, requested=limits.requested,
            progress=split.progress and is_rank_zero(),
        )
        stats["eval"] = vars(eval_stats)
    for split_name, s in stats.items():
        st = TokenizeStats(**{k: v for k, v in s.items() if k not in ("format", "tied_lists")})
        log.info(
            "%s: %d kept, %d dropped (no completion token left), %d prompts and %d completions truncated "
            "(%d only because of the model's context)",
            split_name,
            st.kept,
            st.dropped,
            st.prompt_truncated,
            st.completion_truncated,
            st.context_truncated,
        )
    return train_tok, eval_tok, stats


def prepare_rows(
    tokenizer: Any, rows: list[dict[str, Any]], limits: ContextLimits, plan: Any
) -> tuple[list[dict[str, Any]], TokenizeStats, int]:
    """:func:`prepare_datasets` in memory for a few rows made during a run (an on-policy round's judged samples):
    normalized, brought to the loss's shape, named and tokenized by the same row functions, without a ``datasets``
    pass or cache file.  ``rows`` are lists (``plan.data`` lists) or unpaired examples; returns (tokenized rows,
    counts, lists dropped because all their completions tie)."""
    lengths = (limits.max_prompt_length, limits.max_completion_length)
    rows = normalize_rows(rows, "unpaired" if plan.data == UNPAIRED else "list")
    tied = 0
    if plan.pairs_from_lists:
        rows, tied = list_rows_to_pairs(rows, plan.pairs_from_lists)
    rows = [{**row, "id": f"train:{row['id']}"} for row in rows]
    if plan.batches in (LISTS, UNPAIRED):
        encode = completion_encoder(tokenizer, lengths, limits.requested, "completions" if plan.batches == LISTS
                                    else "completion")  # fmt: skip
    else:
        encode = pair_encoder(tokenizer, *lengths, limits.requested)
    kept, stats = encode_rows(rows, encode)
    return kept, stats, tied
