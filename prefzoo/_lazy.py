"""Lazy public names for a package ``__init__`` (PEP 562): each name's module is imported on its first access."""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any

__all__ = ["lazy_names"]


def lazy_names(
    namespace: dict[str, Any], modules: dict[str, tuple[str, ...]]
) -> tuple[dict[str, str], Callable[[str], Any], Callable[[], list[str]]]:
    """``(name -> module, __getattr__, __dir__)`` for the package whose ``globals()`` is ``namespace``.

    ``modules`` maps each module to the public names it defines.  A name is imported on first access and then kept
    in ``namespace``, so later lookups skip ``__getattr__``; ``__dir__`` lists the loaded names and ``__all__``.
    """
    lazy = {name: module for module, names in modules.items() for name in names}
    package = namespace["__name__"]

    def __getattr__(name: str) -> Any:
        if name in lazy:
            value = getattr(importlib.import_module(lazy[name]), name)
            namespace[name] = value  # later lookups skip this function
            return value
        raise AttributeError(f"module {package!r} has no attribute {name!r}")

    def __dir__() -> list[str]:
        return sorted({*namespace, *namespace.get("__all__", ())})

    return lazy, __getattr__, __dir__
