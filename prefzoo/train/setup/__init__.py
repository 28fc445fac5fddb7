"""The setup phase of a run: ``setup(cfg, train, eval, loss)`` returns the :class:`Parts` every step uses.

:mod:`.pipeline` holds the steps in order, each taking what it uses and returning a small typed result
(:mod:`.stages`); the modules beside it hold what the steps build once: the loss (:mod:`.loss`), the checks
before anything loads (:mod:`.preflight`), the splits (:mod:`.splits`), the data's shape plan
(:mod:`.shape_plan`), the optimizer and schedule (:mod:`.optimizer`, :mod:`.schedules`), the trackers
(:mod:`.trackers`), BCO's density-ratio weights (:mod:`.density_ratio`), and the data and model helpers
(:mod:`.data`, :mod:`.model`).  Imported lazily: the config reads :mod:`.schedules` without loading the pipeline.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from prefzoo.train.setup.parts import Parts
    from prefzoo.train.setup.pipeline import setup, skip_batches_left

__all__ = ["Parts", "setup", "skip_batches_left"]


def __getattr__(name: str) -> Any:
    if name == "Parts":
        from prefzoo.train.setup.parts import Parts

        return Parts
    if name in ("setup", "skip_batches_left"):
        from prefzoo.train.setup import pipeline

        return getattr(pipeline, name)
    raise AttributeError(f"module 'prefzoo.train.setup' has no attribute {name!r}")
