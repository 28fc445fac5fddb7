"""Fault tests reuse the trainer tests' tiny model and pairs (tests/conftest.py, tests/train/helpers.py)."""

from __future__ import annotations

import pytest


@pytest.fixture
def faults(monkeypatch):
    """Set PREFZOO_FAULTS (and the sleep) for an in-process run."""

    def set_faults(spec: str, sleep: float | None = None) -> None:
        monkeypatch.setenv("PREFZOO_FAULTS", spec)
        if sleep is not None:
            monkeypatch.setenv("PREFZOO_FAULT_SLEEP", str(sleep))

    monkeypatch.delenv("PREFZOO_FAULTS", raising=False)
    return set_faults
