"""Process set-up of a CLI run: how many CPU threads, which library messages to drop, a launcher that lied."""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Mapping, MutableMapping

from prefzoo._dist import local_world_size
from prefzoo.cli.main import CLIError

__all__ = ["check_launcher", "choose_threads", "huge_pages", "quiet_library_noise"]


def _cores() -> int:
    try:
        return len(os.sched_getaffinity(0))  # the cores this process may run on (containers, taskset)
    except AttributeError:  # pragma: no cover - macOS, Windows
        return os.cpu_count() or 1


def _load() -> float:
    try:
        return os.getloadavg()[0]
    except (AttributeError, OSError):  # pragma: no cover - Windows
        return 0.0


def choose_threads(
    requested: int | None, env: Mapping[str, str] | None = None, *, cores: int | None = None, load: float | None = None
) -> tuple[int, str]:
    """(torch intra-op threads, why): ``--threads``, else ``OMP_NUM_THREADS``, else the cores other work leaves free.

    torch defaults to one thread per core, which on a shared machine oversubscribes the cores: beside one busy
    process on 2 cores each step of the default task's warm-up was 13× slower with 2 threads than with 1.  The free
    cores are the usable cores minus the 1-minute load average (rounded), shared among this machine's processes
    of the run (``LOCAL_WORLD_SIZE``), and at least one.
    """
    env = os.environ if env is None else env
    if requested is not None:
        if requested < 1:
            raise CLIError(f"--threads {requested}: give a number of CPU threads >= 1")
        return requested, "--threads"
    if env.get("OMP_NUM_THREADS", "").strip().isdigit() and int(env["OMP_NUM_THREADS"]) >= 1:
        return int(env["OMP_NUM_THREADS"]), "OMP_NUM_THREADS"
    cores = _cores() if cores is None else cores
    load = _load() if load is None else load
    procs = max(1, local_world_size(1, env))
    free = max(0, cores - round(load))
    n = max(1, min(cores // procs, free // procs))
    share = f", shared by {procs} processes" if procs > 1 else ""
    return n, f"{free} of {cores} cores free (1-min load {load:.1f}{share}); --threads N to change"


def describe_threads(requested: int | None) -> tuple[int, str]:
    """(threads, the line to log) of :func:`choose_threads`; imports nothing, so the line can be printed before torch
    loads (seconds on a first run, when nothing is byte-compiled yet)."""
    n, why = choose_threads(requested)
    return n, f"{n} CPU thread{'s' if n > 1 else ''} ({why})"


def set_threads(n: int) -> None:
    """Give torch ``n`` intra-op threads (imports torch)."""
    import torch

    torch.set_num_threads(n)


THP_ENV = "THP_MEM_ALLOC_ENABLE"
THP_SYSFS = "/sys/kernel/mm/transparent_hugepage/enabled"


def huge_pages(
    env: MutableMapping[str, str] | None = None, *, sysfs: str = THP_SYSFS, torch_loaded: bool | None = None
) -> str | None:
    """Turn on torch's transparent huge pages for large CPU tensors (``THP_MEM_ALLOC_ENABLE=1``); the line to log.

    torch reads ``THP_MEM_ALLOC_ENABLE`` once, at its first CPU allocation, so this must run before torch loads.
    With it, torch ``madvise``s its CPU buffers of 2 MB and more ``MADV_HUGEPAGE``, and a fresh (positions ×
    vocabulary) logits buffer costs up to 512× fewer page faults (1 thread, 49k vocabulary: a 64 MB head GEMM into
    a fresh buffer 133 → 91 ms; whole steps: docs/results/performance.md).  None (nothing changed, nothing to log)
    when the user set the variable (their choice wins), when torch is already loaded, off Linux, or when the kernel
    has THP off (``never``).
    """
    env = os.environ if env is None else env
    torch_loaded = "torch" in sys.modules if torch_loaded is None else torch_loaded
    if THP_ENV in env or torch_loaded or not sys.platform.startswith("linux"):
        return None
    try:
        with open(sysfs, encoding="ascii") as f:
            mode = f.read()
    except OSError:
        return None
    if "[never]" in mode:
        return None
    env[THP_ENV] = "1"
    return f"transparent huge pages for CPU tensors of 2 MB and more ({THP_ENV}=1; {THP_ENV}=0 turns them off)"


class _DropMessages(logging.Filter):
    def __init__(self, *fragments: str) -> None:
        super().__init__()
        self.fragments = fragments

    def filter(self, record: logging.LogRecord) -> bool:
        msg = record.getMessage()
        return not any(f in msg for f in self.fragments)


def quiet_library_noise() -> None:
    """Silence messages a newcomer reads as errors although nothing is wrong.

    - accelerate's ``Removed shared tensor {'lm.lm_head.weight'} while saving``: tied embeddings are stored once
      and tied again on load (resume is bit-exact, tested in tests/faults);
    - DeepSpeed's ``Setting accelerator to CPU`` when it is imported (by accelerate or transformers) on a machine
      without a GPU: ``DS_ACCELERATOR=cpu`` is what it chooses there anyway (and without ``--deepspeed`` it is unused).

    No warning category is silenced for the process: a library's FutureWarning reaches the user
    (tests/train/loop/test_first_run.py checks that a plain run prints none).
    """
    logging.getLogger("accelerate.utils.other").addFilter(_DropMessages("Removed shared tensor"))
    import torch

    if not torch.cuda.is_available():
        os.environ.setdefault("DS_ACCELERATOR", "cpu")


def check_launcher(env: Mapping[str, str] | None = None) -> None:
    """Refuse ``accelerate launch --cpu --num_processes N>1``: accelerate then starts ONE process, silently.

    Its ``--cpu`` path uses the single-process launcher, which still sets ``ACCELERATE_USE_CPU`` and (because
    ``--num_processes`` > 1) ``MASTER_ADDR``/``MASTER_PORT``, but no ``WORLD_SIZE`` or ``RANK``.  Also refuse a
    ``LOCAL_RANK`` or ``RANK`` left in the shell without a launcher (no ``WORLD_SIZE``/``MASTER_ADDR``): torch would
    wait for a process group that nobody starts, or fail in its rendezvous.
    """
    env = os.environ if env is None else env
    stray = [name for name in ("LOCAL_RANK", "RANK") if name in env]
    if stray and not ("WORLD_SIZE" in env and "MASTER_ADDR" in env):
        given = ", ".join(f"{name}={env[name]}" for name in stray)
        raise CLIError(
            f"{given} is set, but no launcher started this process (WORLD_SIZE and MASTER_ADDR are not set): unset "
            f"it for one process (env -u {' -u '.join(stray)} prefzoo ...), or start several processes with "
            "`torchrun --nproc_per_node N -m prefzoo train ...` or `accelerate launch`"
        )
    launched_by_accelerate = "ACCELERATE_USE_CPU" in env or "ACCELERATE_MIXED_PRECISION" in env
    asked_for_several = "MASTER_ADDR" in env and "MASTER_PORT" in env
    one_process = int(env.get("WORLD_SIZE", "1") or 1) == 1 and "RANK" not in env and "LOCAL_RANK" not in env
    if launched_by_accelerate and asked_for_several and one_process:
        raise CLIError(
            "accelerate launch --cpu started only one process although --num_processes > 1 (its --cpu path "
            "runs a single process); run `accelerate launch --multi_gpu --num_processes N --num_machines 1 "
            "--mixed_precision no --dynamo_backend no -m prefzoo train ...` or `torchrun --nproc_per_node N -m "
            "prefzoo train ...` (prefzoo uses the CPU by itself when there is no GPU)"
        )
