"""The base of the errors a run stops with on purpose (:class:`TrainingAborted`), and :func:`explained`, which turns
any other error of a block into one of them: the checkpoint, the callbacks and the loop all raise and wrap these.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager

__all__ = ["TrainingAborted", "explained"]


class TrainingAborted(RuntimeError):
    """The run stopped on purpose after a fault; the message says why and how to continue."""


@contextmanager
def explained(explain: Callable[[Exception], BaseException | None]) -> Iterator[None]:
    """Runs the block; an error in it that is not already a :class:`TrainingAborted` goes to ``explain``, and what
    that returns (a one-line error) is raised from it; ``None`` lets the error through as it is."""
    try:
        yield
    except TrainingAborted:
        raise
    except Exception as e:
        err = explain(e)
        if err is None:
            raise
        raise err from e
