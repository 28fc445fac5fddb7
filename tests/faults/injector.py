"""Test-only fault injection, as a trainer callback: ``--callback tests.faults.injector:FaultInjector``.

``PREFZOO_FAULTS`` holds comma-separated ``KIND@STEP[:RANK]`` entries: ``nan_logps@3:1`` (rank 1's chosen log-probs
are NaN in optimizer step 3), ``nan_grad@2``, ``exit@2:1`` (rank 1 exits with status 3 when step 2 starts),
``hang@2:1`` (rank 1 sleeps forever), ``raise@2:1``, ``sigterm@3:1`` (rank 1 sends itself SIGTERM),
``sleep_step@0`` (every step sleeps ``PREFZOO_FAULT_SLEEP`` seconds, default 0.3) and ``ckpt_sleep@4`` (the writer
of checkpoint 4 sleeps ``PREFZOO_FAULT_SLEEP`` seconds after the state is written and before its completion marker);
``enospc@4`` makes the accelerate writer of checkpoint 4 fail with ENOSPC (No space left on device) after writing
half of ``model.safetensors`` (rank 0) or of its RNG-state file (other ranks): the callback wraps
``state.accelerator.save_state`` in ``on_train_begin``; ``enospc_rt@4`` is the same with the error torch and
safetensors raise for a full disk, a ``RuntimeError`` (``... No space left on device (os error 28)``), not an OSError;
``save_sleep@0:1`` makes rank 1 sleep ``PREFZOO_FAULT_SLEEP`` seconds before it writes its part of a checkpoint
(the callback wraps ``state.accelerator.save_state`` in ``on_train_begin``): meanwhile the other ranks' files are in
the temp folder and its own are not (the soak, ``benchmarks/soak_resume.py``, kills the run there);
``nan_last_micro@2`` is ``nan_logps`` in the last micro-batch of step 2 only (earlier ones trained normally);
``enospc_final@0`` makes the final model's ``save_pretrained`` fail with ENOSPC after writing half of its
``model.safetensors`` (the callback wraps the trained model's ``save_pretrained`` in ``on_train_begin``);
``nan_eval@0:1`` gives rank 1's first sequence of every evaluation batch NaN hidden states (a forward hook on the
decoder's final norm that acts while the policy is in eval mode), so its first pair's log-probs are NaN.
STEP 0 matches every step; no RANK matches every rank.  The variables are read when the callback is built, so a
subprocess run gets them from its environment.
"""

from __future__ import annotations

import errno
import os
import re
import signal
import sys
import time
from dataclasses import dataclass, field
from typing import Any

import torch

from prefzoo.train import Callback

FAULTS_ENV = "PREFZOO_FAULTS"
SLEEP_ENV = "PREFZOO_FAULT_SLEEP"
KINDS = ("nan_logps", "nan_grad", "exit", "hang", "raise", "sigterm", "sleep_step", "ckpt_sleep", "enospc", "nan_eval",
         "enospc_final", "nan_last_micro", "save_sleep", "enospc_rt")  # fmt: skip
SPEC = "tests.faults.injector:FaultInjector"  # what a config's ``callbacks`` names


@dataclass(frozen=True)
class Fault:
    kind: str
    step: int  # optimizer step (1-based) it fires in; 0 = every step
    rank: int | None  # None = every rank


def parse_faults(raw: str) -> list[Fault]:
    out = []
    for item in filter(None, (s.strip() for s in raw.split(","))):
        m = re.fullmatch(r"([a-z_]+)@(\d+)(?::(\d+))?", item)
        if not m or m.group(1) not in KINDS:
            raise ValueError(f"{FAULTS_ENV}={raw!r}: bad entry {item!r}; use KIND@STEP[:RANK], KIND in {KINDS}")
        out.append(Fault(m.group(1), int(m.group(2)), int(m.group(3)) if m.group(3) else None))
    return out


@dataclass
class FaultInjector(Callback):
    """Injects the faults of ``PREFZOO_FAULTS`` (or ``faults=...``) through the trainer's callback hooks."""

    faults: list[Fault] = field(default_factory=lambda: parse_faults(os.environ.get(FAULTS_ENV, "")))
    sleep_s: float = field(default_factory=lambda: float(os.environ.get(SLEEP_ENV, "0.3")))

    def fires(self, kind: str, state: Any, step: int | None = None) -> bool:
        step = state.global_step + 1 if step is None else step
        rank = state.accelerator.process_index
        return any(f.kind == kind and f.step in (0, step) and f.rank in (None, rank) for f in self.faults)

    def on_train_begin(self, state: Any) -> None:
        if self.fires("nan_eval", state, step=0):
            lm = state.accelerator.unwrap_model(state.model).lm
            norm = lm.get_decoder().norm

            def poison(module: Any, args: Any, output: Any) -> Any:
                if module.training:
                    return None
                out = output.clone()
                out[0] = float("nan")  # (B, T, H): the batch's first sequence
                return out

            norm.register_forward_hook(poison)
        if any(f.kind in ("enospc", "enospc_rt") for f in self.faults):
            acc = state.accelerator
            save_state = acc.save_state

            def full_disk_save_state(output_dir: str, *args: Any, **kwargs: Any) -> Any:
                result = save_state(output_dir, *args, **kwargs)
                as_library = self.fires("enospc_rt", state, step=state.global_step)  # torch's/safetensors' error
                if as_library or self.fires("enospc", state, step=state.global_step):  # the step being saved
                    rank = state.accelerator.process_index  # each process truncates a file it wrote itself
                    name = "model.safetensors" if rank == 0 else f"random_states_{rank}.pkl"
                    victim = os.path.join(output_dir, name)
                    if os.path.exists(victim):
                        os.truncate(victim, os.path.getsize(victim) // 2)  # the write stopped halfway
                    print(f"prefzoo fault injection: ENOSPC writing {victim}", file=sys.stderr, flush=True)
                    if as_library:
                        raise RuntimeError("Error while serializing: I/O error: No space left on device (os error 28)")
                    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), victim)
                return result

            acc.save_state = full_disk_save_state
        if any(f.kind == "save_sleep" for f in self.faults):
            acc = state.accelerator
            inner = acc.save_state

            def slow_save_state(output_dir: str, *args: Any, **kwargs: Any) -> Any:
                if self.fires("save_sleep", state, step=state.global_step):  # the step being saved
                    time.sleep(self.sleep_s)  # the other ranks write their files meanwhile
                return inner(output_dir, *args, **kwargs)

            acc.save_state = slow_save_state
        if self.fires("enospc_final", state, step=0):
            lm = state.accelerator.unwrap_model(state.model).lm
            save_pretrained = lm.save_pretrained

            def full_disk_save_pretrained(folder: Any, *args: Any, **kwargs: Any) -> Any:
                save_pretrained(folder, *args, **kwargs)
                victim = os.path.join(str(folder), "model.safetensors")
                os.truncate(victim, os.path.getsize(victim) // 2)  # the write stopped halfway
                print(f"prefzoo fault injection: ENOSPC writing {victim}", file=sys.stderr, flush=True)
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), victim)

            lm.save_pretrained = full_disk_save_pretrained

    def on_step_begin(self, state: Any) -> None:
        self.micro = 0  # micro-batches of this step seen by on_batch
        step, rank = state.global_step + 1, state.accelerator.process_index
        if self.fires("sleep_step", state):
            time.sleep(self.sleep_s)
        if self.fires("exit", state):
            print(f"prefzoo fault injection: rank {rank} exits at step {step}", file=sys.stderr, flush=True)
            os._exit(3)
        if self.fires("sigterm", state):
            os.kill(os.getpid(), signal.SIGTERM)
        if self.fires("raise", state):
            raise RuntimeError(f"prefzoo fault injection: rank {rank} raises at step {step}")
        if self.fires("hang", state):
            print(f"prefzoo fault injection: rank {rank} hangs at step {step}", file=sys.stderr, flush=True)
            while True:
                time.sleep(3600)

    def on_batch(self, state: Any, fields: dict[str, Any]) -> dict[str, Any] | None:
        """NaN in the first chosen log-prob (B,) when ``nan_logps`` fires; the autograd graph is kept."""
        self.micro = getattr(self, "micro", 0) + 1
        last = self.micro == state.cfg.grad_accum
        if not (self.fires("nan_logps", state) or (last and self.fires("nan_last_micro", state))):
            return None
        logps = fields["policy_chosen_logps"]  # (B,)
        poison = torch.zeros_like(logps)
        poison[0] = float("nan")
        return {**fields, "policy_chosen_logps": logps + poison}

    def on_before_optimizer_step(self, state: Any, params: list[Any]) -> None:
        if self.fires("nan_grad", state):
            for p in params:
                if p.grad is not None:
                    p.grad.view(-1)[0] = float("nan")
                    return

    def on_save_files(self, state: Any, path: Any) -> None:
        if any(f.kind == "ckpt_sleep" and f.step in (0, state.global_step) for f in self.faults):
            step = state.global_step
            print(f"prefzoo fault injection: checkpoint {step} written, no marker yet", file=sys.stderr, flush=True)
            time.sleep(self.sleep_s)
