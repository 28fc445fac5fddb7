"""What a launcher (torchrun, ``accelerate launch``) tells a process in its environment, read in one
place: the process's rank, its rank on this node, and how many processes run on this node.

These are read before a process group exists (or where creating one would start it too early), so they come from the
environment, not from ``torch.distributed``; a process no launcher started is rank 0 of one.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

__all__ = ["is_rank_zero", "launcher_rank", "local_rank", "local_world_size"]


def _int(env: Mapping[str, str] | None, name: str, default: int) -> int:
    env = os.environ if env is None else env
    return int(env.get(name) or default)


def launcher_rank(env: Mapping[str, str] | None = None) -> int:
    """This process's global rank (``RANK``; 0 without a launcher)."""
    return _int(env, "RANK", 0)


def is_rank_zero(env: Mapping[str, str] | None = None) -> bool:
    """Whether this process is the launcher's rank 0 (or no launcher started it)."""
    return launcher_rank(env) == 0


def local_rank(env: Mapping[str, str] | None = None) -> int:
    """This process's rank on its node (``LOCAL_RANK``; 0 without a launcher)."""
    return _int(env, "LOCAL_RANK", 0)


def local_world_size(default: int = 1, env: Mapping[str, str] | None = None) -> int:
    """How many processes of the run this node holds (``LOCAL_WORLD_SIZE``; ``default`` when unset)."""
    return _int(env, "LOCAL_WORLD_SIZE", default)
