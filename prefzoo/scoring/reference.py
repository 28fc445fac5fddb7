"""Reference log-probs chosen from what the loss declares: none, a frozen copy, the adapter-disabled policy, or a table.

``build_reference`` never looks at a loss name: reference-free losses (no ``Need.REFERENCE``) get ``None``.
:class:`PrecomputedReference` looks log-probs up in a table computed once (:mod:`prefzoo.scoring.reference_cache`).
"""

from __future__ import annotations

import copy
from typing import Any

import torch
from torch import Tensor, nn

from prefzoo.model import PolicyLogps, unwrap
from prefzoo.types import Need

__all__ = ["AdapterDisabledReference", "FrozenReference", "PrecomputedReference", "Reference", "build_reference"]


class Reference:
    """``ref(batch) -> (ref_chosen_logps (B,), ref_rejected_logps (B,))``, constant (no grad).

    ``ref.rows(batch) -> (N,)``: the log-prob of every collated row (lists' completions, unpaired examples and
    their KL rows).
    ``ref.token_logps(batch) -> (chosen (B, T_c), rejected (B, T_c))`` per-token reference log-probs, for a loss
    (or modifier: LD-DPO) that declares ``Need.REF_TOKEN_LOGPS``; a precomputed reference has none.
    """

    def __call__(self, batch: dict[str, Any]) -> tuple[Tensor, Tensor]:
        raise NotImplementedError

    def rows(self, batch: dict[str, Any]) -> Tensor:
        raise NotImplementedError(f"{type(self).__name__} scores pairs only")

    def token_logps(self, batch: dict[str, Any]) -> tuple[Tensor, Tensor]:
        raise NotImplementedError(f"{type(self).__name__} has no per-token reference log-probs")


class FrozenReference(Reference):
    """A frozen copy of the starting model, run under no_grad in eval mode."""

    def __init__(self, lm: nn.Module, chunk_size: int, packing: bool = False) -> None:
        # a copy: the policy trains in place; ``packing``: the policy's decoder layout (prefzoo.model.fast.packing)
        self.module: Any = PolicyLogps(copy.deepcopy(lm), chunk_size, packing=packing)
        self.module.requires_grad_(False)
        self.module.eval()

    @classmethod
    def around(cls, module: Any) -> FrozenReference:
        """A reference around an already built, frozen log-prob module (an engine's partitioned copy)."""
        ref = cls.__new__(cls)
        ref.module = module
        return ref

    @torch.no_grad()
    def __call__(self, batch: dict[str, Any]) -> tuple[Tensor, Tensor]:
        out = self.module(batch["input_ids"], batch["attention_mask"], batch["completion_mask"])
        b = out.logps.shape[0] // 2
        return out.logps[:b].detach(), out.logps[b:].detach()

    @torch.no_grad()
    def rows(self, batch: dict[str, Any]) -> Tensor:
        return self.module(batch["input_ids"], batch["attention_mask"], batch["completion_mask"]).logps.detach()

    @torch.no_grad()
    def token_logps(self, batch: dict[str, Any]) -> tuple[Tensor, Tensor]:
        out = self.module(batch["input_ids"], batch["attention_mask"], batch["completion_mask"], token_logps=True)
        b = out.logps.shape[0] // 2
        return out.token_logps[:b].detach(), out.token_logps[b:].detach()


class AdapterDisabledReference(Reference):
    """The LoRA policy itself with adapters disabled: the base model, no second copy in memory."""

    def __init__(self, policy: Any) -> None:
        self.policy = policy  # the (possibly accelerate-wrapped) PolicyLogps; unwrapped at call time

    @torch.no_grad()
    def __call__(self, batch: dict[str, Any]) -> tuple[Tensor, Tensor]:
        logps = self.rows(batch)
        b = logps.shape[0] // 2
        return logps[:b], logps[b:]

    @torch.no_grad()
    def rows(self, batch: dict[str, Any]) -> Tensor:
        return self._run(batch, token_logps=False).logps.detach()

    @torch.no_grad()
    def token_logps(self, batch: dict[str, Any]) -> tuple[Tensor, Tensor]:
        out = self._run(batch, token_logps=True)
        b = out.logps.shape[0] // 2
        return out.token_logps[:b].detach(), out.token_logps[b:].detach()

    def _run(self, batch: dict[str, Any], token_logps: bool) -> Any:
        inner = unwrap(self.policy, "policy")
        was_training = inner.training
        inner.eval()  # the reference scores in eval mode (no dropout) like a frozen copy, also under --keep-dropout
        try:
            lm: Any = inner.lm  # a peft model
            with lm.disable_adapter():
                return inner(batch["input_ids"], batch["attention_mask"], batch["completion_mask"], token_logps)
        finally:
            inner.train(was_training)


class PrecomputedReference(Reference):
    """Looks reference log-probs up in a table computed once: by example id for pairs (chosen, rejected), by
    :func:`prefzoo.scoring.fields.row_ids` for the rows of lists and unpaired examples."""

    def __init__(self, table: dict[str, tuple[float, ...]]) -> None:
        self.table = table

    def rows(self, batch: dict[str, Any]) -> Tensor:
        keys = batch.get("row_ids")
        if keys is None:
            raise KeyError("precomputed reference log-probs are looked up by row id; these rows have none")
        missing = [i for i in keys if i not in self.table]
        if missing:
            raise KeyError(f"precomputed reference log-probs miss rows {missing[:5]}; delete the cache")
        return torch.tensor([self.table[i][0] for i in keys], dtype=torch.float32, device=batch["input_ids"].device)

    def __call__(self, batch: dict[str, Any]) -> tuple[Tensor, Tensor]:
        missing = [i for i in batch["ids"] if i not in self.table]
        if missing:
            raise KeyError(f"precomputed reference log-probs miss example ids {missing[:5]}; delete the cache")
        device = batch["input_ids"].device
        vals = torch.tensor([self.table[i] for i in batch["ids"]], dtype=torch.float32, device=device)  # (B, 2)
        return vals[:, 0], vals[:, 1]


def build_reference(
    loss: Any, policy: PolicyLogps, lora: bool, has_adapter: bool, accelerator: Any, engine: Any
) -> tuple[Any, str]:
    """(the Reference the loss declares it needs, or None; how it is made), built before the engine wraps the policy.

    Reference-free losses get None; a fresh LoRA adapter (``lora``, the run adds it: not ``has_adapter``) gets the
    policy with adapters disabled (no second copy); otherwise the engine's frozen copy of the starting model
    (``engine.frozen_reference(policy, accelerator)``).
    """
    if Need.REFERENCE not in loss.needs and Need.KL_REFERENCE not in loss.needs:
        return None, "none (reference-free loss)"
    if lora and not has_adapter:
        return AdapterDisabledReference(policy), "adapter-disabled policy"
    return engine.frozen_reference(policy, accelerator)  # type: ignore[no-any-return]
