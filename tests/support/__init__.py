"""Shared test scaffolding: fake entry points for plugin tests, tiny models and pairs (:mod:`tests.support.tiny`)."""

from __future__ import annotations

import importlib.metadata
import socket
from typing import Any

import pytest

__all__ = ["FakeEP", "free_port", "install_entry_points"]


def free_port() -> int:
    """A free TCP port on the loopback interface (for a gloo or torchrun rendezvous)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


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
