"""The list a run calls its callbacks through (:class:`CallbackList`), and the error a failing one becomes.

``Callback`` and ``RunState`` are :mod:`prefzoo.callbacks` (re-exported here)."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from prefzoo.callbacks import Callback, RunState
from prefzoo.train.errors import TrainingAborted, explained
from prefzoo.types import error_summary

__all__ = ["Callback", "CallbackError", "CallbackList", "RunState", "callback_name"]


class CallbackError(TrainingAborted):
    """A callback raised; the message names the callback and the hook."""


def callback_name(cb: Any) -> str:
    return str(getattr(cb, "name", None) or type(cb).__name__)


class CallbackList:
    """Calls one hook on every callback in order; an exception becomes a one-line CallbackError naming the callback."""

    def __init__(self, callbacks: Iterable[Any] = ()) -> None:
        self.callbacks = list(callbacks)

    def call(self, hook: str, state: RunState, *args: Any) -> None:
        for cb in self.callbacks:
            self._invoke(cb, hook, state, *args)

    def on_batch(self, state: RunState, fields: dict[str, Any]) -> dict[str, Any]:
        for cb in self.callbacks:
            replaced = self._invoke(cb, "on_batch", state, fields)
            if replaced is not None:
                fields = replaced
        return fields

    @staticmethod
    def _invoke(cb: Any, hook: str, state: RunState, *args: Any) -> Any:
        method = getattr(cb, hook, None)
        if method is None:
            return None

        def failed(e: Exception) -> CallbackError:
            return CallbackError(
                f"callback {callback_name(cb)!r} ({type(cb).__module__}) failed in {hook} at step "
                f"{state.global_step}: {error_summary(e)}; fix or remove it (--callback / callbacks:)"
            )

        with explained(failed):
            return method(state, *args)
