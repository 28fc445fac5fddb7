"""Load preference data from the hub or local files and normalize every known format to {id, prompt, chosen, rejected}.

Recognised formats (auto-detected from the columns, or forced with ``format=``):

- ``plain``: ``prompt``, ``chosen``, ``rejected`` strings.
- ``conversational`` (TRL): ``chosen``/``rejected`` message lists, with an optional ``prompt`` message list;
  without one, the shared message prefix of chosen and rejected is the prompt.
- ``ultrafeedback`` (UltraFeedback-binarized): ``prompt`` string, ``chosen``/``rejected`` message lists whose last
  message is the assistant answer; the prompt is the conversation before that final assistant turn.
- ``orca`` (Orca-DPO-pairs): ``system``, ``question``, ``chosen``, ``rejected`` strings.
- ``ultrafeedback-raw``, ``list`` (K ranked or scored completions per prompt) and ``unpaired`` (TRL's KTO format):
  see :mod:`prefzoo.data.shapes`, which normalizes them to lists ``{id, prompt, completions, scores}`` and unpaired
  examples ``{id, prompt, completion, label}``.

After normalization ``prompt`` is a string (plain) or a list of ``{"role", "content"}`` messages, and ``chosen`` and
``rejected`` are the completion strings.
"""

from __future__ import annotations

import difflib
import math
from pathlib import Path
from typing import TYPE_CHECKING, Any

from prefzoo.data.cache import cached_summary, checked_map
from prefzoo.data.shapes import SHAPE_COLUMNS, normalize_list_row, normalize_unpaired_row
from prefzoo.data.validate import DataFormatError, check_messages, check_text, locate_file_error

if TYPE_CHECKING:
    import datasets

__all__ = [
    "FORMATS",
    "DataFormatError",
    "detect_format",
    "detected_format",
    "load_preference_dataset",
    "normalize",
    "normalize_rows",
]

FORMATS = ("plain", "conversational", "ultrafeedback", "orca", "ultrafeedback-raw", "list", "unpaired", "prompts")
_SHAPE_OF = {"ultrafeedback-raw": "lists", "list": "lists", "unpaired": "unpaired", "prompts": "prompts"}  # else pairs
_FORMAT_COLUMNS = {
    "plain": "prompt (str), chosen (str), rejected (str)",
    "conversational": "chosen (messages), rejected (messages), optional prompt (messages)",
    "ultrafeedback": "prompt (str), chosen (messages ending in the assistant answer), rejected (messages)",
    "orca": "system (str), question (str), chosen (str), rejected (str)",
    "ultrafeedback-raw": "instruction (str), completions (list of {response, overall_score})",
    "list": "prompt, completions (list of K >= 2), optional scores (one number per completion)",
    "unpaired": "prompt, completion, label (bool: true = desirable)",
    "prompts": "prompt only (string or messages): on-policy training (--online)",
}
_LOCAL_BUILDERS = {".json": "json", ".jsonl": "json", ".parquet": "parquet", ".csv": "csv"}


FORMAT_PREFIX = "prefzoo format: "


def detected_format(ds: datasets.Dataset) -> str | None:
    """The format :func:`normalize` detected (or was given) for ``ds``; None for data it did not normalize."""
    desc = ds.info.description or ""
    return desc[len(FORMAT_PREFIX) :] if desc.startswith(FORMAT_PREFIX) else None


def _recognised() -> str:
    return "; ".join(f"{k}: {v}" for k, v in _FORMAT_COLUMNS.items())


def _is_messages(value: Any) -> bool:
    return isinstance(value, list) and all(isinstance(m, dict) and "role" in m and "content" in m for m in value)


def detect_format(columns: list[str], first_row: dict[str, Any]) -> str:
    """The name of the format whose columns ``columns`` hold, or a :class:`DataFormatError` naming what is missing."""
    cols = set(columns)
    if {"instruction", "completions"} <= cols and isinstance(first_row.get("completions"), list):
        return "ultrafeedback-raw"
    if {"prompt", "completions"} <= cols:
        return "list"
    if {"completion", "label"} <= cols:
        return "unpaired"
    if "prompt" in cols and not cols & {"chosen", "rejected", "completion", "completions", "question"}:
        return "prompts"
    if {"question", "chosen", "rejected"} <= cols:
        return "orca"
    if {"chosen", "rejected"} <= cols:
        chosen_is_msgs = _is_messages(first_row.get("chosen"))
        if chosen_is_msgs and isinstance(first_row.get("prompt"), str):
            return "ultrafeedback"
        if chosen_is_msgs:
            return "conversational"
        if "prompt" in cols:
            return "plain"
    missing = sorted({"prompt", "chosen", "rejected"} - cols)
    hint = ""
    lower = {c.lower(): c for c in columns if c not in ("prompt", "chosen", "rejected")}
    for want in missing:
        near = difflib.get_close_matches(want, list(lower), n=1, cutoff=0.75)  # 'Prompt', 'rejeted', 'choosen'
        if near:
            hint += f" (column {lower[near[0]]!r}: did you mean {want!r}? rename it)"
    raise DataFormatError(
        f"dataset columns {sorted(cols)} match no preference format: missing {missing}{hint}. "
        f"Recognised formats: {_recognised()}. Rename the columns or pass --format."
    )


def _msg(role: str, content: str) -> dict[str, str]:
    return {"role": role, "content": content}


def _last_assistant(messages: list[dict[str, Any]], column: str, row_id: str) -> str:
    if not messages or messages[-1].get("role") != "assistant":  # (roles were checked by check_messages)
        raise DataFormatError(
            f"example {row_id}: column {column!r} must be a message list ending with an assistant message "
            f"(the answer), got roles {[m.get('role') for m in messages]}"
        )
    return str(messages[-1]["content"])


def _plain_messages(messages: list[dict[str, Any]]) -> list[dict[str, str]]:
    return [_msg(str(m["role"]), str(m["content"])) for m in messages]


def _row_id(row: dict[str, Any], idx: int) -> str:
    if row.get("id") is not None:
        return str(row["id"])
    if row.get("prompt_id") is not None:
        return str(row["prompt_id"])
    return str(idx)


def _normalize_row(row: dict[str, Any], idx: int, fmt: str) -> dict[str, Any]:
    rid = _row_id(row, idx)
    if fmt in ("list", "ultrafeedback-raw"):
        return normalize_list_row(row, idx, rid, fmt)
    if fmt == "unpaired":
        return normalize_unpaired_row(row, idx, rid)
    if fmt == "prompts":
        value = row.get("prompt")
        return {"id": rid, "prompt": check_text(value, rid, "prompt") if isinstance(value, str) or value is None
                else check_messages(value, rid, "prompt")}  # fmt: skip
    if fmt == "plain":
        texts = {col: check_text(row.get(col), rid, col) for col in ("prompt", "chosen", "rejected")}
        return {"id": rid, **texts}
    if fmt == "orca":
        prompt = [_msg("user", check_text(row.get("question"), rid, "question"))]
        if row.get("system"):
            prompt.insert(0, _msg("system", check_text(row["system"], rid, "system")))
        answers = {col: check_text(row.get(col), rid, col) for col in ("chosen", "rejected")}
        return {"id": rid, "prompt": prompt, **answers}
    chosen_msgs = check_messages(row.get("chosen"), rid, "chosen")  # known roles, text contents, or a named error
    rejected_msgs = check_messages(row.get("rejected"), rid, "rejected")
    if fmt == "ultrafeedback" and row.get("prompt") is not None:
        check_text(row["prompt"], rid, "prompt")
    elif row.get("prompt") is not None and not isinstance(row["prompt"], str):
        check_messages(row["prompt"], rid, "prompt")
    chosen = _last_assistant(chosen_msgs, "chosen", rid)
    rejected = _last_assistant(rejected_msgs, "rejected", rid)
    if fmt == "conversational" and _is_messages(row.get("prompt")) and row.get("prompt"):
        # explicit prompt (TRL): the conversation is prompt + any turns before the final answer
        prompt = _plain_messages(row["prompt"]) + _plain_messages(chosen_msgs[:-1])
        return {"id": rid, "prompt": prompt, "chosen": chosen, "rejected": rejected}
    prefix_w, prefix_l = _plain_messages(chosen_msgs[:-1]), _plain_messages(rejected_msgs[:-1])
    if prefix_w != prefix_l:
        raise DataFormatError(
            f"example {rid}: chosen and rejected conversations differ before the final assistant turn; "
            "the prompt must be their shared prefix"
        )
    if not prefix_w:
        if fmt == "ultrafeedback" and isinstance(row.get("prompt"), str):
            prefix_w = [_msg("user", row["prompt"])]
        else:
            raise DataFormatError(f"example {rid}: no prompt (no messages before the final assistant turn)")
    return {"id": rid, "prompt": prefix_w, "chosen": chosen, "rejected": rejected}


def _first_complete_row(ds: datasets.Dataset) -> dict[str, Any]:
    """The first of the first 100 rows with a non-null ``chosen`` or ``completions`` (format detection must not trip
    on one bad row)."""
    head = ds.select(range(min(len(ds), 100)))
    return next((r for r in head if r.get("chosen") is not None or r.get("completions") is not None), head[0])


SCORE_COLUMNS = ("score_chosen", "score_rejected")  # optional per-pair scores (UltraFeedback's names), kept if present


def _scores(row: dict[str, Any], idx: int, scored: bool) -> dict[str, float]:
    """The pair's ``score_chosen``/``score_rejected`` as floats; a missing or non-numeric one names the row."""
    if not scored:
        return {}
    out = {}
    for col in SCORE_COLUMNS:
        value = row.get(col)
        if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
            raise DataFormatError(f"row {_row_id(row, idx)!r}: column {col!r} = {value!r} is not a finite number")
        out[col] = float(value)
    return out


def normalize(ds: datasets.Dataset, fmt: str | None = None) -> datasets.Dataset:
    """``ds`` converted to columns {id, prompt, chosen, rejected} (lists and unpaired formats: the columns of
    :data:`prefzoo.data.shapes.SHAPE_COLUMNS`); ``fmt=None`` detects the format."""
    if len(ds) == 0:
        raise DataFormatError("the dataset (or the selected split) is empty: it holds no preference pairs")
    if fmt is None:
        fmt = detect_format(list(ds.column_names), _first_complete_row(ds))
    elif fmt not in FORMATS:
        raise DataFormatError(f"--format {fmt!r} is not a recognised format; choose one of {', '.join(FORMATS)}")
    else:
        detect_format(list(ds.column_names), _first_complete_row(ds))  # still names missing columns clearly
    # ODPO's offset reads a pair's scores when the data has them (pair formats)
    scored = set(SCORE_COLUMNS) <= set(ds.column_names) and _SHAPE_OF.get(fmt, "pairs") == "pairs"
    out = checked_map(
        ds,
        lambda row, idx: {**_normalize_row(row, idx, fmt), **_scores(row, idx, scored)},
        with_indices=True,
        remove_columns=list(ds.column_names),
        desc=f"normalizing {fmt} data",
    )
    out = out.select_columns([*SHAPE_COLUMNS[_SHAPE_OF.get(fmt, "pairs")], *(SCORE_COLUMNS if scored else ())])
    out.info.description = f"{FORMAT_PREFIX}{fmt}"  # read back by detected_format() for the start-of-run report
    if _duplicated_ids(out):  # duplicated ids would break reference caching: make them unique
        out = checked_map(out, lambda row, idx: {"id": f"{row['id']}#{idx}"}, with_indices=True)
    return out


def _duplicated_ids(ds: datasets.Dataset) -> int:
    """How many rows repeat an earlier row's id: counted by Arrow once, then read back on a cache hit."""

    def count() -> dict[str, Any]:
        import pyarrow.compute as pc

        ids = ds.select_columns(["id"]).with_format("arrow")[:]["id"]
        return {"duplicated_ids": len(ds) - pc.count_distinct(ids, mode="all").as_py()}

    def check(value: dict[str, Any]) -> None:
        if set(value) != {"duplicated_ids"} or type(value["duplicated_ids"]) is not int or \
                not 0 <= value["duplicated_ids"] < len(ds):  # fmt: skip
            raise ValueError(f"duplicated_ids must be an integer in [0, {len(ds)}): {value}")

    return int(cached_summary(ds, "ids", count, check)["duplicated_ids"])


def normalize_rows(rows: list[dict[str, Any]], fmt: str) -> list[dict[str, Any]]:
    """:func:`normalize` in memory for rows of a known format (no ``datasets`` pass): rows made during a run."""
    if fmt not in FORMATS:
        raise DataFormatError(f"--format {fmt!r} is not a recognised format; choose one of {', '.join(FORMATS)}")
    return [_normalize_row(row, idx, fmt) for idx, row in enumerate(rows)]


def load_preference_dataset(source: str, split: str = "train", fmt: str | None = None) -> datasets.Dataset:
    """Load ``split`` of a local file/folder or hub dataset ``source`` and normalize it.

    ``source`` is a ``.json``/``.jsonl``/``.parquet``/``.csv`` file, a folder of such files, a ``save_to_disk``
    folder, or a hub name (``load_dataset(source, split=split)``).
    """
    import datasets

    path = Path(source).expanduser()
    if path.is_file():
        builder = _LOCAL_BUILDERS.get(path.suffix.lower())
        if builder is None:
            raise DataFormatError(
                f"--dataset {source}: unsupported file type {path.suffix!r}; use one of {sorted(_LOCAL_BUILDERS)}"
            )
        if split not in ("train", None):
            raise DataFormatError(f"--dataset {source} is one file (split 'train'); split {split!r} does not exist")
        if path.stat().st_size == 0 or (path.stat().st_size < 4096 and not path.read_bytes().strip()):
            raise DataFormatError(f"--dataset {source}: the file is empty; give a file with one example per row")
        try:
            ds = datasets.load_dataset(builder, data_files={"train": str(path)}, split="train")
        except Exception as e:  # name the bad line (undecodable bytes, invalid JSON, mixed types) instead
            located = locate_file_error(path)
            why = f"--dataset {source}: cannot be read as {builder}: {_first_line(e)}"
            raise (located or DataFormatError(why)) from e
        if any(type(f).__name__ == "Json" for f in ds.features.values()):
            # a column with mixed types is kept as JSON values, and the string "0" comes back as the number 0:
            # name the line whose type differs instead of blaming a good row later
            located = locate_file_error(path)
            if located is not None:
                raise located
    elif path.is_dir():
        if (path / "dataset_info.json").exists() or (path / "dataset_dict.json").exists():
            loaded = datasets.load_from_disk(str(path))
            ds = _pick_split(loaded, split, source)
        else:
            files = {suf: sorted(str(p) for p in path.iterdir() if p.suffix.lower() == suf) for suf in _LOCAL_BUILDERS}
            found = [(suf, fs) for suf, fs in files.items() if fs]
            if not found:
                raise DataFormatError(f"--dataset {source}: folder holds no {sorted(_LOCAL_BUILDERS)} files")
            suf, fs = found[0]
            by_split = {s: [f for f in fs if Path(f).stem.startswith(s)] for s in ("train", "validation", "test")}
            data_files = {s: f for s, f in by_split.items() if f} or {"train": fs}
            ds = _pick_split(datasets.load_dataset(_LOCAL_BUILDERS[suf], data_files=data_files), split, source)
    elif source.startswith((".", "/", "~")) or path.suffix.lower() in _LOCAL_BUILDERS:
        raise DataFormatError(f"--dataset {source}: no such file or folder")
    else:
        try:
            ds = datasets.load_dataset(source, split=split)
        except ValueError as e:
            raise DataFormatError(f"--dataset {source}: cannot load split {split!r}: {e}") from None
        except OSError as e:  # ConnectionError offline, DatasetNotFoundError: one line, not datasets' traceback
            raise DataFormatError(_hub_failure(source, e)) from None
    try:
        return normalize(ds, fmt)
    except UnicodeDecodeError as e:  # arrow stores undecodable bytes and fails only when a row is read
        located = locate_file_error(path) if path.is_file() else None
        why = f"--dataset {source}: text that is not valid UTF-8 ({e}); re-encode the data as UTF-8"
        raise (located or DataFormatError(why)) from e


def _hub_failure(source: str, e: OSError) -> str:
    """Why the hub dataset ``source`` did not load, and what to do: offline, or a name the hub does not have."""
    import datasets

    if datasets.config.HF_HUB_OFFLINE or "OfflineModeIsEnabled" in str(e):
        return (
            f"--dataset {source}: a hub dataset name, and the hub is offline (HF_HUB_OFFLINE/HF_DATASETS_OFFLINE is "
            f"set) with no copy in the cache; download it where there is network (hf download {source} "
            "--repo-type dataset), or give a local file or folder"
        )
    return (
        f"--dataset {source}: cannot be loaded from the hub ({_first_line(e)}); check the name and your network, "
        "or give a local file or folder"
    )


def _first_line(e: BaseException) -> str:
    cause = e.__cause__ or e.__context__  # datasets wraps the reader's own (clearer) error
    text = str(cause if cause is not None and str(cause) else e).strip()
    return f"{type(e).__name__}: {text.splitlines()[0][:300] if text else ''}"


def _pick_split(loaded: Any, split: str, source: str) -> datasets.Dataset:
    import datasets

    if isinstance(loaded, datasets.Dataset):
        return loaded
    if split not in loaded:
        raise DataFormatError(f"--dataset {source}: no split {split!r}; available splits: {sorted(loaded)}")
    return loaded[split]
