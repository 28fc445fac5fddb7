"""The shared trainer: one accelerate loop for every registered loss (imports transformers/accelerate lazily).

``train(cfg, callbacks=[...])`` runs it; :class:`Callback` is the extension surface (see ``prefzoo.train.callbacks``).
"""

from __future__ import annotations

from typing import Any

__all__ = ["Callback", "RunState", "TrainConfig", "TrainResult", "train"]


def __getattr__(name: str) -> Any:
    if name == "TrainConfig":
        from prefzoo.train.config import TrainConfig

        return TrainConfig
    if name in ("Callback", "RunState"):
        from prefzoo.train import callbacks

        return getattr(callbacks, name)
    if name in ("TrainResult", "train"):
        from prefzoo.train import loop

        return getattr(loop, name)
    raise AttributeError(f"module 'prefzoo.train' has no attribute {name!r}")
