"""Row-level validation of preference data: every malformed row is an error naming the row and the field.

Policy (docs/reliability.md):

- **Errors** (the run stops before any model loads, naming the row and field): a missing or ``None`` field, a value
  of the wrong type (a number where text belongs, a string where a message list belongs), text that is not valid
  UTF-8 (undecodable bytes in a file, lone surrogates), a message that is not ``{"role", "content"}`` with a known
  role and text content, a file line that is not a JSON object.
- **Counted skips** (``TokenizeStats``, printed at the start of training): completions with no token left (empty or
  whitespace answers), chosen identical to rejected after tokenization and truncation (no preference signal), and
  fields longer than :data:`MAX_TEXT_CHARS` characters (never tokenized).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

__all__ = [
    "ALLOWED_ROLES",
    "MAX_TEXT_CHARS",
    "DataFormatError",
    "check_messages",
    "check_text",
    "locate_file_error",
]

ALLOWED_ROLES = ("system", "user", "assistant", "tool")  # the roles chat templates know
MAX_TEXT_CHARS = 1_000_000  # a longer field is skipped (counted) instead of tokenized: ~250k tokens, far past any limit


class DataFormatError(ValueError):
    """The dataset is missing, empty, or its columns match no recognised preference format."""


def _kind(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, list):
        return "a list"
    if isinstance(value, dict):
        return "a mapping"
    return f"{type(value).__name__} {value!r:.40}"


def _check_unicode(text: str, where: str) -> None:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as e:
        raise DataFormatError(
            f"{where} is not valid Unicode text (lone surrogate {text[e.start]!r} at character {e.start}); "
            "fix the encoding of the data (it must be UTF-8)"
        ) from None


def check_text(value: Any, row_id: str, field: str) -> str:
    """``value`` if it is valid text, else a DataFormatError naming example ``row_id`` and ``field``."""
    where = f"example {row_id}: field {field!r}"
    if value is None:
        raise DataFormatError(f"{where} is missing (null); every pair needs it: fill it in or drop the row")
    if not isinstance(value, str):
        raise DataFormatError(f"{where} must be text, got {_kind(value)}; convert it to a string")
    _check_unicode(value, where)
    return value


def check_messages(value: Any, row_id: str, field: str) -> list[dict[str, str]]:
    """``value`` as a list of ``{role, content}`` messages with known roles and text content, or a named error."""
    where = f"example {row_id}: field {field!r}"
    if value is None:
        raise DataFormatError(f"{where} is missing (null); it must be a list of {{role, content}} messages")
    if not isinstance(value, list):
        raise DataFormatError(f"{where} must be a list of {{role, content}} messages, got {_kind(value)}")
    out = []
    for n, m in enumerate(value):
        if not isinstance(m, dict) or "role" not in m or "content" not in m:
            raise DataFormatError(f"{where}[{n}] must be a {{role, content}} message, got {str(m)[:80]!r}")
        if m["role"] not in ALLOWED_ROLES:
            raise DataFormatError(f"{where}[{n}] has role {m['role']!r}; use one of {', '.join(ALLOWED_ROLES)}")
        out.append({"role": m["role"], "content": check_text(m["content"], row_id, f"{field}[{n}].content")})
    return out


def _family(kind: str) -> str:
    """'int 3' and 'float 4.5' are one family (a number): the type, without the value."""
    if kind.startswith("a "):
        return kind
    name = kind.split(" ", 1)[0]
    return "a number" if name in ("int", "float") else name


def _walk_strings(value: Any, path: str) -> tuple[str, str] | None:
    """The first (path, text) in a parsed JSON value whose text is not encodable as UTF-8."""
    if isinstance(value, str):
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            return path, value
    elif isinstance(value, list):
        for i, v in enumerate(value):
            if (hit := _walk_strings(v, f"{path}[{i}]")) is not None:
                return hit
    elif isinstance(value, dict):
        for k, v in value.items():
            if (hit := _walk_strings(v, f"{path}.{k}" if path else str(k))) is not None:
                return hit
    return None


def _rows_of(path: Path, raw: bytes) -> list[tuple[int, Any]]:
    """(line number, parsed value) of every record in a JSON-lines file or a JSON array file."""
    if raw.lstrip().startswith(b"["):  # one JSON array of records, or JSON lines whose first line is an array
        try:
            whole = json.loads(raw.decode("utf-8"))
        except (UnicodeDecodeError, json.JSONDecodeError):
            whole = None
        if isinstance(whole, list):
            return [(n + 1, r) for n, r in enumerate(whole)]
    rows = []
    for n, line in enumerate(raw.split(b"\n"), start=1):
        if not line.strip():
            continue
        try:
            text = line.decode("utf-8")
        except UnicodeDecodeError as e:
            raise DataFormatError(
                f"--dataset {path}: line {n}: invalid UTF-8 (byte {line[e.start]:#04x} at byte {e.start} of the "
                "line); re-encode the file as UTF-8"
            ) from None
        try:
            rows.append((n, json.loads(text)))
        except json.JSONDecodeError as e:
            raise DataFormatError(f"--dataset {path}: line {n}: invalid JSON ({e.msg} at column {e.colno})") from None
    return rows


def locate_file_error(path: str | Path) -> Exception | None:
    """A DataFormatError naming the first bad line of a JSON/JSON-lines file, or None if no line is at fault.

    Called only after a loader failed, so good files pay nothing.  Finds undecodable bytes, invalid JSON, lines that
    are not objects, strings with lone surrogates, and a field whose type differs between lines (arrow cannot store
    mixed types in one column; ``datasets`` falls back to JSON values, which turns the text "0" into the number 0).
    Of two conflicting lines it names the one holding a type that is never valid (a number, a mapping), else the one
    against the majority.
    """
    p = Path(path)
    if p.suffix.lower() not in (".json", ".jsonl"):
        return None
    raw = p.read_bytes()
    try:
        rows = _rows_of(p, raw)
    except UnicodeDecodeError as e:
        return DataFormatError(f"--dataset {path}: invalid UTF-8 at byte {e.start}; re-encode the file as UTF-8")
    except Exception as e:  # the DataFormatError built above
        return e
    kinds: dict[str, list[tuple[int, str]]] = {}  # field -> [(line, kind)], nulls left out
    for n, row in rows:
        if not isinstance(row, dict):
            return DataFormatError(
                f"--dataset {path}: line {n}: expected a JSON object (one pair per line), got {_kind(row)}"
            )
        hit = _walk_strings(row, "")
        if hit is not None:
            return DataFormatError(
                f"--dataset {path}: line {n}: field {hit[0]!r} is not valid Unicode text (a lone surrogate escape "
                "such as \\ud800); fix the encoding of the data"
            )
        for k, v in row.items():
            if v is not None:
                kinds.setdefault(k, []).append((n, _kind(v)))
    for field, seq in kinds.items():
        if len({_family(k) for _, k in seq}) < 2:
            continue
        fams = [_family(k) for _, k in seq]
        majority = max(set(fams), key=lambda f: (fams.count(f), f in ("a string", "a list")))
        # blame a value that is never valid first (a number, a mapping), else one against the majority
        n, kind = next(((n, k) for n, k in seq if _family(k) not in ("a string", "a list")), None) or next(
            (n, k) for n, k in seq if _family(k) != majority
        )
        m, other = next((m, k) for m, k in seq if _family(k) != _family(kind))
        return DataFormatError(
            f"--dataset {path}: line {n}: field {field!r} is {kind}, but line {m} has {other}; one column must hold "
            "one type: text, or a list of {role, content} messages (see the formats in docs/training.md)"
        )
    return None
