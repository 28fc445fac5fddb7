"""Faults injected after the real work: a function's result changed on its way out (for tests that must fail)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any


def patch_result(monkeypatch: Any, owner: Any, name: str, change: Callable[[Any], None]) -> None:
    """Replace ``owner.name`` by a wrapper that calls the real one, applies ``change`` to its result in place and
    returns it (undone by ``monkeypatch`` at the test's end)."""
    sound = getattr(owner, name)

    def wrapped(*args: Any, **kwargs: Any) -> Any:
        result = sound(*args, **kwargs)
        change(result)
        return result

    monkeypatch.setattr(owner, name, wrapped)


def roll_flat_slots(layout: Any) -> None:
    """A packed row's split attention puts its outputs back in the wrong places: ``FlatLayout.out`` rolled by one (the
    gathered split) and its row blocks in reverse order (the row-by-row split on CPU)."""
    layout.out = layout.out.roll(1)
    if layout.rows is not None:
        layout.rows = layout.rows[::-1]
