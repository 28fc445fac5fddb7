"""Shared test scaffolding: fake entry points for plugin tests, tiny models and pairs (:mod:`tests.support.tiny`)."""

from __future__ import annotations

import importlib.metadata
from typing import Any

import pytest

__all__ = ["FakeEP", "install_entry_points"]


class FakeEP:
    """An entry point of group ``prefzoo`` whose ``load()`` returns ``obj`` or raises ``exc``."""

    def __init__(self, name: str, value: str, obj: Any = None, exc: BaseException | None = None) -> None:
        self.name, self.value, self._obj, self._exc = name, value, obj, exc

    def load(self) -> Any:
        if self._exc:
            raise self._exc
        return self._obj


def install_entry_points(monkeypatch: pytest.MonkeyPatch, eps: list[FakeEP], group: str = "prefzoo") -> None:
    """Make ``importlib.metadata.entry_points(group=group)`` return ``eps`` (and nothing for other groups)."""
    monkeypatch.setattr(importlib.metadata, "entry_points", lambda group=None, _g=group: eps if group == _g else [])
