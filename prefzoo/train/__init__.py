"""The shared trainer: one accelerate loop for every registered loss (imports transformers/accelerate lazily)."""

from __future__ import annotations

from typing import Any

__all__ = ["TrainConfig", "TrainResult", "train"]


def __getattr__(name: str) -> Any:
    if name == "TrainConfig":
        from prefzoo.train.config import TrainConfig

        return TrainConfig
    if name in ("TrainResult", "train"):
        from prefzoo.train import loop

        return getattr(loop, name)
    raise AttributeError(f"module 'prefzoo.train' has no attribute {name!r}")
