"""The training loop in one room: ``train(cfg)`` (:mod:`.supervise`) runs a :class:`~.run.Run`, which calls its
micro-batch :mod:`.step` and its step :mod:`.boundary` (checkpoints, stops), fed by a data :mod:`.source`, with
:mod:`.signals` (preemption), the non-finite :mod:`.guard` and the :mod:`.metrics` it logs.

Importing this package imports nothing heavy; ``train`` and ``TrainResult`` load the loop when first used.
"""

from __future__ import annotations

from typing import Any

__all__ = ["TrainResult", "train"]


def __getattr__(name: str) -> Any:
    if name == "train":
        from prefzoo.train.loop.supervise import train

        return train
    if name == "TrainResult":
        from prefzoo.train.loop.run import TrainResult

        return TrainResult
    raise AttributeError(f"module 'prefzoo.train.loop' has no attribute {name!r}")
