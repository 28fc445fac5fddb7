"""``datasets.map`` with its on-disk cache checked: a corrupt or truncated cache file is rebuilt, never used.

``datasets`` reuses ``cache-<fingerprint>.arrow`` files next to the source data.  A run killed while one was
written (or a disk that filled up) can leave it truncated; loading it then fails deep inside pyarrow, or, cut at a
record-batch boundary, could return fewer rows.  :func:`checked_map` catches both (an Arrow error, or a row count
other than the input's) and recomputes the map without the cache, which also overwrites the bad file.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from prefzoo.types import error_summary

__all__ = ["checked_map"]

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
