"""How the policy is spread over processes, behind one interface (:class:`Engine`).

``engine_for(settings)`` chooses, from the run's :class:`EngineSettings` (``EngineSettings.of(cfg)``, built once
by setup): accelerate's DDP (one process or several, the default), FSDP2 (``--fsdp``, sharded by
prefzoo with torch's ``fully_shard``) or DeepSpeed ZeRO-2/3 (``--deepspeed``, through accelerate).  The trainer builds
the Accelerator, shards, wraps, checkpoints and gathers through the engine and never tests which one it has.
"""

from __future__ import annotations

from prefzoo.train.engines.accelerator import build_accelerator, end_accelerator
from prefzoo.train.engines.base import Engine, EngineSettings
from prefzoo.train.engines.choice import engine_for, resume_refusal

__all__ = [
    "ENGINE_PACKAGES",
    "Engine",
    "EngineSettings",
    "build_accelerator",
    "end_accelerator",
    "engine_for",
    "resume_refusal",
]

ENGINE_PACKAGES = ("deepspeed",)  # the packages the engines use beyond torch and accelerate (a run card lists them)
