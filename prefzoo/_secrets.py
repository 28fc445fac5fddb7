"""Secrets kept out of what a run writes: a value under a key named like a secret is replaced by ``REDACTED``.

A key is a secret by its name, split into words (``hf_token``, ``openaiApiKey``, ``api-key``): a word such as
``token``, ``key``, ``secret``, ``password``, ``passwd``, ``auth`` or ``credential`` marks it, so ``max_new_tokens``
or ``keep_dropout`` do not.  The run card, the model card, the trackers' config and log lines go through
:func:`redact`; the values themselves still reach the judge or callback that asked for them.
"""

from __future__ import annotations

import re
from typing import Any

__all__ = ["REDACTED", "is_secret_name", "redact"]

REDACTED = "<redacted>"
_SECRET_WORDS = frozenset({"token", "key", "apikey", "secret", "secrets", "password", "passwd", "pwd", "passphrase",
                           "auth", "authorization", "credential", "credentials", "cookie", "bearer"})  # fmt: skip
_WORDS = re.compile(r"[A-Z]?[a-z0-9]+|[A-Z]+(?![a-z])")
_PAIR = re.compile(r"([A-Za-z_][\w.-]*)(\s*=\s*)([^,]*)")  # KEY=VALUE in 'k=v,k2=v2' and 'module:Class:k=v'


def is_secret_name(name: str) -> bool:
    """Whether a key named ``name`` holds a secret (its words, camelCase or snake_case, include a secret's word)."""
    return any(word.lower() in _SECRET_WORDS for word in _WORDS.findall(str(name)))


def redact(value: Any) -> Any:
    """``value`` with every secret replaced by :data:`REDACTED`: mapping values under a secret's key, and the value
    of each ``KEY=VALUE`` in a string (``--judge-params api_key=...``, a callback's ``module:Class:token=...``);
    lists and nested mappings are walked.  Other values come back as they are (a new container, never the same)."""
    if isinstance(value, dict):
        return {k: REDACTED if is_secret_name(str(k)) and v is not None else redact(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return type(value)(redact(v) for v in value)
    if isinstance(value, str) and "=" in value:
        whole = _PAIR.match(value.strip())  # one KEY=VALUE option (--judge-params): all after '=' is the value
        if whole is not None and is_secret_name(whole.group(1)):
            return whole.group(1) + "=" + REDACTED
        return _PAIR.sub(lambda m: m.group(1) + m.group(2) + (REDACTED if is_secret_name(m.group(1)) else m.group(3)),
                         value)  # fmt: skip
    return value
