"""The tensors a loss receives and returns, with their documented shapes.

B is the number of preference pairs on this process; T_w and T_l are the padded
completion lengths of the chosen and rejected responses.  Every per-example
field is a 1-D tensor of shape (B,).  Validation happens here, at the API
boundary, so that a loss never meets a NaN, a negative length or a shape
mismatch deep inside torch.
"""

from __future__ import annotations

import enum
from collections.abc import Callable
from dataclasses import dataclass, field, fields

import torch
from torch import Tensor

__all__ = ["LossContext", "LossOutput", "Need", "PreferenceBatch", "PreferenceBatchError", "error_summary"]


class PreferenceBatchError(ValueError):
    """A PreferenceBatch field is missing, mis-shaped or non-finite."""


class Need(str, enum.Enum):
    """Inputs a loss can declare it needs; the trainer computes only these."""

    REFERENCE = "reference"  # ref_chosen_logps, ref_rejected_logps
    LENGTHS = "lengths"  # chosen_lengths, rejected_lengths
    TOKEN_LOGPS = "token_logps"  # per-token log-probs and masks
    TOKEN_ENTROPIES = "token_entropies"  # per-token entropies of π(·|prefix) and masks


# Which batch fields each need requires, used to name a missing input clearly.
NEED_FIELDS: dict[Need, tuple[str, ...]] = {
    Need.REFERENCE: ("ref_chosen_logps", "ref_rejected_logps"),
    Need.LENGTHS: ("chosen_lengths", "rejected_lengths"),
    Need.TOKEN_LOGPS: (
        "policy_chosen_token_logps",
        "policy_rejected_token_logps",
        "chosen_mask",
        "rejected_mask",
    ),
    Need.TOKEN_ENTROPIES: ("chosen_token_entropies", "rejected_token_entropies", "chosen_mask", "rejected_mask"),
}

# Every floating-point tensor field of a PreferenceBatch (masks and lengths are not).
FLOAT_FIELDS = (
    "policy_chosen_logps",
    "policy_rejected_logps",
    "ref_chosen_logps",
    "ref_rejected_logps",
    "policy_chosen_token_logps",
    "policy_rejected_token_logps",
    "chosen_token_entropies",
    "rejected_token_entropies",
)
_PER_EXAMPLE = (
    "policy_chosen_logps",
    "policy_rejected_logps",
    "ref_chosen_logps",
    "ref_rejected_logps",
    "chosen_lengths",
    "rejected_lengths",
)
_TOKEN_LEVEL_W = ("policy_chosen_token_logps", "chosen_token_entropies", "chosen_mask")
_TOKEN_LEVEL_L = ("policy_rejected_token_logps", "rejected_token_entropies", "rejected_mask")


@dataclass(frozen=True)
class PreferenceBatch:
    """A batch of B preference pairs as the losses see it.

    Log-probs are sums over completion tokens only (prompt and padding
    excluded): log π(y|x) = Σ_t log π(y_t | x, y_<t).  Token-level fields are
    optional and requested by a loss through its declared needs.
    """

    policy_chosen_logps: Tensor  # (B,) log π_θ(y_w|x), differentiable
    policy_rejected_logps: Tensor  # (B,) log π_θ(y_l|x), differentiable
    ref_chosen_logps: Tensor | None = None  # (B,) log π_ref(y_w|x), constant
    ref_rejected_logps: Tensor | None = None  # (B,) log π_ref(y_l|x), constant
    chosen_lengths: Tensor | None = None  # (B,) |y_w| completion tokens, > 0
    rejected_lengths: Tensor | None = None  # (B,) |y_l| completion tokens, > 0
    policy_chosen_token_logps: Tensor | None = None  # (B, T_w) log π_θ(y_w,t | x, y_w,<t), 0 at padding
    policy_rejected_token_logps: Tensor | None = None  # (B, T_l)
    chosen_token_entropies: Tensor | None = None  # (B, T_w) H(π_θ(·| x, y_w,<t)), differentiable
    rejected_token_entropies: Tensor | None = None  # (B, T_l)
    chosen_mask: Tensor | None = None  # (B, T_w) bool, True on completion tokens
    rejected_mask: Tensor | None = None  # (B, T_l) bool
    example_ids: tuple[str, ...] | None = field(default=None, compare=False)  # for error messages and skip logs

    def __post_init__(self) -> None:
        self._validate()

    @property
    def batch_size(self) -> int:
        return int(self.policy_chosen_logps.shape[0])

    @property
    def has_reference(self) -> bool:
        return self.ref_chosen_logps is not None and self.ref_rejected_logps is not None

    def _validate(self) -> None:
        ref = self.policy_chosen_logps
        if not isinstance(ref, Tensor):
            raise PreferenceBatchError(
                f"PreferenceBatch.policy_chosen_logps must be a torch.Tensor of shape (B,), got {type(ref).__name__}"
            )
        if ref.ndim != 1 or ref.shape[0] == 0:
            raise PreferenceBatchError(
                "PreferenceBatch.policy_chosen_logps must have shape (B,) with B >= 1 "
                f"(one summed log-prob per pair), got shape {tuple(ref.shape)}"
            )
        b = ref.shape[0]
        for name in _PER_EXAMPLE:
            t = getattr(self, name)
            if t is None:
                if name.startswith("policy_"):
                    raise PreferenceBatchError(f"PreferenceBatch.{name} is required")
                continue
            _check_tensor(name, t, (b,), ref)
            if name.endswith("lengths"):
                integral = not t.is_complex() and t.dtype != torch.bool
                if integral and t.is_floating_point():
                    integral = bool(torch.isfinite(t).all()) and bool((t == t.round()).all())
                if not integral:
                    raise PreferenceBatchError(
                        f"PreferenceBatch.{name} must hold whole token counts (an integer tensor), got {t.dtype} "
                        f"values {t.flatten()[:4].tolist()}; pass completion_mask.sum(-1)"
                    )
                if not bool((t > 0).all()):
                    bad = int(torch.nonzero(t <= 0)[0, 0])
                    raise PreferenceBatchError(
                        f"PreferenceBatch.{name}[{bad}] = {t[bad].item()}: completion lengths must be positive "
                        "token counts; drop pairs whose completion was truncated away"
                    )
            elif not t.is_floating_point():
                raise PreferenceBatchError(f"PreferenceBatch.{name} must be a floating-point tensor, got {t.dtype}")
            _check_finite(name, t, self.example_ids)
        for group in (_TOKEN_LEVEL_W, _TOKEN_LEVEL_L):
            shape: tuple[int, ...] | None = None
            for name in group:
                t = getattr(self, name)
                if t is None:
                    continue
                if t.ndim != 2 or t.shape[0] != b:
                    raise PreferenceBatchError(
                        f"PreferenceBatch.{name} must have shape (B, T) with B = {b}, got {tuple(t.shape)}"
                    )
                if shape is not None and tuple(t.shape) != shape:
                    raise PreferenceBatchError(
                        f"PreferenceBatch.{name} has shape {tuple(t.shape)} but {group[0]} and friends have {shape}"
                    )
                shape = tuple(t.shape)
                if t.device != ref.device:
                    raise PreferenceBatchError(
                        f"PreferenceBatch.{name} is on {t.device} but policy_chosen_logps is on {ref.device}"
                    )
                if name.endswith("mask"):
                    if t.dtype != torch.bool:
                        raise PreferenceBatchError(f"PreferenceBatch.{name} must be a bool tensor, got {t.dtype}")
                else:
                    _check_finite(name, t, self.example_ids)
        if self.example_ids is not None and len(self.example_ids) != b:
            raise PreferenceBatchError(f"PreferenceBatch.example_ids has {len(self.example_ids)} ids for B = {b}")

    def replace(self, **changes: Tensor | None) -> PreferenceBatch:
        """A copy with some fields replaced (validated again)."""
        values = {f.name: getattr(self, f.name) for f in fields(self)}
        values.update(changes)
        return PreferenceBatch(**values)  # type: ignore[arg-type]


def _check_tensor(name: str, t: object, shape: tuple[int, ...], ref: Tensor) -> None:
    if not isinstance(t, Tensor):
        raise PreferenceBatchError(f"PreferenceBatch.{name} must be a torch.Tensor, got {type(t).__name__}")
    if tuple(t.shape) != shape:
        raise PreferenceBatchError(
            f"PreferenceBatch.{name} has shape {tuple(t.shape)} but policy_chosen_logps has {shape}: "
            "every per-example field must have one entry per pair"
        )
    if t.device != ref.device:
        raise PreferenceBatchError(
            f"PreferenceBatch.{name} is on {t.device} but policy_chosen_logps is on {ref.device}: move it with .to()"
        )


def _check_finite(name: str, t: Tensor, ids: tuple[str, ...] | None) -> None:
    finite = torch.isfinite(t.detach())
    if not bool(finite.all()):
        idx = int(torch.nonzero(~finite)[0, 0])
        who = f" (example {ids[idx]!r})" if ids is not None else ""
        raise PreferenceBatchError(
            f"PreferenceBatch.{name}[{idx}]{who} is {t.detach()[idx].flatten()[0].item()}: "
            "log-probs and entropies must be finite; check the model's outputs and the completion mask"
        )


@dataclass
class LossOutput:
    """What a loss returns.  Reduction (mean over examples) belongs to the trainer."""

    losses: Tensor  # (B,) per-example losses, differentiable, not reduced
    chosen_rewards: Tensor  # (B,) detached scores of y_w; reward accuracy = mean(chosen > rejected)
    rejected_rewards: Tensor  # (B,) detached scores of y_l
    metrics: dict[str, Tensor] = field(default_factory=dict)  # detached scalars or (B,) extras


def _identity(t: Tensor) -> Tensor:
    return t


@dataclass(frozen=True)
class LossContext:
    """What a loss may ask of its surroundings, so one function runs in a unit test and on 64 GPUs.

    ``gather(t)`` returns the concatenation of ``t`` over all processes, in rank order
    (the identity on one process).  Losses only gather detached tensors, so the
    hook need not be differentiable (accelerate's ``gather`` is not).
    """

    gather: Callable[[Tensor], Tensor] = _identity

    @property
    def distributed(self) -> bool:
        return self.gather is not _identity


def error_summary(e: BaseException, limit: int = 300) -> str:
    """``Type: first line of the message`` (at most ``limit`` characters of it), for one-line errors."""
    return f"{type(e).__name__}: {(str(e).strip().splitlines() or [''])[0][:limit]}"
