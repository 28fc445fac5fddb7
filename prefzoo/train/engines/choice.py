"""Which engine a run's settings ask for."""

from __future__ import annotations

from typing import Any

from prefzoo.errors import ConfigError
from prefzoo.train.engines.base import Engine, EngineSettings

__all__ = ["engine_for", "resume_refusal"]


def engine_for(cfg: EngineSettings) -> Engine:
    """The engine a run's :class:`EngineSettings` ask for; settings that need another engine are one line.  The
    engine keeps them."""
    if cfg.fsdp:
        from prefzoo.train.engines.fsdp import FsdpEngine

        return FsdpEngine(cfg)
    if cfg.fsdp_cpu_offload:
        raise ConfigError("fsdp_cpu_offload=true needs --fsdp: add --fsdp, or drop --fsdp-cpu-offload")
    if cfg.deepspeed:
        from prefzoo.train.engines.deepspeed import DeepSpeedEngine

        return DeepSpeedEngine(cfg)
    return Engine(cfg)


def resume_refusal(saved: dict[str, Any], run: dict[str, Any]) -> str | None:
    """Why a checkpoint (its marker ``saved``) cannot resume under this run's engine and processes (``run``, the
    same fields), or None.  Checkpoints in accelerate's or DCP form resume on any engine here and any number of
    processes; DeepSpeed's and per-rank ones only where they were written."""
    if "engine" not in saved:  # written before markers named the engine: resumed as before, by the same one
        return None
    fmt, was, n_was = saved.get("checkpoint_format", "accelerate"), saved["engine"], saved.get("batch", ["?"])[0]
    same = was == run["engine"] and n_was == run["batch"][0]
    if (fmt == "deepspeed" and not same) or (run["checkpoint_format"] == "deepspeed" and was != run["engine"]):
        return (
            f"written by {was} on {n_was} processes, resumed by {run['engine']} on {run['batch'][0]}; DeepSpeed's "
            "checkpoints resume here on the same engine and number of processes (convert one with DeepSpeed's "
            "ds_to_universal to move it): resume with those"
        )
    if fmt == "per-rank" and (not same or saved.get("mesh") != run.get("mesh")):
        return (
            f"its shards were saved per rank on node-local disks by {was} on {n_was} processes (mesh "
            f"{saved.get('mesh')}), so it resumes only there; resume with the same engine, processes and mesh "
            "(checkpoints on a shared output dir resume on any)"
        )
    return None
