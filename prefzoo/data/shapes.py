"""Lists and unpaired examples: their formats, row checks, and the conversions between the three data shapes.

Formats (auto-detected from the columns like the pair formats, or forced with ``--format``):

- ``ultrafeedback-raw`` (openbmb/UltraFeedback): ``instruction`` string, ``completions`` a list of
  ``{"response": str, "overall_score": number, ...}``; the instruction becomes one user message.
- ``list``: ``prompt`` (string or messages), ``completions`` a list of strings (or assistant message lists), and
  optional ``scores`` (one number per completion, higher is better; without it the column order is the ranking,
  best first).
- ``unpaired`` (TRL's KTO format): ``prompt``, ``completion`` and a boolean ``label`` (True = desirable); plain
  strings, or conversational (``prompt`` and ``completion`` message lists, or only ``completion`` holding the whole
  conversation).

Normalized rows: lists ``{id, prompt, completions, scores}`` sorted best first (stable, so ties keep their order;
``scores`` None when the data gave none); unpaired ``{id, prompt, completion, label}``.

Conversions (:func:`lists_to_pairs`, :func:`unpair`) work on normalized datasets: a pairwise loss on lists trains
on the pairs of ``--pairs-from-lists``, an unpaired loss on pairs (with ``--unpair``) on a desirable chosen and an
undesirable rejected example per pair, as TRL's ``unpair_preference_dataset``.  (A list loss on pairs needs no
conversion: it sees each pair as a K = 2 group.)
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

from prefzoo.data.cache import cached_summary
from prefzoo.data.validate import DataFormatError, check_messages, check_text

if TYPE_CHECKING:
    import datasets

__all__ = [
    "LISTS",
    "PAIRS",
    "PAIRS_FROM_LISTS",
    "PROMPTS",
    "SHAPE_COLUMNS",
    "UNPAIRED",
    "data_shape",
    "list_pairs",
    "list_rows_to_pairs",
    "lists_to_pairs",
    "normalize_list_row",
    "normalize_unpaired_row",
    "pairs_of_list",
    "unpair",
]

PAIRS, LISTS, UNPAIRED = "pairs", "lists", "unpaired"  # the data shapes (prefzoo.Shape values)
PROMPTS = "prompts"  # prompts only: the data of on-policy training (--online), which samples the completions
SHAPE_COLUMNS = {
    PROMPTS: ["id", "prompt"],
    PAIRS: ["id", "prompt", "chosen", "rejected"],
    LISTS: ["id", "prompt", "completions", "scores"],
    UNPAIRED: ["id", "prompt", "completion", "label"],
}
PAIRS_FROM_LISTS = ("best-worst", "all-pairs", "best-vs-rest")  # --pairs-from-lists choices


def data_shape(ds: datasets.Dataset) -> str:
    """``pairs``, ``lists``, ``unpaired`` or ``prompts``: the shape of a normalized (or tokenized) dataset, read from
    its columns."""
    cols = set(ds.column_names)
    if {"completions", "completion_ids"} & cols:
        return LISTS
    if {"completion", "label"} <= cols:
        return UNPAIRED
    if "prompt" in cols and cols <= {"id", "prompt"}:
        return PROMPTS
    return PAIRS


def _where(rid: str, idx: int) -> str:
    return f"row {idx}" if rid == str(idx) else f"row {idx} (id {rid!r})"


def _answer(value: Any, where: str, field: str, rid: str) -> str:
    """A completion given as a string or as an assistant message list (its last message is the answer)."""
    if isinstance(value, list):
        msgs = check_messages(value, rid, field)
        if not msgs or msgs[-1]["role"] != "assistant":
            raise DataFormatError(f"{where}: field {field!r} must end with an assistant message (the answer)")
        return msgs[-1]["content"]
    return check_text(value, rid, field)


def _prompt(value: Any, rid: str, field: str) -> Any:
    if isinstance(value, str) or value is None:
        return check_text(value, rid, field)
    return check_messages(value, rid, field)


def _score(value: Any, where: str, field: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise DataFormatError(
            f"{where}: field {field!r} is {value!r}; scores must be numbers (higher is better): fix or drop the row"
        )
    if not math.isfinite(value):
        raise DataFormatError(
            f"{where}: field {field!r} is {value}; scores must be finite numbers: fix or drop the row"
        )
    return float(value)


def normalize_list_row(row: dict[str, Any], idx: int, rid: str, fmt: str) -> dict[str, Any]:
    """``{id, prompt, completions, scores}`` of one ``list`` or ``ultrafeedback-raw`` row, best first."""
    where = _where(rid, idx)
    comps = row.get("completions")
    if not isinstance(comps, list):
        raise DataFormatError(f"{where}: field 'completions' must be a list of completions, got {comps!r:.60}")
    if len(comps) < 2:
        raise DataFormatError(
            f"{where}: field 'completions' holds {len(comps)} completion(s); a list needs K >= 2 to rank: add "
            "completions or drop the row"
        )
    scores: list[float] | None
    if fmt == "ultrafeedback-raw":
        prompt: Any = [{"role": "user", "content": check_text(row.get("instruction"), rid, "instruction")}]
        texts, scores = [], []
        for k, c in enumerate(comps):
            if not isinstance(c, dict):
                raise DataFormatError(
                    f"{where}: field 'completions[{k}]' must be a mapping with 'response' and 'overall_score'"
                )
            texts.append(check_text(c.get("response"), rid, f"completions[{k}].response"))
            scores.append(_score(c.get("overall_score"), where, f"completions[{k}].overall_score"))
    else:
        prompt = _prompt(row.get("prompt"), rid, "prompt")
        texts = [_answer(c, where, f"completions[{k}]", rid) for k, c in enumerate(comps)]
        given = row.get("scores")
        if given is None:
            scores = None
        elif not isinstance(given, list) or len(given) != len(texts):
            n = len(given) if isinstance(given, list) else given
            raise DataFormatError(
                f"{where}: field 'scores' has {n} values for {len(texts)} completions; give one score per "
                "completion (or no 'scores' to rank by column order, best first)"
            )
        else:
            scores = [_score(s, where, f"scores[{k}]") for k, s in enumerate(given)]
    if scores is not None:  # best first; sorted() is stable, so tied completions keep their order
        order = sorted(range(len(texts)), key=lambda k: -scores[k])  # type: ignore[index]
        texts, scores = [texts[k] for k in order], [scores[k] for k in order]
    return {"id": rid, "prompt": prompt, "completions": texts, "scores": scores}


def normalize_unpaired_row(row: dict[str, Any], idx: int, rid: str) -> dict[str, Any]:
    """``{id, prompt, completion, label}`` of one TRL unpaired row (plain or conversational)."""
    where = _where(rid, idx)
    label = row.get("label")
    if not isinstance(label, bool):
        raise DataFormatError(
            f"{where}: field 'label' is {label!r}; it must be a boolean: true (desirable) or false (undesirable)"
        )
    completion = row.get("completion")
    if row.get("prompt") is None and isinstance(completion, list):  # implicit prompt: the turns before the answer
        msgs = check_messages(completion, rid, "completion")
        if len(msgs) < 2 or msgs[-1]["role"] != "assistant":
            raise DataFormatError(
                f"{where}: field 'completion' without a 'prompt' must be a conversation ending with the assistant "
                "answer; add a 'prompt' column"
            )
        return {"id": rid, "prompt": msgs[:-1], "completion": msgs[-1]["content"], "label": label}
    prompt = _prompt(row.get("prompt"), rid, "prompt")
    return {"id": rid, "prompt": prompt, "completion": _answer(completion, where, "completion", rid), "label": label}


def list_pairs(scores: list[float] | None, k: int, how: str) -> list[tuple[int, int]]:
    """(better, worse) column pairs of one best-first list of ``k`` completions under ``--pairs-from-lists how``.

    ``best-worst``: (first, worst); ``all-pairs``: every (i, j), i < j; ``best-vs-rest``: (first, j) for every j.
    With scores, a pair whose scores tie carries no preference and is left out; without scores every i < j is
    ranked by column order.
    """
    if how == "best-worst":  # the worst is the first column among tied worst ones (as prefzoo.pairs_from_lists)
        cand = [(0, k - 1 if scores is None else scores.index(min(scores)))]
    elif how == "all-pairs":
        cand = [(i, j) for i in range(k) for j in range(i + 1, k)]
    elif how == "best-vs-rest":
        cand = [(0, j) for j in range(1, k)]
    else:
        raise DataFormatError(f"--pairs-from-lists {how!r}: choose one of {', '.join(PAIRS_FROM_LISTS)}")
    return [(i, j) for i, j in cand if scores is None or scores[i] > scores[j]]


def pairs_of_list(row: dict[str, Any], how: str) -> list[dict[str, Any]]:
    """The pairs ``{id, prompt, chosen, rejected}`` of one normalized list under ``--pairs-from-lists how``."""
    comps = row["completions"]
    return [{"id": f"{row['id']}:{i}>{j}", "prompt": row["prompt"], "chosen": comps[i], "rejected": comps[j]}
            for i, j in list_pairs(row["scores"], len(comps), how)]  # fmt: skip


def list_rows_to_pairs(rows: list[dict[str, Any]], how: str) -> tuple[list[dict[str, Any]], int]:
    """:func:`lists_to_pairs` in memory, for a few rows made during a run (no ``datasets`` pass)."""
    found = [pairs_of_list(row, how) for row in rows]
    return [pair for pairs in found for pair in pairs], sum(not pairs for pairs in found)


def _tied(pairs: datasets.Dataset) -> int:
    """The marker rows of lists that gave no pair: counted by Arrow once, read back on a cache hit."""

    def count() -> dict[str, Any]:
        import pyarrow.compute as pc

        return {"tied": pc.sum(pairs.select_columns(["none"]).with_format("arrow")[:]["none"]).as_py() or 0}

    def check(value: dict[str, Any]) -> None:
        if set(value) != {"tied"} or type(value["tied"]) is not int or not 0 <= value["tied"] <= len(pairs):
            raise ValueError(f"tied must be an integer in [0, {len(pairs)}]: {value}")

    return int(cached_summary(pairs, "tied-lists", count, check)["tied"])


def lists_to_pairs(ds: datasets.Dataset, how: str) -> tuple[datasets.Dataset, int]:
    """(the pairs of every list under ``how``, number of lists that gave none: all their scores tie)."""
    list_pairs(None, 2, how)  # an unknown choice fails here, even on an empty dataset

    def expand(batch: dict[str, list[Any]]) -> dict[str, list[Any]]:
        out: dict[str, list[Any]] = {"id": [], "prompt": [], "chosen": [], "rejected": [], "none": []}
        for rid, prompt, comps, scores in zip(
            batch["id"], batch["prompt"], batch["completions"], batch["scores"], strict=True
        ):
            found = pairs_of_list({"id": rid, "prompt": prompt, "completions": comps, "scores": scores}, how)
            for pair in found:
                for k, v in pair.items():
                    out[k].append(v)
                out["none"].append(False)
            if not found:  # one marker row so the count survives the map; filtered out below
                out["id"].append(rid)
                out["prompt"].append(prompt)
                out["chosen"].append("")
                out["rejected"].append("")
                out["none"].append(True)
        return out

    pairs = ds.map(expand, batched=True, remove_columns=list(ds.column_names), desc=f"pairs from lists ({how})")
    tied = _tied(pairs)
    if tied:
        pairs = pairs.filter(lambda n: not n, input_columns="none", desc="dropping lists with no strict preference")
    if len(pairs) == 0:
        raise DataFormatError(
            f"--pairs-from-lists {how}: no list has two completions with different scores, so there is no pair"
        )
    return pairs.remove_columns("none"), tied


def unpair(ds: datasets.Dataset) -> datasets.Dataset:
    """TRL's ``unpair_preference_dataset``: each pair as a desirable chosen and an undesirable rejected example."""

    def split(batch: dict[str, list[Any]]) -> dict[str, list[Any]]:
        return {
            "id": [f"{i}:chosen" for i in batch["id"]] + [f"{i}:rejected" for i in batch["id"]],
            "prompt": batch["prompt"] + batch["prompt"],
            "completion": batch["chosen"] + batch["rejected"],
            "label": [True] * len(batch["id"]) + [False] * len(batch["id"]),
        }

    return ds.map(split, batched=True, remove_columns=list(ds.column_names), desc="unpairing pairs")
