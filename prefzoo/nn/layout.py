"""Which batch a loss takes from R stacked rows, and that batch built from per-row tensors (no loss names read).

Rows are stacked in blocks, one block per rank, as Liger stacks chosen over rejected:

- pairs (``Shape.PAIR``): R = 2B, rows 0..B-1 the chosen completions y_w, rows B..2B-1 the rejected y_l of the same
  prompts in the same order → :class:`~prefzoo.types.PreferenceBatch`;
- lists of K (``Shape.LIST``): R = K·G, row k·G + g is completion k of prompt g (block 0 best when no ``scores`` are
  given: the column order is then the ranking); a row with no scored token is a padding slot →
  :class:`~prefzoo.types.GroupBatch` (G, K); K = 2 is the pair layout;
- unpaired (``Shape.UNPAIRED``): R = N rows, any order, each with its ``labels`` entry (True = desirable) →
  :class:`~prefzoo.types.UnpairedBatch`.
"""

from __future__ import annotations

from typing import Any

from torch import Tensor

from prefzoo.nn.rows import FusedInputError
from prefzoo.types import GroupBatch, PreferenceBatch, Shape, UnpairedBatch

__all__ = ["RowFields", "build_batch", "choose_shape"]

RowFields = dict[str, Any]  # UnpairedBatch's field names, each (R, ...) in row order, or None


def choose_shape(spec: Any, rows: int, labels: Tensor | None, group_size: int | None) -> tuple[Shape, int]:
    """(the batch shape, its group size K: 2 for pairs, 1 for unpaired rows) for a loss spec and R ``rows``."""
    takes = ", ".join(sorted(s.value for s in spec.shapes))
    if labels is not None:
        if Shape.UNPAIRED not in spec.shapes:
            raise FusedInputError(f"labels is for unpaired losses, but loss {spec.name!r} takes {takes}: drop labels")
        if group_size not in (None, 1):
            raise FusedInputError(f"group_size={group_size} with labels: unpaired rows have no groups; drop one")
        return Shape.UNPAIRED, 1
    if not spec.accepts(Shape.PAIR) and not spec.accepts(Shape.LIST):
        raise FusedInputError(f"loss {spec.name!r} takes unpaired rows: labels (R,) bool is required")
    k = 2 if group_size is None else group_size
    if k < 2:
        raise FusedInputError(f"group_size must be >= 2 completions per prompt, got {k}")
    shape = Shape.PAIR if k == 2 and Shape.PAIR in spec.shapes else Shape.LIST
    if not spec.accepts(shape):
        raise FusedInputError(f"group_size={k}: loss {spec.name!r} takes {takes}, not lists of {k}; use group_size=2")
    if rows % k:
        what = "chosen rows over rejected rows (2B)" if k == 2 else f"K = {k} blocks of G rows"
        raise FusedInputError(f"_input must stack {what}, got R = {rows} rows")
    return shape, k


def _blocks(t: Tensor | None, k: int) -> Tensor | None:
    """(R, ...) rows in K blocks → (G, K, ...) groups; None stays None."""
    if t is None:
        return None
    return t.reshape(k, t.shape[0] // k, *t.shape[1:]).transpose(0, 1)


def _pair_batch(f: RowFields) -> PreferenceBatch:
    b = f["policy_logps"].shape[0] // 2

    def w(name: str) -> Tensor | None:
        return None if f.get(name) is None else f[name][:b]

    def l(name: str) -> Tensor | None:  # noqa: E743
        return None if f.get(name) is None else f[name][b:]

    return PreferenceBatch(
        policy_chosen_logps=f["policy_logps"][:b], policy_rejected_logps=f["policy_logps"][b:],
        ref_chosen_logps=w("ref_logps"), ref_rejected_logps=l("ref_logps"),
        chosen_lengths=w("lengths"), rejected_lengths=l("lengths"),
        policy_chosen_token_logps=w("policy_token_logps"), policy_rejected_token_logps=l("policy_token_logps"),
        chosen_token_entropies=w("token_entropies"), rejected_token_entropies=l("token_entropies"),
        chosen_mask=w("token_mask"), rejected_mask=l("token_mask"),
        ref_chosen_token_logps=w("ref_token_logps"), ref_rejected_token_logps=l("ref_token_logps"),
        chosen_token_log_sq_probs=w("token_log_sq_probs"), rejected_token_log_sq_probs=l("token_log_sq_probs"),
        chosen_scores=w("scores"), rejected_scores=l("scores"),
    )  # fmt: skip


def _group_batch(f: RowFields, k: int) -> GroupBatch:
    lengths, logps = _blocks(f["lengths"], k), _blocks(f["policy_logps"], k)  # (G, K) each
    assert lengths is not None and logps is not None
    return GroupBatch(
        policy_logps=logps, ref_logps=_blocks(f.get("ref_logps"), k),
        lengths=lengths, scores=_blocks(f.get("scores"), k), mask=lengths > 0,
        policy_token_logps=_blocks(f.get("policy_token_logps"), k),
        token_entropies=_blocks(f.get("token_entropies"), k), token_mask=_blocks(f.get("token_mask"), k),
    )  # fmt: skip


def build_batch(shape: Shape, k: int, f: RowFields) -> Any:
    """The batch of ``shape`` from per-row fields (UnpairedBatch names; ``labels``, ``kl_*`` for unpaired rows)."""
    if shape is Shape.PAIR:
        return _pair_batch(f)
    if shape is Shape.LIST:
        return _group_batch(f, k)
    names = ("policy_logps", "labels", "ref_logps", "lengths", "kl_policy_logps", "kl_ref_logps",
             "policy_token_logps", "token_entropies", "token_mask")  # fmt: skip
    fields: dict[str, Any] = {n: f.get(n) for n in names}
    return UnpairedBatch(**fields)
