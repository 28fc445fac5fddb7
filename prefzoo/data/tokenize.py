"""Tokenize normalized pairs once (``datasets.map``, cached; or :func:`encode_rows` in memory) with prompt-end /
completion-start truncation."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

from prefzoo.data.cache import cached_summary, checked_map
from prefzoo.data.chat import render_completion, render_prompt
from prefzoo.data.formats import DataFormatError
from prefzoo.data.progress import Progress, counted
from prefzoo.data.validate import MAX_TEXT_CHARS

if TYPE_CHECKING:
    import datasets

__all__ = [
    "FLAGS",
    "TokenizeStats",
    "encode_dataset",
    "encode_rows",
    "encoded_flags",
    "ensure_pad_token",
    "flag_stats",
    "pair_encoder",
    "render_prompt",
    "text_chars",
    "tokenize_pairs",
]

log = logging.getLogger(__name__)


@dataclass
class TokenizeStats:
    """How many pairs went in, were kept, and were dropped (counted skips: see docs/reliability.md)."""

    total: int
    kept: int
    dropped: int  # all dropped pairs: no completion token left, plus the two counts below
    prompt_truncated: int
    completion_truncated: int
    identical: int = 0  # chosen == rejected token ids after truncation: no preference signal, never trained on
    oversized: int = 0  # a field longer than MAX_TEXT_CHARS characters: skipped before tokenization
    context_truncated: int = 0  # pairs truncated only because the limits were lowered to the model's context
    examples: list[str] = field(default_factory=list)  # a few dropped or truncated rows: "id: why"


def ensure_pad_token(tokenizer: Any) -> str | None:
    """Give a tokenizer without a pad token its eos token; returns a message saying so (or None)."""
    if tokenizer.pad_token_id is not None:
        return None
    if tokenizer.eos_token_id is None:
        raise DataFormatError("the tokenizer has neither a pad token nor an eos token; set tokenizer.pad_token")
    tokenizer.pad_token = tokenizer.eos_token
    return f"tokenizer has no pad token: using its eos token {tokenizer.eos_token!r} for padding (masked out)"


def _examples(enc: datasets.Dataset | Sequence[dict[str, Any]], limit: int = 3) -> list[str]:
    """The first ``limit`` dropped and ``limit`` truncated rows (of a dataset or a list of rows), each as 'id: why'."""
    dropped: list[str] = []
    truncated: list[str] = []
    cols = ["id", "keep", "identical", "oversized", "prompt_truncated", "completion_truncated"]
    for row in enc.select_columns(cols) if hasattr(enc, "select_columns") else enc:
        if not row["keep"] and len(dropped) < limit:
            why = "oversized" if row["oversized"] else "chosen identical to rejected" if row["identical"] else None
            dropped.append(f"{row['id']}: dropped, {why or 'no completion token left'}")
        elif row["prompt_truncated"] or row["completion_truncated"]:
            if len(truncated) < limit:
                part = "prompt" if row["prompt_truncated"] else "completion"
                truncated.append(f"{row['id']}: {part} truncated")
        if len(dropped) == limit and len(truncated) == limit:
            break
    return dropped + truncated


def text_chars(value: Any) -> int:
    """Characters of a text field: a string's length, or a conversation's longest message."""
    return len(value) if isinstance(value, str) else max((len(m["content"]) for m in value), default=0)


FLAGS = ("keep", "identical", "oversized", "prompt_truncated", "completion_truncated", "context_truncated")


def flag_stats(count: Callable[[str], int], total: int) -> TokenizeStats:
    """Counts of encoded rows' flags (:data:`FLAGS`); ``count(name)`` is how many rows have the flag ``name``."""
    n = {k: int(count(k)) for k in FLAGS}
    return TokenizeStats(
        total=total,
        kept=n["keep"],
        dropped=total - n["keep"],
        prompt_truncated=n["prompt_truncated"],
        completion_truncated=n["completion_truncated"],
        identical=n["identical"],
        oversized=n["oversized"],
        context_truncated=n["context_truncated"],
    )


def _check_stats(value: dict[str, Any], rows: int) -> TokenizeStats:
    """The :class:`TokenizeStats` of a stored summary of ``rows`` encoded rows; a ValueError if it cannot be right."""
    stats = TokenizeStats(**value)
    counts = {k: v for k, v in vars(stats).items() if k != "examples"}
    if not all(type(v) is int and 0 <= v <= rows for v in counts.values()):
        raise ValueError(f"counts must be integers in [0, {rows}]: {counts}")
    if stats.total != rows or stats.kept + stats.dropped != rows:
        raise ValueError(f"total {stats.total}, kept {stats.kept} + dropped {stats.dropped} for {rows} rows")
    if not isinstance(stats.examples, list) or not all(isinstance(e, str) for e in stats.examples):
        raise ValueError("examples must be a list of strings")
    return stats


def _dataset_stats(enc: datasets.Dataset) -> dict[str, Any]:
    """The counts of a mapped dataset's flags, summed by Arrow (no Python object per row)."""
    import pyarrow.compute as pc

    flags = enc.select_columns(list(FLAGS)).with_format("arrow")[:]  # pyarrow.Table of the flag columns
    stats = flag_stats(lambda k: pc.sum(flags[k]).as_py() or 0, len(enc))
    if stats.dropped or stats.prompt_truncated or stats.completion_truncated:
        stats.examples = _examples(enc)
    return asdict(stats)


def encode_rows(rows: Sequence[dict[str, Any]], encode: Callable[[dict[str, Any]], dict[str, Any]]) -> tuple[
    list[dict[str, Any]], TokenizeStats
]:  # fmt: skip
    """In memory, no ``datasets`` pass and no cache file: the kept rows of ``encode`` (an encoder of this module or
    :mod:`prefzoo.data.groups`) without their flags, and the counts.  For a few rows made during a run (on-policy
    samples), where a ``datasets.map`` costs more in fingerprinting than the tokenizing itself."""
    enc = [encode(row) for row in rows]
    stats = flag_stats(lambda k: sum(row[k] for row in enc), len(enc))
    if stats.dropped or stats.prompt_truncated or stats.completion_truncated:
        stats.examples = _examples(enc)
    return [{k: v for k, v in row.items() if k not in FLAGS} for row in enc if row["keep"]], stats


def encoded_flags(
    prompt_len: int, longest: int, limits: tuple[int, int], requested: tuple[int, int], keep: bool, identical: bool
) -> dict[str, bool]:
    """The :data:`FLAGS` of one encoded (not oversized) row: what the (prompt, completion) ``limits`` cut, and
    whether only they cut it, not the ``requested`` limits before they were lowered to the model's context."""
    (max_p, max_c), (req_p, req_c) = limits, requested
    cut = prompt_len > max_p or longest > max_c
    return {
        "prompt_truncated": prompt_len > max_p,
        "completion_truncated": longest > max_c,
        "context_truncated": cut and prompt_len <= req_p and longest <= req_c,
        "keep": keep,
        "identical": identical,
        "oversized": False,
    }


def pair_encoder(
    tokenizer: Any,
    max_prompt_length: int,
    max_completion_length: int,
    requested: tuple[int, int] | None = None,
    passthrough: Sequence[str] = (),
) -> Callable[[dict[str, Any]], dict[str, Any]]:
    """The function that tokenizes one normalized pair: id, prompt_ids, chosen_ids, rejected_ids, the columns
    ``passthrough`` as they are, and the :data:`FLAGS`."""
    req_prompt, req_completion = requested or (max_prompt_length, max_completion_length)
    if max_prompt_length < 1 or max_completion_length < 1:
        raise DataFormatError(
            f"max_prompt_length={max_prompt_length} and max_completion_length={max_completion_length} must be >= 1"
        )
    if tokenizer.eos_token_id is None:
        raise DataFormatError("the tokenizer has no eos token; completions end with eos. Set tokenizer.eos_token")

    def encode(row: dict[str, Any]) -> dict[str, Any]:
        return {**_encode(row), **{k: row[k] for k in passthrough}}

    def _encode(row: dict[str, Any]) -> dict[str, Any]:
        if max(text_chars(row["prompt"]), text_chars(row["chosen"]), text_chars(row["rejected"])) > MAX_TEXT_CHARS:
            return {
                "id": row["id"],
                "prompt_ids": [],
                "chosen_ids": [],
                "rejected_ids": [],
                "prompt_truncated": False,
                "completion_truncated": False,
                "keep": False,
                "identical": False,
                "oversized": True,
                "context_truncated": False,
            }
        prompt = render_prompt(tokenizer, row["prompt"])
        chosen = render_completion(tokenizer, row["prompt"], row["chosen"])
        rejected = render_completion(tokenizer, row["prompt"], row["rejected"])
        identical = len(chosen) > 0 and chosen[:max_completion_length] == rejected[:max_completion_length]
        keep = len(chosen) > 0 and len(rejected) > 0 and len(prompt) > 0 and not identical
        return {
            "id": row["id"],
            "prompt_ids": prompt[-max_prompt_length:],  # the prompt keeps its END (the question nearest the answer)
            "chosen_ids": chosen[:max_completion_length],  # completions keep their START
            "rejected_ids": rejected[:max_completion_length],
            **encoded_flags(len(prompt), max(len(chosen), len(rejected)), (max_prompt_length, max_completion_length),
                            (req_prompt, req_completion), keep, identical),
        }

    return encode


def tokenize_pairs(
    ds: datasets.Dataset,
    tokenizer: Any,
    max_prompt_length: int = 1800,
    max_completion_length: int = 512,
    num_proc: int | None = None,
    *,
    requested: tuple[int, int] | None = None,
    progress: bool = True,
) -> tuple[datasets.Dataset, TokenizeStats]:
    """Columns id, prompt_ids, chosen_ids, rejected_ids; pairs with no completion token left are dropped, counted.

    ``requested`` = the (prompt, completion) limits before they were lowered to the model's context: pairs that
    only the lower limits truncate are counted in ``context_truncated``.  ``progress``: show a bar.
    """
    scores = [k for k in ("score_chosen", "score_rejected") if k in ds.column_names]  # passed through
    encode = pair_encoder(tokenizer, max_prompt_length, max_completion_length, requested, scores)
    if len(ds) == 0:
        raise DataFormatError("the dataset (or the selected split) is empty: it holds no preference pairs")
    same, check = "with chosen identical to rejected", "the chosen/rejected columns"
    return encode_dataset(ds, encode, num_proc, "pairs", same, check, progress)


@contextlib.contextmanager
def _datasets_bars_off() -> Iterator[None]:
    """datasets' own bar off for a block that shows prefzoo's (one bar, clean lines in a log), then as it was."""
    from datasets.utils import are_progress_bars_disabled, disable_progress_bars, enable_progress_bars

    was_off = are_progress_bars_disabled()
    if not was_off:
        disable_progress_bars()
    try:
        yield
    finally:
        if not was_off:
            enable_progress_bars()


def encode_dataset(
    ds: datasets.Dataset, encode: Callable[[dict[str, Any]], dict[str, Any]], num_proc: int | None, what: str,
    same: str, check: str, progress: bool = True,
) -> tuple[datasets.Dataset, TokenizeStats]:  # fmt: skip
    """``ds.map(encode)`` (cached) with its rows counted; rows with no completion token left, identical completions
    (``same``: how they are called) or an oversized field are dropped with a warning.  ``what``: 'pairs', 'lists' or
    'examples'; ``check``: what to look at when every row is dropped (a one-line error); ``progress``: show a bar."""
    bar = Progress(len(ds), f"tokenizing {what}", unit=what, enabled=progress)
    with bar, bar.counting(), _datasets_bars_off():
        enc = checked_map(ds, counted(encode), remove_columns=list(ds.column_names), num_proc=num_proc,
                          desc=f"tokenizing {what}")  # fmt: skip
    # counted once per tokenised dataset: a later run (a cache hit) reads them back instead of the columns
    stats = TokenizeStats(**cached_summary(enc, "tokenize-stats", lambda: _dataset_stats(enc),
                                           lambda v: _check_stats(v, len(enc))))  # fmt: skip
    if stats.kept == 0:
        raise DataFormatError(f"all {stats.total} {what} were dropped: {_drop_reasons(stats, same)}; check {check}")
    if stats.dropped:
        enc = checked_map(enc, lambda k: k, method="filter", rows=stats.kept, input_columns="keep",
                          desc=f"dropping empty {what}")  # fmt: skip
        log.warning("dropped %d of %d %s (%d %s, %d oversized, the rest with no completion token left)",
                    stats.dropped, stats.total, what, stats.identical, same, stats.oversized)  # fmt: skip
    return enc.remove_columns(list(FLAGS)), stats


def _drop_reasons(stats: TokenizeStats, same: str) -> str:
    """Why every row was dropped, the most frequent reason first (``4 with chosen identical to rejected, ...``)."""
    empty = stats.total - stats.identical - stats.oversized
    reasons = [
        (stats.identical, f"{stats.identical} {same}"),
        (stats.oversized, f"{stats.oversized} with a field over {MAX_TEXT_CHARS} characters"),
        (empty, f"{empty} with no completion token left (empty completions or prompts; see --max-completion-length)"),
    ]
    return ", ".join(text for n, text in sorted(reasons, key=lambda r: -r[0]) if n)
