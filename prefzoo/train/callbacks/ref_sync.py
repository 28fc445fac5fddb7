"""The reference model following the policy, as a trainer callback: θ_ref ← α·θ + (1 − α)·θ_ref every τ optimizer steps.

Registered as ``reference-sync`` (an entry point of group ``prefzoo.callbacks``): installed by a modifier that names
it (``ModifierSpec.callback``; the callback then carries the modifier's name), or by hand:
``--callback reference-sync:sync_steps=64``.
As TRL 1.16's ``SyncRefModelCallback`` (``ref_model_mixup_alpha``, ``ref_model_sync_steps``).  At each update it
logs the reference's mean log-probs of the step's last micro-batch before and after (``<name>/ref_logps_*``), so the
reference is seen to move.  The updated reference is saved with every checkpoint and restored on resume.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from prefzoo.scoring import FrozenReference
from prefzoo.train.callbacks.base import Callback, RunState
from prefzoo.train.config import ConfigError

__all__ = ["REFERENCE_FILE", "ReferenceSync", "mix_into"]

REFERENCE_FILE = "tr_dpo_reference.safetensors"  # the moved reference, inside each checkpoint folder


@torch.no_grad()
def mix_into(target: torch.nn.Module, source: torch.nn.Module, alpha: float) -> None:
    """target ← α·source + (1 − α)·target, parameter by parameter (TRL's ``_sync_target_model``)."""
    for t, s in zip(target.parameters(), source.parameters(), strict=True):
        t.mul_(1.0 - alpha).add_(s.detach().to(t.dtype), alpha=alpha)


class ReferenceSync(Callback):
    name = "reference-sync"  # the modifier that installs it names it after itself; the prefix of its metrics

    def __init__(self, mixup_alpha: float = 0.6, sync_steps: int = 512) -> None:
        if not 0 < float(mixup_alpha) <= 1 or int(sync_steps) < 1:
            raise ConfigError(f"{self.name}: mixup_alpha={mixup_alpha} must be in (0, 1], sync_steps >= 1")
        self.alpha, self.every = float(mixup_alpha), int(sync_steps)

    def _ref_lm(self, state: RunState) -> torch.nn.Module:
        ref = state.reference
        module = getattr(ref, "module", None)
        if not isinstance(ref, FrozenReference) or not hasattr(module, "lm"):
            raise ConfigError(
                f"{self.name} needs a separate reference copy to update, but the run's reference is "
                f"{type(ref).__name__ if ref is not None else 'none'} (precomputed, LoRA adapter-disabled or "
                "partitioned references stay fixed)"
            )
        return module.lm  # type: ignore[no-any-return, union-attr]

    def _policy_lm(self, state: RunState) -> torch.nn.Module:
        return state.accelerator.unwrap_model(state.model).lm  # type: ignore[no-any-return]

    def on_train_begin(self, state: RunState) -> None:
        ref_lm = self._ref_lm(state)
        saved = _resumed_checkpoint(state)
        if saved is not None and (saved / REFERENCE_FILE).is_file():
            from safetensors.torch import load_file

            ref_lm.load_state_dict(load_file(str(saved / REFERENCE_FILE), device=str(state.accelerator.device)))

    def on_step_end(self, state: RunState) -> None:
        if state.global_step % self.every:
            return
        ref_lm = self._ref_lm(state)
        before = self._probe(state)
        mix_into(ref_lm, self._policy_lm(state), self.alpha)
        after = self._probe(state)
        record: dict[str, Any] = {"step": state.global_step, f"{self.name}/synced": 1}
        if before is not None and after is not None:
            record.update({f"{self.name}/ref_logps_before": before, f"{self.name}/ref_logps_after": after})
        state.log_metrics(record)

    def _probe(self, state: RunState) -> float | None:
        if state.batch is None:
            return None
        w, l = state.reference(state.batch)
        return float(torch.cat((w, l)).float().mean())

    def on_save_files(self, state: RunState, path: Path) -> None:
        from safetensors.torch import save_file

        sd = {k: v.detach().contiguous().cpu() for k, v in self._ref_lm(state).state_dict().items()}
        save_file(_untied(sd), str(path / REFERENCE_FILE))


def _untied(sd: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """safetensors refuses shared storage (tied embeddings): clone the tensors that share it."""
    seen: set[int] = set()
    out = {}
    for k, v in sd.items():
        ptr = v.untyped_storage().data_ptr()
        out[k] = v.clone() if ptr in seen else v
        seen.add(ptr)
    return out


def _resumed_checkpoint(state: RunState) -> Path | None:
    """The checkpoint this run resumed from (the one whose files were verified, not merely the newest), if any."""
    return state.resumed_from if state.global_step else None
