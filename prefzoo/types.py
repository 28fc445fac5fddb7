"""The tensors a loss receives and returns, with their documented shapes.

Three batch shapes, one per kind of feedback (:class:`Shape`):

- pairs, :class:`PreferenceBatch`: B is the number of preference pairs on this process; T_w and T_l are the
  padded completion lengths of the chosen and rejected responses; every per-example field is (B,).
- lists, :class:`GroupBatch`: G groups of up to K completions of one prompt each, ranked by a score; fields
  are (G, K) with a mask for groups holding fewer than K completions.
- unpaired, :class:`UnpairedBatch`: N single completions, each labelled desirable or undesirable; fields are (N,).

Validation happens here, at the API boundary, so that a loss never meets a NaN,
a negative length or a shape mismatch deep inside torch.
"""

from __future__ import annotations

import dataclasses
import enum
import os
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar, TypeVar

import torch
from torch import Tensor

__all__ = [
    "SEGMENT_CHOSEN",
    "SEGMENT_PAD",
    "SEGMENT_PROMPT",
    "SEGMENT_REJECTED",
    "GroupBatch",
    "GroupBatchError",
    "LossContext",
    "LossOutput",
    "LossState",
    "Need",
    "PreferenceBatch",
    "PreferenceBatchError",
    "Shape",
    "UnpairedBatch",
    "UnpairedBatchError",
    "error_summary",
    "group_from_pairs",
]

# segment ids of a shared-prompt row [x, y_w, y_l] (a collated batch's completion_mask with share_prompt): the
# collator writes them (prefzoo.data.collate), the shared-prompt attention reads them (prefzoo.model.fast)
SEGMENT_PAD, SEGMENT_PROMPT, SEGMENT_CHOSEN, SEGMENT_REJECTED = 0, 1, 2, 3


class PreferenceBatchError(ValueError):
    """A PreferenceBatch field is missing, mis-shaped or non-finite."""


class Need(str, enum.Enum):
    """Inputs a loss can declare it needs; the trainer computes only these."""

    REFERENCE = "reference"  # ref_chosen_logps, ref_rejected_logps
    LENGTHS = "lengths"  # chosen_lengths, rejected_lengths
    TOKEN_LOGPS = "token_logps"  # per-token log-probs and masks
    TOKEN_ENTROPIES = "token_entropies"  # per-token entropies of π(·|prefix) and masks
    KL_REFERENCE = "kl_reference"  # unpaired only: log-probs of mismatched prompt/completion pairs (KTO's z₀)
    REF_TOKEN_LOGPS = "ref_token_logps"  # per-token reference log-probs and masks (LD-DPO on a reference loss)
    TOKEN_SQUARED_PROBS = "token_squared_probs"  # per-token log Σ_v π(v|prefix)² and masks (WPO's weight alignment)
    SCORES = "scores"  # chosen_scores, rejected_scores: the pair's scores from the data (ODPO's offset)


class Shape(str, enum.Enum):
    """The batch shapes a loss can declare it takes (``LossSpec.shapes``); the trainer reads them, never a name."""

    PAIR = "pair"  # PreferenceBatch: one chosen and one rejected completion per prompt
    LIST = "list"  # GroupBatch: K >= 2 completions per prompt, ranked by a score (ties allowed)
    UNPAIRED = "unpaired"  # UnpairedBatch: one completion per example, labelled desirable or not


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
    Need.REF_TOKEN_LOGPS: ("ref_chosen_token_logps", "ref_rejected_token_logps", "chosen_mask", "rejected_mask"),
    Need.TOKEN_SQUARED_PROBS: (
        "chosen_token_log_sq_probs",
        "rejected_token_log_sq_probs",
        "chosen_mask",
        "rejected_mask",
    ),
    Need.SCORES: ("chosen_scores", "rejected_scores"),
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
    "ref_chosen_token_logps",
    "ref_rejected_token_logps",
    "chosen_token_log_sq_probs",
    "rejected_token_log_sq_probs",
    "chosen_scores",
    "rejected_scores",
)
# Float fields that are constants of the step (no gradient flows into them): reference, data scores, WPO's alignment.
CONSTANT_FIELDS = tuple(f for f in FLOAT_FIELDS if f.startswith("ref_") or f.endswith(("_log_sq_probs", "_scores")))
# The (B,) fields: the policy's summed log-probs and those of the reference, lengths and scores needs.
_PER_EXAMPLE = (
    "policy_chosen_logps",
    "policy_rejected_logps",
    *NEED_FIELDS[Need.REFERENCE],
    *NEED_FIELDS[Need.LENGTHS],
    *NEED_FIELDS[Need.SCORES],
)
_TOKEN_LEVEL_W = (
    "policy_chosen_token_logps",
    "chosen_token_entropies",
    "ref_chosen_token_logps",
    "chosen_token_log_sq_probs",
    "chosen_mask",
)
_TOKEN_LEVEL_L = (
    "policy_rejected_token_logps",
    "rejected_token_entropies",
    "ref_rejected_token_logps",
    "rejected_token_log_sq_probs",
    "rejected_mask",
)


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
    ref_chosen_token_logps: Tensor | None = None  # (B, T_w) log π_ref(y_w,t | x, y_w,<t), 0 at padding, constant
    ref_rejected_token_logps: Tensor | None = None  # (B, T_l)
    chosen_token_log_sq_probs: Tensor | None = None  # (B, T_w) log Σ_v π_θ(v | x, y_w,<t)², 0 at padding, constant
    rejected_token_log_sq_probs: Tensor | None = None  # (B, T_l)
    chosen_scores: Tensor | None = None  # (B,) the data's score of y_w (e.g. a reward model's), constant
    rejected_scores: Tensor | None = None  # (B,) the data's score of y_l
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
                _check_lengths(name, t)
            elif not t.is_floating_point():
                raise PreferenceBatchError(f"PreferenceBatch.{name} must be a floating-point tensor, got {t.dtype}")
            _check_finite(name, t, self.example_ids)
        for group in (_TOKEN_LEVEL_W, _TOKEN_LEVEL_L):
            self._validate_token_group(group, b, ref)
        if self.example_ids is not None and len(self.example_ids) != b:
            raise PreferenceBatchError(f"PreferenceBatch.example_ids has {len(self.example_ids)} ids for B = {b}")

    def _validate_token_group(self, group: tuple[str, ...], b: int, ref: Tensor) -> None:
        """One completion's (B, T) token-level fields: one shape among them, on ``ref``'s device, bool masks, finite."""
        shape: tuple[int, ...] | None = None
        for name, t in present_fields(self, group):
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

    def replace(self, **changes: Tensor | None) -> PreferenceBatch:
        """A copy with some fields replaced (validated again)."""
        return dataclasses.replace(self, **changes)  # type: ignore[arg-type]


def present_fields(batch: Any, names: Iterable[str]) -> Iterator[tuple[str, Any]]:
    """``(name, value)`` of each of a batch's fields ``names`` that is set (not None), in that order."""
    for name in names:
        value = getattr(batch, name)
        if value is not None:
            yield name, value


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


def _whole_counts(t: Tensor) -> bool:
    """``t`` holds whole numbers: an integer tensor, or a float one whose values are finite and integral."""
    if t.is_complex() or t.dtype == torch.bool:
        return False
    return not t.is_floating_point() or (bool(torch.isfinite(t).all()) and bool((t == t.round()).all()))


def _check_lengths(name: str, t: Tensor) -> None:
    """``t`` (B,) holds whole, positive token counts, or a PreferenceBatchError naming the field and the fix."""
    if not _whole_counts(t):
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


def _check_finite(name: str, t: Tensor, ids: tuple[str, ...] | None) -> None:
    finite = torch.isfinite(t.detach())
    if not bool(finite.all()):
        idx = int(torch.nonzero(~finite)[0, 0])
        who = f" (example {ids[idx]!r})" if ids is not None else ""
        raise PreferenceBatchError(
            f"PreferenceBatch.{name}[{idx}]{who} is {t.detach()[idx].flatten()[0].item()}: "
            "log-probs and entropies must be finite; check the model's outputs and the completion mask"
        )


class GroupBatchError(PreferenceBatchError):
    """A GroupBatch field is missing, mis-shaped or non-finite (a PreferenceBatchError, so handlers catch both)."""


class UnpairedBatchError(PreferenceBatchError):
    """An UnpairedBatch field is missing, mis-shaped or non-finite."""


def _check_field(
    kind: str, err: type[PreferenceBatchError], name: str, t: object, shape: tuple[int, ...], ref: Tensor, what: str
) -> Tensor:
    """``t`` is a tensor of ``shape`` on ``ref``'s device, else a one-line ``err`` naming ``kind.name``."""
    if not isinstance(t, Tensor):
        raise err(f"{kind}.{name} must be a torch.Tensor of shape {what}, got {type(t).__name__}")
    if tuple(t.shape) != shape:
        raise err(f"{kind}.{name} has shape {tuple(t.shape)} but policy_logps implies {shape} {what}")
    if t.device != ref.device:
        raise err(f"{kind}.{name} is on {t.device} but policy_logps is on {ref.device}: move it with .to()")
    return t


def _check_values(
    kind: str, err: type[PreferenceBatchError], name: str, t: Tensor, valid: Tensor | None, filler: str
) -> None:
    """Float fields are finite floats, bool fields bools, length fields whole positive counts (on ``valid`` slots)."""
    if name.endswith("mask") or name == "labels":
        if t.dtype != torch.bool:
            fix = "True = desirable, False = undesirable" if name == "labels" else "True on real entries"
            raise err(f"{kind}.{name} must be a bool tensor ({fix}), got {t.dtype}")
        return
    if name.endswith("lengths"):
        if not _whole_counts(t):
            raise err(f"{kind}.{name} must hold whole token counts (an integer tensor), got {t.dtype}")
        bad = (t <= 0) if valid is None else (t <= 0) & valid
        if bool(bad.any()):
            idx = tuple(torch.nonzero(bad)[0].tolist())
            raise err(f"{kind}.{name}{list(idx)} = {t[idx].item()}: completion lengths must be positive token counts")
        return
    if not t.is_floating_point():
        raise err(f"{kind}.{name} must be a floating-point tensor, got {t.dtype}")
    finite = torch.isfinite(t.detach())
    if not bool(finite.all()):
        idx = tuple(torch.nonzero(~finite)[0].tolist())
        raise err(f"{kind}.{name}{list(idx)} is {t.detach()[idx].item()}: values must be finite{filler}")

def _check_token_fields(
    batch: Any, kind: str, err: type[PreferenceBatchError], lead: tuple[int, ...], lead_text: str, what: str
) -> None:
    """The optional token-level fields of a group or unpaired batch: shape ``lead + (T,)`` (one T for all), values."""
    shape: tuple[int, ...] | None = None
    for name, t in present_fields(batch, ("policy_token_logps", "token_entropies", "token_mask")):
        if not isinstance(t, Tensor) or t.ndim != len(lead) + 1 or tuple(t.shape[: len(lead)]) != lead:
            got = tuple(t.shape) if isinstance(t, Tensor) else type(t).__name__
            raise err(f"{kind}.{name} must have shape {what} with {lead_text}, got {got}")
        shape = shape or tuple(t.shape)
        _check_values(kind, err, name, _check_field(kind, err, name, t, shape, batch.policy_logps, what), None, "")



_Batch = TypeVar("_Batch", bound="_OneTensorBatch")


class _OneTensorBatch:
    """What GroupBatch and UnpairedBatch share: one ``policy_logps`` tensor and its optional companions."""

    policy_logps: Tensor
    ref_logps: Tensor | None

    GRAD_FIELDS: ClassVar[tuple[str, ...]] = ("policy_logps", "policy_token_logps", "token_entropies")
    # The needs both shapes answer (UnpairedBatch adds KL_REFERENCE).
    NEED_FIELDS: ClassVar[dict[Need, tuple[str, ...]]] = {
        Need.REFERENCE: ("ref_logps",),
        Need.LENGTHS: ("lengths",),
        Need.TOKEN_LOGPS: ("policy_token_logps", "token_mask"),
        Need.TOKEN_ENTROPIES: ("token_entropies", "token_mask"),
    }

    @property
    def batch_size(self) -> int:
        """The number of losses: G groups of a GroupBatch, N completions of an UnpairedBatch."""
        return int(self.policy_logps.shape[0])

    @property
    def has_reference(self) -> bool:
        return self.ref_logps is not None

    def replace(self: _Batch, **changes: Any) -> _Batch:
        """A copy with some fields replaced (validated again)."""
        return dataclasses.replace(self, **changes)  # type: ignore[type-var]


@dataclass(frozen=True, kw_only=True)
class GroupBatch(_OneTensorBatch):
    """G groups (prompts) of up to K completions each, ranked by a score: the batch of a ``Shape.LIST`` loss.

    Log-probs are sums over completion tokens, as in :class:`PreferenceBatch`.
    Ranking: by ``scores`` (higher is better; ties allowed) when given, else by
    column order (column 0 is the best; no ties).  Padding: ``mask[g, k]`` False
    marks an empty slot of a group with fewer than K completions; every field
    holds a finite filler there (0) and losses ignore it.  Each group holds at
    least two completions.  A pair is the K = 2 case (:func:`group_from_pairs`).
    """

    policy_logps: Tensor  # (G, K) log π_θ(z_k|x), differentiable
    ref_logps: Tensor | None = None  # (G, K) log π_ref(z_k|x), constant
    lengths: Tensor | None = None  # (G, K) |z_k| completion tokens, > 0 on real slots
    scores: Tensor | None = None  # (G, K) higher is better; None: column order is the ranking, best first
    mask: Tensor | None = None  # (G, K) bool, False on padding slots; None: every slot holds a completion
    policy_token_logps: Tensor | None = None  # (G, K, T) log π_θ(z_k,t | x, z_k,<t), 0 at padding
    token_entropies: Tensor | None = None  # (G, K, T) H(π_θ(·| x, z_k,<t)), differentiable
    token_mask: Tensor | None = None  # (G, K, T) bool, True on completion tokens
    example_ids: tuple[str, ...] | None = field(default=None, compare=False)  # (G,) one id per group

    FLOAT_FIELDS: ClassVar[tuple[str, ...]] = ("policy_logps", "ref_logps", "scores", "policy_token_logps",
                                               "token_entropies")

    def __post_init__(self) -> None:
        kind, err, ref = "GroupBatch", GroupBatchError, self.policy_logps
        if not isinstance(ref, Tensor) or ref.ndim != 2 or ref.shape[0] == 0 or ref.shape[1] < 2:
            got: object = tuple(ref.shape) if isinstance(ref, Tensor) else type(ref).__name__
            raise err(f"GroupBatch.policy_logps must have shape (G, K) with G >= 1 groups and K >= 2 completions, "
                      f"got {got}")
        g, k = ref.shape
        if self.mask is not None:
            _check_values(kind, err, "mask", _check_field(kind, err, "mask", self.mask, (g, k), ref, "(G, K)"),
                          None, "")
            n = self.mask.sum(dim=1)
            if bool((n < 2).any()):
                bad = int(torch.nonzero(n < 2)[0, 0])
                who = f" (example {self.example_ids[bad]!r})" if self.example_ids is not None else ""
                raise err(f"GroupBatch.mask[{bad}]{who} leaves {int(n[bad])} completion(s): a group needs at least "
                          "two; drop it or pair it")
        for name in ("policy_logps", "ref_logps", "lengths", "scores"):
            t = getattr(self, name)
            if t is not None:
                _check_values(kind, err, name, _check_field(kind, err, name, t, (g, k), ref, "(G, K)"), self.mask,
                              "; put a finite filler (0) in padding slots and mark them in mask")
        _check_token_fields(self, kind, err, (g, k), f"(G, K) = {(g, k)}", "(G, K, T)")
        if self.example_ids is not None and len(self.example_ids) != g:
            raise err(f"GroupBatch.example_ids has {len(self.example_ids)} ids for G = {g} groups")

    @property
    def group_size(self) -> int:
        """K, the number of completion slots per group (padding included)."""
        return int(self.policy_logps.shape[1])

    @property
    def valid(self) -> Tensor:
        """(G, K) bool: True on slots that hold a completion."""
        if self.mask is not None:
            return self.mask
        return torch.ones(self.policy_logps.shape, dtype=torch.bool, device=self.policy_logps.device)

    @property
    def ranking_scores(self) -> Tensor:
        """(G, K) detached values whose order is the ranking (higher is better): ``scores``, else the rank grade,
        the number of real completions in later columns (K − 1 − column without padding; padding never counts)."""
        if self.scores is not None:
            return self.scores.detach()
        v = self.valid.to(self.policy_logps.dtype)
        return (v.flip(1).cumsum(1).flip(1) - v).detach()


@dataclass(frozen=True, kw_only=True)
class UnpairedBatch(_OneTensorBatch):
    """N single completions, each labelled desirable or undesirable: the batch of a ``Shape.UNPAIRED`` loss.

    Log-probs are sums over completion tokens, as in :class:`PreferenceBatch`.
    ``kl_policy_logps`` / ``kl_ref_logps`` are the log-probs of mismatched
    prompt/completion pairs (example i's prompt with another example's
    completion, built as TRL's KTOTrainer builds them), from which KTO estimates
    its reference point z₀; they are constants.
    """

    policy_logps: Tensor  # (N,) log π_θ(y|x), differentiable
    labels: Tensor  # (N,) bool, True = desirable, False = undesirable
    ref_logps: Tensor | None = None  # (N,) log π_ref(y|x), constant
    lengths: Tensor | None = None  # (N,) |y| completion tokens, > 0
    kl_policy_logps: Tensor | None = None  # (N,) log π_θ(y'|x) of a mismatched completion y', constant
    kl_ref_logps: Tensor | None = None  # (N,) log π_ref(y'|x), constant
    policy_token_logps: Tensor | None = None  # (N, T) log π_θ(y_t | x, y_<t), 0 at padding
    token_entropies: Tensor | None = None  # (N, T) H(π_θ(·| x, y_<t)), differentiable
    token_mask: Tensor | None = None  # (N, T) bool, True on completion tokens
    # (N,) BCO's density-ratio weight of each example (1 desirable, clamped p(x|D)/p(x|U) undesirable), constant; set
    # by the trainer's --density-ratio for a loss declaring LossSpec.density_ratio_weights; None: unweighted
    density_ratio_weights: Tensor | None = None
    example_ids: tuple[str, ...] | None = field(default=None, compare=False)  # (N,)

    FLOAT_FIELDS: ClassVar[tuple[str, ...]] = ("policy_logps", "ref_logps", "kl_policy_logps", "kl_ref_logps",
                                               "policy_token_logps", "token_entropies", "density_ratio_weights")
    NEED_FIELDS: ClassVar[dict[Need, tuple[str, ...]]] = {
        **_OneTensorBatch.NEED_FIELDS,
        Need.KL_REFERENCE: ("kl_policy_logps", "kl_ref_logps"),
    }

    def __post_init__(self) -> None:
        kind, err, ref = "UnpairedBatch", UnpairedBatchError, self.policy_logps
        if not isinstance(ref, Tensor) or ref.ndim != 1 or ref.shape[0] == 0:
            got: object = tuple(ref.shape) if isinstance(ref, Tensor) else type(ref).__name__
            raise err(f"UnpairedBatch.policy_logps must have shape (N,) with N >= 1 completions, got {got}")
        n = ref.shape[0]
        if self.labels is None:
            raise err("UnpairedBatch.labels is required: one bool per completion, True = desirable")
        for name in ("policy_logps", "labels", "ref_logps", "lengths", "kl_policy_logps", "kl_ref_logps",
                     "density_ratio_weights"):
            t = getattr(self, name)
            if t is not None:
                _check_values(kind, err, name, _check_field(kind, err, name, t, (n,), ref, "(N,)"), None, "")
        w = self.density_ratio_weights
        if w is not None and bool((w < 0).any()):
            raise err(f"UnpairedBatch.density_ratio_weights[{int(torch.nonzero(w < 0)[0, 0])}] is negative: "
                      "density-ratio weights are >= 0")
        _check_token_fields(self, kind, err, (n,), f"N = {n}", "(N, T)")
        if self.example_ids is not None and len(self.example_ids) != n:
            raise err(f"UnpairedBatch.example_ids has {len(self.example_ids)} ids for N = {n}")



def _pad_tokens(a: Tensor, b: Tensor) -> Tensor:
    """(B, T_a) and (B, T_b) stacked to (B, 2, max T), zero/False padded on the right."""
    t = max(a.shape[1], b.shape[1])
    a = torch.nn.functional.pad(a, (0, t - a.shape[1]))
    b = torch.nn.functional.pad(b, (0, t - b.shape[1]))
    return torch.stack((a, b), dim=1)


def group_from_pairs(batch: PreferenceBatch) -> GroupBatch:
    """The K = 2 GroupBatch of a PreferenceBatch: column 0 the chosen, column 1 the rejected, ranked by column.

    Differentiable (a stack), so gradients reach the PreferenceBatch's fields.  The way back is
    ``prefzoo.pairs_from_lists(group, "best-worst")``.
    """

    def both(a: Tensor | None, b: Tensor | None) -> Tensor | None:
        return None if a is None or b is None else torch.stack((a, b), dim=1)

    def tokens(a: Tensor | None, b: Tensor | None) -> Tensor | None:
        return None if a is None or b is None else _pad_tokens(a, b)

    return GroupBatch(
        policy_logps=torch.stack((batch.policy_chosen_logps, batch.policy_rejected_logps), dim=1),
        ref_logps=both(batch.ref_chosen_logps, batch.ref_rejected_logps),
        lengths=both(batch.chosen_lengths, batch.rejected_lengths),
        policy_token_logps=tokens(batch.policy_chosen_token_logps, batch.policy_rejected_token_logps),
        token_entropies=tokens(batch.chosen_token_entropies, batch.rejected_token_entropies),
        token_mask=tokens(batch.chosen_mask, batch.rejected_mask),
        example_ids=batch.example_ids,
    )


AnyBatch = PreferenceBatch | GroupBatch | UnpairedBatch
BATCH_TYPES: dict[Shape, type[PreferenceBatch] | type[GroupBatch] | type[UnpairedBatch]] = {
    Shape.PAIR: PreferenceBatch,
    Shape.LIST: GroupBatch,
    Shape.UNPAIRED: UnpairedBatch,
}


def shape_of(batch: object) -> Shape | None:
    """The Shape of a batch object, or None when it is none of the three batch types."""
    for shape, cls in BATCH_TYPES.items():
        if isinstance(batch, cls):
            return shape
    return None


# A stateful loss's running quantities (detached tensors by name), carried by prefzoo.Loss between calls and saved with
# checkpoints: e.g. BCO's {"delta": (), "count": ()}.
LossState = dict[str, Tensor]


@dataclass
class LossOutput:
    """What a loss returns.  Reduction (mean over examples) belongs to the trainer.

    One loss per *example* of the batch's shape; reward accuracy is always mean(chosen_rewards > rejected_rewards):

    ============  ==========  ==========================================  ==============================
    shape         losses      chosen_rewards / rejected_rewards           rewards
    ============  ==========  ==========================================  ==============================
    PAIR          (B,)        score of y_w / of y_l                       None, or (B, 2) from a list loss
    LIST          (G,) group  score of the best / of the worst completion  (G, K) every completion's score
                              of the group (by the ranking)               (0 on padding slots)
    UNPAIRED      (N,)        score of the completion / the point it is   (N,) the completion's score
                              compared with (KTO: z₀; 0 if none)
    ============  ==========  ==========================================  ==============================

    For unpaired data "accuracy" is then mean((chosen > rejected) == labels).
    """

    losses: Tensor  # (B,) / (G,) / (N,) per-example losses, differentiable, not reduced
    chosen_rewards: Tensor  # (B,) detached scores of y_w; reward accuracy = mean(chosen > rejected)
    rejected_rewards: Tensor  # (B,) detached scores of y_l
    metrics: dict[str, Tensor] = field(default_factory=dict)  # detached scalars or (B,) extras
    rewards: Tensor | None = None  # lists: (G, K), unpaired: (N,) detached per-completion scores; pairs: None/(B, 2)
    state: LossState | None = None  # a stateful loss's state after this call (LossSpec.initial_state); else None


def _identity(t: Tensor) -> Tensor:
    return t


@dataclass(frozen=True)
class LossContext:
    """What a loss may ask of its surroundings, so one function runs in a unit test and on 64 GPUs.

    ``gather(t)`` returns the concatenation of ``t`` over all processes, in rank order
    (the identity on one process).  Losses only gather detached tensors, so the
    hook need not be differentiable (accelerate's ``gather`` is not).

    ``state`` is what a stateful loss carried over from its previous call (BCO's running
    reward mean δ); it returns the next one in ``LossOutput.state``, computed only from
    the previous state and gathered values, so that every process holds the same state.
    """

    gather: Callable[[Tensor], Tensor] = _identity
    state: Mapping[str, Tensor] | None = None  # a stateful loss's state before this call; None for the others
    update_state: bool = True  # False in evaluation: the loss reads its state and returns it unchanged

    @property
    def distributed(self) -> bool:
        return self.gather is not _identity

    def offset(self, n: int, device: torch.device | str = "cpu") -> int:
        """Where this process's ``n`` examples start in ``gather(t)``: 0 on one process.

        A loss does not know its rank: every process gathers (its size, a random 56-bit token) and finds its own row.
        """
        if not self.distributed:
            return 0
        token = int.from_bytes(os.urandom(7), "little")
        rows = self.gather(torch.tensor([[n, token]], dtype=torch.int64, device=device)).cpu()  # (P, 2)
        mine = int(torch.nonzero(rows[:, 1] == token)[0])
        return int(rows[:mine, 0].sum())


def error_summary(e: BaseException, limit: int = 300) -> str:
    """``Type: first line of the message`` (at most ``limit`` characters of it), for one-line errors."""
    return f"{type(e).__name__}: {(str(e).strip().splitlines() or [''])[0][:limit]}"
