"""``datasets.map`` with its on-disk cache checked: a corrupt or truncated cache file is rebuilt, never used.

``datasets`` reuses ``cache-<fingerprint>.arrow`` files next to the source data.  A run killed while one was
written (or a disk that filled up) can leave it truncated; loading it then fails deep inside pyarrow, or, cut at a
record-batch boundary, could return fewer rows.  :func:`checked_map` catches both (an Arrow error, or a row count
other than the input's) and recomputes the map without the cache, which also overwrites the bad file.

:func:`cached_summary` keeps what a run computes *about* a mapped dataset (its row counts) next to the cached file,
under the dataset's fingerprint, so a second run reads a small JSON file instead of whole columns: a cache hit costs
the same at 1,000 and 100,000 rows.  The file is written atomically and carries the fingerprint, the row count and a
checksum; a missing, unreadable or mismatched one is recomputed (and rewritten), never trusted.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from prefzoo._thirdparty import dataset_fingerprint
from prefzoo.types import error_summary

__all__ = ["cached_summary", "checked_map"]

SUMMARY_VERSION = 1  # bump when a summary's meaning changes: older files are then recomputed

log = logging.getLogger(__name__)


def _where(ds: Any) -> str:
    files = getattr(ds, "cache_files", None) or []
    return str(Path(files[0]["filename"]).parent) if files else "the datasets cache"


def checked_map(ds: Any, fn: Any, *, method: str = "map", rows: int | None = None, **kwargs: Any) -> Any:
    """``ds.map(fn, **kwargs)`` (or ``ds.filter`` with ``method``), expecting ``rows`` rows (default: as many as
    ``ds``); a corrupt cache is logged and rebuilt."""
    import pyarrow

    expected = len(ds) if rows is None else rows
    try:
        out = getattr(ds, method)(fn, **kwargs)
        if len(out) == expected:
            return out
        why = f"{len(out)} rows cached where {expected} were expected"
    except (pyarrow.ArrowException, OSError) as e:  # a truncated file fails as either
        why = error_summary(e, 200)
    log.warning("corrupt tokenised-dataset cache in %s (%s): rebuilding it", _where(ds), why)
    return getattr(ds, method)(fn, load_from_cache_file=False, **kwargs)


def _checksum(body: dict[str, Any]) -> str:
    return hashlib.sha256(json.dumps(body, sort_keys=True).encode()).hexdigest()


def _summary_path(ds: Any, name: str) -> Path | None:
    """``prefzoo-<name>-<fingerprint>.json`` beside ``ds``'s cache file; None for an in-memory dataset."""
    files = getattr(ds, "cache_files", None) or []
    fingerprint = dataset_fingerprint(ds)
    if not files or not fingerprint:
        return None
    return Path(files[0]["filename"]).parent / f"prefzoo-{name}-{fingerprint}.json"


def _read_summary(path: Path, ds: Any, check: Callable[[dict[str, Any]], Any]) -> tuple[dict[str, Any] | None, str]:
    """(the stored value, '') or (None, why it cannot be used)."""
    try:
        stored = json.loads(path.read_text())
        body, digest = stored["body"], stored["sha256"]
        if _checksum(body) != digest:
            return None, "checksum mismatch"
        if (body["version"], body["fingerprint"], body["rows"]) != (SUMMARY_VERSION, dataset_fingerprint(ds), len(ds)):
            return None, f"written for another dataset or version ({body['rows']} rows, this one {len(ds)})"
        check(body["value"])
    except (OSError, ValueError, KeyError, TypeError) as e:  # JSONDecodeError is a ValueError
        return None, error_summary(e, 200)
    return body["value"], ""


def _write_summary(path: Path, ds: Any, value: dict[str, Any]) -> None:
    body = {"version": SUMMARY_VERSION, "fingerprint": dataset_fingerprint(ds), "rows": len(ds), "value": value}
    try:
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
        with os.fdopen(fd, "w") as f:
            json.dump({"body": body, "sha256": _checksum(body)}, f)
        os.replace(tmp, path)  # atomic: a reader sees the old file or the whole new one
    except OSError as e:  # a read-only cache folder: the counts are right, only the next run recomputes them
        log.warning("cannot store the counts of %s (%s): the next run recomputes them", path, error_summary(e, 200))


def cached_summary(
    ds: Any, name: str, compute: Callable[[], dict[str, Any]], check: Callable[[dict[str, Any]], Any]
) -> dict[str, Any]:
    """``compute()`` (a JSON-able summary of ``ds``, e.g. row counts), stored beside ``ds``'s cache file under its
    fingerprint and read back by later runs instead of recomputed.  ``check(value)`` raises (ValueError, KeyError,
    TypeError) on a value that cannot be right; a stored value failing it, its checksum, fingerprint or row count is
    logged and recomputed.  An in-memory dataset (no cache file) is always computed."""
    path = _summary_path(ds, name)
    if path is not None and path.is_file():
        value, why = _read_summary(path, ds, check)
        if value is not None:
            return value
        log.warning("corrupt dataset summary %s (%s): recomputing it", path, why)
    value = compute()
    check(value)
    if path is not None:
        _write_summary(path, ds, value)
    return value
