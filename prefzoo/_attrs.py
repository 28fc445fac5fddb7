"""Attribute changes that last one block: :func:`temporarily` sets an attribute and then puts back what was there."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

__all__ = ["temporarily"]


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
