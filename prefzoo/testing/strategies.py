"""Hypothesis strategies for batches of every shape (pairs, lists, unpaired) and loss hyperparameters.

Domains (stated so a failing example can be judged): summed log-probs in
[−1e4, 0], completion lengths in [1, 4096], batch sizes 1..64, dtypes
float64/float32/bfloat16.  Ties (policy equal across the pair, policy equal to
the reference) are drawn on purpose, since they are where 0/0 bugs and sort
ties live.  Parameter strategies read the bounds and choices declared with
:func:`prefzoo.param`, so a plugin's params are covered without extra code.
"""

from __future__ import annotations

import math
from typing import Any

import torch
from hypothesis import strategies as st
from torch import Tensor

from prefzoo.spec import LossParamError, LossSpec, ParamInfo, param_infos, value_type
from prefzoo.types import GroupBatch, Need, PreferenceBatch, Shape, UnpairedBatch

__all__ = [
    "DTYPES",
    "LOGP_MIN",
    "MAX_LENGTH",
    "batches_for",
    "group_batches",
    "loss_params",
    "preference_batches",
    "unpaired_batches",
]

LOGP_MIN = -1e4  # smallest summed log-prob drawn
MAX_LENGTH = 4096  # longest completion drawn
MAX_TOKENS = 8  # width T of token-level fields (they are drawn independently of the summed log-probs)
DTYPES: dict[str, torch.dtype] = {"float64": torch.float64, "float32": torch.float32, "bfloat16": torch.bfloat16}
_VOCAB = 50_000  # vocabulary size behind the token-level draws (entropy ≤ log V)
_PARAM_SPAN = 10.0  # an unbounded parameter is drawn within 10 of its bound (or of 0)


def _as_dtype(d: str | torch.dtype) -> torch.dtype:
    return DTYPES[d] if isinstance(d, str) else d


def _flag(draw: st.DrawFn, flag: bool | None, label: str) -> bool:
    """A field group's switch: ``flag`` as given, or drawn (as ``label``) when it is None."""
    return draw(st.booleans(), label=label) if flag is None else flag


def _token_logp_lists(size: int) -> st.SearchStrategy[list[float]]:
    """``size`` per-token log-probs in [−30, 0]."""
    return st.lists(st.floats(-30.0, 0.0, allow_nan=False, width=64), min_size=size, max_size=size)


def _draw_token_rows(draw: st.DrawFn, rows: int, prefix: str) -> tuple[int, Tensor, Tensor, Tensor]:
    """Draws T, ``rows`` token counts, per-token log-probs, entropies: (T, mask, log π_t, H_t), each (rows, T)."""
    t = draw(st.integers(1, MAX_TOKENS), label=f"{prefix}T")
    cnt = torch.tensor(draw(st.lists(st.integers(1, t), min_size=rows, max_size=rows), label=f"{prefix}token_counts"))
    mask = torch.arange(t)[None, :] < cnt[:, None]  # (rows, T) True on completion tokens
    ent = st.lists(st.floats(0.0, math.log(_VOCAB), allow_nan=False, width=64), min_size=rows * t, max_size=rows * t)
    lp = torch.tensor(draw(_token_logp_lists(rows * t), label=f"{prefix}token_logps"), dtype=torch.float64)
    h = torch.tensor(draw(ent, label=f"{prefix}token_entropies"), dtype=torch.float64)
    return t, mask, lp.view(rows, t) * mask, h.view(rows, t) * mask


def _draw_pair_reference(
    draw: st.DrawFn, vec: st.SearchStrategy[list[float]], pw: Tensor, pl: Tensor, dtype: torch.dtype
) -> dict[str, Tensor]:
    """Reference log-probs of both responses, equal to the policy's on a drawn subset of pairs."""
    b = pw.shape[0]
    rw = torch.tensor(draw(vec, label="ref_chosen_logps"), dtype=torch.float64)
    rl = torch.tensor(draw(vec, label="ref_rejected_logps"), dtype=torch.float64)
    same = draw(st.lists(st.booleans(), min_size=b, max_size=b), label="reference_equals_policy")
    same_t = torch.tensor(same)
    return {
        "ref_chosen_logps": torch.where(same_t, pw, rw).to(dtype),
        "ref_rejected_logps": torch.where(same_t, pl, rl).to(dtype),
    }


def _draw_pair_token_side(
    draw: st.DrawFn,
    side: str,
    b: int,
    dtype: torch.dtype,
    requires_grad: bool,
    ref_token_level: bool,
    token_sq_probs: bool,
) -> dict[str, Tensor]:
    """One side's token-level fields: log-probs, entropies and mask, optionally reference log-probs and log Σπ²."""
    t, mask, lp, h = _draw_token_rows(draw, b, f"{side}_")
    pol = "policy_chosen_token_logps" if side == "chosen" else "policy_rejected_token_logps"
    fields = {
        pol: lp.to(dtype).requires_grad_(requires_grad),
        f"{side}_token_entropies": h.to(dtype).requires_grad_(requires_grad),
        f"{side}_mask": mask,
    }
    if ref_token_level:
        tok = _token_logp_lists(b * t)
        ref = torch.tensor(draw(tok, label=f"ref_{side}_token_logps"), dtype=torch.float64).view(b, t) * mask
        fields[f"ref_{side}_token_logps"] = ref.to(dtype)
    if token_sq_probs:
        unit = st.lists(st.floats(0.0, 1.0, width=64), min_size=b * t, max_size=b * t)
        u = torch.tensor(draw(unit, label=f"{side}_sq_fraction"), dtype=torch.float64).view(b, t)
        # a distribution over V = 50,000 tokens has Σπ² ≥ π(y_t)², ≥ 1/V, and π(y_t)/Σπ² ≤ √V/2
        lo = torch.maximum(torch.maximum(2 * lp, lp - math.log(math.sqrt(_VOCAB) / 2)),
                           torch.tensor(-math.log(_VOCAB), dtype=torch.float64))  # fmt: skip
        fields[f"{side}_token_log_sq_probs"] = (lo * u * mask).to(dtype)
    return fields


def _draw_pair_scores(draw: st.DrawFn, b: int, dtype: torch.dtype) -> dict[str, Tensor]:
    """Data scores s_w > s_l in multiples of 1/8 in [−10, 10]: exact in bfloat16 too, so s_w > s_l survives the cast."""
    eighths = st.lists(st.integers(-80, 80), min_size=b, max_size=b)
    s_l = torch.tensor(draw(eighths, label="rejected_scores_x8"), dtype=torch.float64) / 8
    gaps = st.lists(st.integers(1, 80), min_size=b, max_size=b)
    s_w = (s_l + torch.tensor(draw(gaps, label="score_gaps_x8"), dtype=torch.float64) / 8).clamp(max=10.0)
    s_l = torch.minimum(s_l, s_w - 0.125)
    return {"chosen_scores": s_w.to(dtype), "rejected_scores": s_l.to(dtype)}


@st.composite
def preference_batches(
    draw: st.DrawFn,
    *,
    min_size: int = 1,
    max_size: int = 64,
    dtypes: tuple[str | torch.dtype, ...] = ("float64", "float32", "bfloat16"),
    reference: bool | None = None,
    lengths: bool | None = None,
    token_level: bool | None = False,
    logp_min: float = LOGP_MIN,
    requires_grad: bool = False,
    ref_token_level: bool = False,
    token_sq_probs: bool = False,
    scores: bool = False,
) -> PreferenceBatch:
    """A PreferenceBatch of 1..64 pairs; ``None`` for a field group means "drawn either way".

    ``reference`` / ``lengths`` / ``token_level``: True always includes those
    fields, False never, None lets Hypothesis choose.  Policy log-probs are
    leaves with ``requires_grad`` when asked, so gradients can be read off them.  With token-level fields,
    ``ref_token_level`` adds reference token log-probs and ``token_sq_probs`` WPO's log Σ_v π(v)² (drawn where a
    distribution over 50,000 tokens can put it); ``scores`` adds data scores with s_w > s_l (ODPO's domain).
    """
    b = draw(st.integers(min_size, max_size), label="batch_size")
    dtype = _as_dtype(draw(st.sampled_from(dtypes), label="dtype"))
    logp = st.floats(logp_min, 0.0, allow_nan=False, allow_infinity=False, width=64)
    vec = st.lists(logp, min_size=b, max_size=b)
    pw = torch.tensor(draw(vec, label="policy_chosen_logps"), dtype=torch.float64)
    pl = torch.tensor(draw(vec, label="policy_rejected_logps"), dtype=torch.float64)
    ties = draw(st.lists(st.booleans(), min_size=b, max_size=b), label="policy_ties")
    pl = torch.where(torch.tensor(ties), pw, pl)  # log π(y_l) == log π(y_w) where tied
    fields: dict[str, Any] = {}
    if _flag(draw, reference, "with_reference"):
        fields.update(_draw_pair_reference(draw, vec, pw, pl, dtype))
    if _flag(draw, lengths, "with_lengths"):
        lens = st.lists(st.integers(1, MAX_LENGTH), min_size=b, max_size=b)
        fields["chosen_lengths"] = torch.tensor(draw(lens, label="chosen_lengths"), dtype=torch.long)
        fields["rejected_lengths"] = torch.tensor(draw(lens, label="rejected_lengths"), dtype=torch.long)
    if _flag(draw, token_level, "with_token_fields"):
        for side in ("chosen", "rejected"):
            fields.update(_draw_pair_token_side(draw, side, b, dtype, requires_grad, ref_token_level, token_sq_probs))
    if scores:
        fields.update(_draw_pair_scores(draw, b, dtype))
    return PreferenceBatch(
        policy_chosen_logps=pw.to(dtype).requires_grad_(requires_grad),
        policy_rejected_logps=pl.to(dtype).requires_grad_(requires_grad),
        **fields,
    )


def batches_for(spec: LossSpec, shape: Shape = Shape.PAIR, **kw: Any) -> st.SearchStrategy[Any]:
    """Batches of ``shape`` carrying every input ``spec`` needs; optional inputs are drawn either way.

    PAIR: :func:`preference_batches`, LIST: :func:`group_batches` (``max_size`` is capped at 16 groups),
    UNPAIRED: :func:`unpaired_batches`.
    """
    kw.setdefault("reference", True if Need.REFERENCE in spec.needs else None)
    kw.setdefault("lengths", True if Need.LENGTHS in spec.needs else None)
    token_needs = {Need.TOKEN_LOGPS, Need.TOKEN_ENTROPIES, Need.REF_TOKEN_LOGPS, Need.TOKEN_SQUARED_PROBS}
    kw.setdefault("token_level", bool(token_needs & spec.needs))
    if shape is Shape.LIST:
        kw["max_size"] = min(kw.get("max_size", 16), 16)
        return group_batches(**kw)
    if shape is Shape.UNPAIRED:
        kw.setdefault("kl", True if Need.KL_REFERENCE in spec.needs else None)
        kw.setdefault("density_ratio", None if spec.density_ratio_weights else False)
        return unpaired_batches(**kw)
    kw.setdefault("ref_token_level", Need.REF_TOKEN_LOGPS in spec.needs)
    kw.setdefault("token_sq_probs", Need.TOKEN_SQUARED_PROBS in spec.needs)
    kw.setdefault("scores", Need.SCORES in spec.needs)
    return preference_batches(**kw)


def param_strategy(info: ParamInfo) -> st.SearchStrategy[Any]:
    """Values of one declared hyperparameter inside its bounds (unbounded sides get a span of 10)."""
    if info.choices is not None:
        return st.sampled_from(info.choices)
    typ, optional = value_type(info.type)
    if typ is bool:
        base: st.SearchStrategy[Any] = st.booleans()
    elif typ is int:
        lo = info.ge if info.ge is not None else (math.floor(info.gt) + 1 if info.gt is not None else None)
        hi = info.le if info.le is not None else (math.ceil(info.lt) - 1 if info.lt is not None else None)
        lo = int(lo) if lo is not None else (int(hi) - 10 if hi is not None else -10)
        hi = int(hi) if hi is not None else lo + 10
        base = st.integers(lo, hi)
    elif typ is float:
        lo_f = info.ge if info.ge is not None else info.gt
        hi_f = info.le if info.le is not None else info.lt
        if lo_f is None:
            lo_f = (hi_f - _PARAM_SPAN) if hi_f is not None else -_PARAM_SPAN
        if hi_f is None:
            hi_f = max(lo_f, 0.0) + _PARAM_SPAN
        if info.gt is not None:  # an open bound such as β > 0: stay 1e-3 away from it, not 5e-324
            lo_f = info.gt + max(1e-3, abs(info.gt) * 1e-3)
        if info.lt is not None:
            hi_f = info.lt - max(1e-3, abs(info.lt) * 1e-3)
        base = st.floats(float(lo_f), float(hi_f), allow_nan=False, allow_infinity=False)
    else:
        base = st.just(info.default)
    return st.one_of(st.none(), base) if optional else base


@st.composite
def loss_params(draw: st.DrawFn, spec: LossSpec, *, defaults_weight: float = 0.2) -> Any:
    """Validated params for ``spec``: each field from its declared range, or its default.

    Cross-field checks (``LossParams.check``) are honoured by retrying; the
    defaults alone are always a valid draw.
    """
    infos = param_infos(spec.params_cls)
    for _ in range(20):
        kw = {}
        for info in infos:
            use_default = draw(st.floats(0, 1), label=f"{info.name}_use_default") < defaults_weight
            kw[info.name] = info.default if use_default else draw(param_strategy(info), label=info.name)
        try:
            return spec.params(**kw)
        except LossParamError:
            continue
    return spec.params()


def _draw_group_mask(draw: st.DrawFn, g: int, k: int) -> Tensor:
    """A (G, K) mask of real slots, anywhere in the row, with at least two real completions per group."""
    keep = torch.tensor(draw(st.lists(st.booleans(), min_size=g * k, max_size=g * k), label="real_slots"))
    mask = keep.view(g, k)
    for i in range(g):  # at least two real completions per group
        if int(mask[i].sum()) < 2:
            mask[i, :2] = True
    return mask


def _draw_group_scores(draw: st.DrawFn, mask: Tensor) -> Tensor:
    """(G, K) float64 scores, a few grades 0..3 (ties common) or floats in [0, 10]; 0 on padded slots."""
    g, k = mask.shape
    grade = draw(st.booleans(), label="integer_grades")
    val = st.integers(0, 3).map(float) if grade else st.floats(0.0, 10.0, allow_nan=False)
    sc = torch.tensor(draw(st.lists(val, min_size=g * k, max_size=g * k), label="scores"), dtype=torch.float64)
    return sc.view(g, k).masked_fill(~mask, 0.0)


@st.composite
def group_batches(
    draw: st.DrawFn,
    *,
    min_size: int = 1,
    max_size: int = 16,
    max_k: int = 6,
    dtypes: tuple[str | torch.dtype, ...] = ("float64", "float32", "bfloat16"),
    reference: bool | None = None,
    lengths: bool | None = None,
    scores: bool | None = None,
    padding: bool | None = None,
    token_level: bool | None = False,
    logp_min: float = LOGP_MIN,
    requires_grad: bool = False,
) -> GroupBatch:
    """A GroupBatch of 1..16 groups of K = 2..6 slots; ``None`` for a field group means "drawn either way".

    Scores are drawn from a few grades (0..3, so ties are common) or as floats in [0, 10]; padding leaves at
    least two real completions per group, anywhere in the row, with a 0 filler.  Ties of the policy log-prob
    across a group's completions are drawn on purpose, as in :func:`preference_batches`.
    """
    g = draw(st.integers(min_size, max_size), label="groups")
    k = draw(st.integers(2, max_k), label="K")
    dtype = _as_dtype(draw(st.sampled_from(dtypes), label="dtype"))
    logp = st.floats(logp_min, 0.0, allow_nan=False, allow_infinity=False, width=64)
    mat = st.lists(logp, min_size=g * k, max_size=g * k)
    pol = torch.tensor(draw(mat, label="policy_logps"), dtype=torch.float64).view(g, k)
    ties = torch.tensor(draw(st.lists(st.booleans(), min_size=g * k, max_size=g * k), label="policy_ties")).view(g, k)
    ties[:, 0] = False
    pol = torch.where(ties, pol[:, :1].expand(g, k), pol)  # a tied slot copies the group's first completion
    padding = _flag(draw, padding, "with_padding")
    mask = _draw_group_mask(draw, g, k) if padding and k > 2 else torch.ones(g, k, dtype=torch.bool)
    fields: dict[str, Any] = {"mask": mask if padding else None}
    if _flag(draw, reference, "with_reference"):
        ref = torch.tensor(draw(mat, label="ref_logps"), dtype=torch.float64).view(g, k)
        same = torch.tensor(draw(st.lists(st.booleans(), min_size=g * k, max_size=g * k), label="ref_is_policy"))
        fields["ref_logps"] = torch.where(same.view(g, k), pol, ref).masked_fill(~mask, 0.0).to(dtype)
    if _flag(draw, lengths, "with_lengths"):
        lens = st.lists(st.integers(1, MAX_LENGTH), min_size=g * k, max_size=g * k)
        fields["lengths"] = torch.tensor(draw(lens, label="lengths")).view(g, k).masked_fill(~mask, 0)
    if _flag(draw, scores, "with_scores"):
        fields["scores"] = _draw_group_scores(draw, mask).to(dtype)
    if _flag(draw, token_level, "with_token_fields"):
        t, tmask, lp, h = _draw_token_rows(draw, g * k, "")  # (G·K, T)
        fields["policy_token_logps"] = lp.view(g, k, t).to(dtype).requires_grad_(requires_grad)
        fields["token_entropies"] = h.view(g, k, t).to(dtype).requires_grad_(requires_grad)
        fields["token_mask"] = tmask.view(g, k, t)
    pol = pol.masked_fill(~mask, 0.0)
    return GroupBatch(policy_logps=pol.to(dtype).requires_grad_(requires_grad), **fields)


@st.composite
def unpaired_batches(
    draw: st.DrawFn,
    *,
    min_size: int = 1,
    max_size: int = 64,
    dtypes: tuple[str | torch.dtype, ...] = ("float64", "float32", "bfloat16"),
    reference: bool | None = None,
    lengths: bool | None = None,
    kl: bool | None = None,
    token_level: bool | None = False,
    logp_min: float = LOGP_MIN,
    requires_grad: bool = False,
    density_ratio: bool | None = False,
) -> UnpairedBatch:
    """An UnpairedBatch of 1..64 labelled completions (all-desirable and all-undesirable batches included).

    ``kl``: the mismatched-pair log-probs of KTO's reference point.  Policy equal to reference is drawn on purpose.
    ``density_ratio``: BCO's density-ratio weights, 1 on desirable and in [0.25, 10] on undesirable examples.
    """
    n = draw(st.integers(min_size, max_size), label="N")
    dtype = _as_dtype(draw(st.sampled_from(dtypes), label="dtype"))
    logp = st.floats(logp_min, 0.0, allow_nan=False, allow_infinity=False, width=64)
    vec = st.lists(logp, min_size=n, max_size=n)
    flags = st.lists(st.booleans(), min_size=n, max_size=n)
    pol = torch.tensor(draw(vec, label="policy_logps"), dtype=torch.float64)
    labels = torch.tensor(draw(flags, label="labels"), dtype=torch.bool)
    fields: dict[str, Any] = {}
    if _flag(draw, reference, "with_reference"):
        ref = torch.tensor(draw(vec, label="ref_logps"), dtype=torch.float64)
        fields["ref_logps"] = torch.where(torch.tensor(draw(flags, label="ref_is_policy")), pol, ref).to(dtype)
    if _flag(draw, lengths, "with_lengths"):
        lens = st.lists(st.integers(1, MAX_LENGTH), min_size=n, max_size=n)
        fields["lengths"] = torch.tensor(draw(lens, label="lengths"))
    if _flag(draw, kl, "with_kl"):
        fields["kl_policy_logps"] = torch.tensor(draw(vec, label="kl_policy_logps"), dtype=torch.float64).to(dtype)
        fields["kl_ref_logps"] = torch.tensor(draw(vec, label="kl_ref_logps"), dtype=torch.float64).to(dtype)
    if token_level:
        _, tmask, lp, h = _draw_token_rows(draw, n, "")
        fields["policy_token_logps"] = lp.to(dtype).requires_grad_(requires_grad)
        fields["token_entropies"] = h.to(dtype).requires_grad_(requires_grad)
        fields["token_mask"] = tmask
    if _flag(draw, density_ratio, "with_density_ratio"):  # multiples of 1/8: exact in bfloat16 too
        eighths = st.lists(st.integers(2, 80), min_size=n, max_size=n)
        w = torch.tensor(draw(eighths, label="density_ratio_weights_x8"), dtype=torch.float64) / 8
        fields["density_ratio_weights"] = torch.where(labels, torch.ones_like(w), w).to(dtype)
    return UnpairedBatch(policy_logps=pol.to(dtype).requires_grad_(requires_grad), labels=labels, **fields)
