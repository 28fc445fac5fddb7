"""Which experiment trackers a run logs to (``--report-to``): accelerate's trackers, checked before anything loads."""

from __future__ import annotations

import importlib.util

from prefzoo.train.config import ConfigError

__all__ = ["TRACKERS", "resolve_trackers"]

# --report-to name -> (module accelerate imports, pip package that provides it)
TRACKERS = {
    "tensorboard": ("tensorboard", "tensorboard"),
    "wandb": ("wandb", "wandb"),
    "mlflow": ("mlflow", "mlflow"),
    "trackio": ("trackio", "trackio"),
    "comet_ml": ("comet_ml", "comet-ml"),
    "aim": ("aim", "aim"),
    "clearml": ("clearml", "clearml"),
    "dvclive": ("dvclive", "dvclive"),
    "swanlab": ("swanlab", "swanlab"),
}


def _installed(module: str) -> bool:
    return importlib.util.find_spec(module) is not None


def resolve_trackers(report_to: str | None) -> list[str] | None:
    """accelerate ``log_with`` names for ``report_to``: ``none``, ``auto`` (TensorBoard when installed), or a
    comma-separated list of tracker names, each of which must be installed (never a silent fallback)."""
    if report_to in (None, "none"):
        return None
    if report_to == "auto":
        return ["tensorboard"] if _installed("tensorboard") else None
    names = [n.strip() for n in report_to.split(",") if n.strip()]
    for name in names:
        if name not in TRACKERS:
            raise ConfigError(
                f"--report-to {name}: not a tracker; choose none, auto or a comma-separated list of "
                f"{', '.join(TRACKERS)}"
            )
        module, package = TRACKERS[name]
        if not _installed(module):
            raise ConfigError(
                f"--report-to {name}: {module} is not installed; pip install {package} (or --report-to none)"
            )
    return names or None
