"""Several preference datasets as one: ``--dataset a.jsonl --dataset b.parquet:0.3`` (or a YAML list).

Each source is ``PATH[:WEIGHT]`` (a string) or, in YAML, ``{path: ..., weight: ..., split: ...}``.  Every source is
loaded and normalized on its own (formats may differ), and its ids are prefixed with its position (``0:``, ``1:``)
so that equal ids in two files stay distinct.

- No weights: the sources are concatenated (``datasets.concatenate_datasets``), every row kept.
- Weights: rows are drawn at random with those probabilities (``datasets.interleave_datasets``, seeded, stopping
  when the first source runs out, as LLaMA-Factory's ``interleave_under``).  A weight is the source's share of the
  mix; sources without one share what the given weights leave (``a --dataset b:0.3``: 70% a, 30% b).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from prefzoo.data.formats import FORMAT_PREFIX, DataFormatError, detected_format, load_preference_dataset
from prefzoo.data.shapes import data_shape

if TYPE_CHECKING:
    import datasets

__all__ = ["Source", "load_mixture", "parse_sources"]


@dataclass(frozen=True)
class Source:
    path: str  # file, folder or hub name
    weight: float | None = None  # share of the mix; None = an equal part of what the others leave
    split: str | None = None  # None = the run's split (train_split / eval_split)


def _parse_one(item: Any) -> Source:
    if isinstance(item, dict):
        unknown = sorted(set(item) - {"path", "weight", "split"})
        if unknown or "path" not in item:
            raise DataFormatError(
                f"dataset entry {item}: give path (and optionally weight, split); unknown keys {unknown}"
            )
        weight = item.get("weight")
        return Source(str(item["path"]), None if weight is None else _weight(weight, item), item.get("split"))
    text = str(item)
    head, sep, tail = text.rpartition(":")
    try:
        weight = float(tail) if sep and head else None
    except ValueError:
        weight = None  # a colon that is part of the name
    return Source(head, _weight(weight, text)) if weight is not None else Source(text)


def _weight(value: Any, where: Any) -> float:
    w = float(value)
    if not 0.0 < w <= 1.0:
        raise DataFormatError(f"--dataset {where}: weight {w:g} must be in (0, 1] (the source's share of the mix)")
    return w


def parse_sources(spec: str | list[Any]) -> list[Source]:
    """The sources of ``--dataset`` (one string, or the list of repeated flags / YAML entries)."""
    items = spec if isinstance(spec, list) else [spec]
    if not items:
        raise DataFormatError("--dataset: no dataset given")
    return [_parse_one(i) for i in items]


def _probabilities(sources: list[Source]) -> list[float] | None:
    given = [s.weight for s in sources if s.weight is not None]
    if not given:
        return None
    total, free = sum(given), sum(s.weight is None for s in sources)
    if total > 1.0 + 1e-9 or (free == 0 and abs(total - 1.0) > 1e-6) or (free and total >= 1.0):
        weights = ", ".join(f"{s.path}:{s.weight if s.weight is not None else '?'}" for s in sources)
        raise DataFormatError(
            f"--dataset weights {weights}: weights are shares of the mix; they must sum to 1, or to less than 1 "
            "when some sources have no weight (those share the rest)"
        )
    rest = (1.0 - total) / free if free else 0.0
    return [s.weight if s.weight is not None else rest for s in sources]


def load_mixture(spec: str | list[Any], split: str, fmt: str | None, seed: int) -> datasets.Dataset:
    """The normalized pairs of every source of ``spec`` (one split), concatenated or interleaved by weight."""
    import datasets

    sources = parse_sources(spec)
    if len(sources) == 1 and sources[0].weight is None and sources[0].split is None:
        return load_preference_dataset(sources[0].path, split, fmt)
    probs = _probabilities(sources)  # bad weights fail before anything loads
    parts, formats = [], []
    for i, s in enumerate(sources):
        ds = load_preference_dataset(s.path, s.split or split, fmt)
        formats.append(f"{detected_format(ds)} ({s.path})")
        parts.append(ds.map(lambda row, i=i: {"id": f"{i}:{row['id']}"}, desc=f"naming ids of source {i}"))
    shapes = {data_shape(p) for p in parts}
    if len(shapes) > 1:
        raise DataFormatError(
            f"--dataset sources {', '.join(formats)} hold different data shapes ({', '.join(sorted(shapes))}), which "
            "cannot be mixed in one run; mix sources of one shape (pairs, lists or unpaired examples)"
        )
    kinds = {str(p.features["prompt"]) for p in parts}
    if len(kinds) > 1:
        raise DataFormatError(
            f"--dataset sources {', '.join(formats)} mix string prompts with conversations, which cannot share one "
            "column; convert the string prompts to [{'role': 'user', 'content': ...}] messages (or the reverse)"
        )
    if probs is None:
        out = datasets.concatenate_datasets(parts)
    else:
        out = datasets.interleave_datasets(parts, probabilities=probs, seed=seed, stopping_strategy="first_exhausted")
    out.info.description = FORMAT_PREFIX + " + ".join(formats)
    return out
