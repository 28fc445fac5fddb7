"""Shared pieces of the built-in modifiers: the loss capabilities they read, pair margins, registration."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
from torch import Tensor

from prefzoo.hookspecs import hookimpl
from prefzoo.spec import Applicability, ModifierSpec
from prefzoo.types import PreferenceBatch

__all__ = ["ANY_PER_PAIR", "LOGP_REWARD", "REWARD_DIFFERENCE", "WITH_REFERENCE", "pair_margin_inputs", "registers",
           "soft_exp"]

REWARD_DIFFERENCE = Applicability(
    r"reward-difference losses with $\beta$ (LossSpec.reward_difference: $L$ depends on a pair only through "
        r"$\beta\cdot\Delta$)",
    lambda spec, p: spec.is_reward_difference(p),
)
WITH_REFERENCE = Applicability("losses with a reference model (Need.REFERENCE)", lambda spec, p: spec.needs_reference)
ANY_PER_PAIR = Applicability(
    "losses whose per-example losses follow their examples (LossSpec.permutation_equivariant), batch-coupled ones "
    "included: each example's weight multiplies its own loss",
    lambda spec, p: spec.is_permutation_equivariant(p),
)
LOGP_REWARD = Applicability(
    r"reference-free losses whose reward is $\log\pi(y\mid x)$ or its per-token average (LossSpec.logp_reward)",
    lambda spec, p: not spec.needs_reference and spec.logp_reward in ("sum", "average"),
)


def pair_margin_inputs(batch: PreferenceBatch) -> tuple[Tensor, Tensor]:
    """(s_w, s_l): log π − log π_ref (log π without a reference), the Δ = s_w − s_l of a reward-difference loss."""
    if batch.has_reference:
        assert batch.ref_chosen_logps is not None and batch.ref_rejected_logps is not None
        return (batch.policy_chosen_logps - batch.ref_chosen_logps.detach(),
                batch.policy_rejected_logps - batch.ref_rejected_logps.detach())  # fmt: skip
    return batch.policy_chosen_logps, batch.policy_rejected_logps


def registers(specs: Sequence[ModifierSpec]) -> Callable[[], list[ModifierSpec]]:
    """A modifier module's ``prefzoo_register_modifiers`` hook implementation: it returns ``specs`` (declarations
    are data), through the same hook as a third-party plugin's."""

    @hookimpl
    def prefzoo_register_modifiers() -> list[ModifierSpec]:
        return list(specs)

    return prefzoo_register_modifiers


def soft_exp(x: Tensor, cap: float) -> Tensor:
    """exp(x) for x ≤ cap, continued by its tangent e^cap·(1 + x − cap) above: finite, increasing, gradient e^cap."""
    c = torch.as_tensor(cap, dtype=x.dtype, device=x.device)
    return torch.where(x <= c, torch.exp(torch.minimum(x, c)), torch.exp(c) * (1 + x - c))

