"""Attribute helpers: :func:`temporarily` sets an attribute for one block and then puts back what was there;
:func:`field_defaults` reads a dataclass's defaults."""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Iterator
from typing import Any

__all__ = ["field_defaults", "temporarily"]


@contextlib.contextmanager
def temporarily(obj: Any, name: str, value: Any) -> Iterator[None]:
    """Within the block ``obj.<name>`` is ``value``; after it, what it was (on an exception too).

    An attribute the change added to the instance itself (over a class attribute or a method, such as a module's
    ``forward``) is deleted again rather than left holding the old value; a property is set back through its setter.
    """
    old = getattr(obj, name)
    was_own = name in getattr(obj, "__dict__", {})
    setattr(obj, name, value)
    added = not was_own and name in getattr(obj, "__dict__", {})
    try:
        yield
    finally:
        if added:
            delattr(obj, name)
        else:
            setattr(obj, name, old)


def field_defaults(cls: type) -> dict[str, Any]:
    """Every field of dataclass ``cls`` that has a default, with it (a ``default_factory`` called once)."""
    out = {}
    for f in dataclasses.fields(cls):
        if f.default is not dataclasses.MISSING:
            out[f.name] = f.default
        elif f.default_factory is not dataclasses.MISSING:
            out[f.name] = f.default_factory()
    return out
