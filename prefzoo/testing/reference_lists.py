"""Float64 reference formulas of the built-in list losses, written independently of prefzoo.losses.lists.

Plain Python over groups and completions (``math.fsum``, explicit max-trick logsumexp): slow and obvious,
the "known good" side of the list property tests.  ``LIST_REFERENCES[name](batch, params) -> (G,)`` takes a
GroupBatch; ``pair_reference(name)`` is the same formula on a PreferenceBatch's fields (K = 2, column order),
for the conformance kit's ``reference`` property.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor

from prefzoo.types import GroupBatch

__all__ = ["LIST_REFERENCES", "Group", "groups_of", "pair_reference"]

Group = list[dict[str, float]]  # the real completions of one group: logp, ref, length, rank (higher is better)


def groups_of(batch: GroupBatch) -> list[Group]:
    """The batch as Python floats, padding dropped; ``rank`` is the score, or K − 1 − column without scores."""
    g, k = batch.policy_logps.shape
    valid = batch.valid.tolist()
    out: list[Group] = []
    for i in range(g):
        items = []
        for j in range(k):
            if not valid[i][j]:
                continue
            items.append({
                "logp": float(batch.policy_logps[i, j]),
                "ref": float(batch.ref_logps[i, j]) if batch.ref_logps is not None else math.nan,
                "length": float(batch.lengths[i, j]) if batch.lengths is not None else math.nan,
                "rank": float(batch.scores[i, j]) if batch.scores is not None else float(k - 1 - j),
            })
        out.append(items)
    return out


def _lse(xs: list[float]) -> float:
    m = max(xs)
    return m + math.log(math.fsum(math.exp(x - m) for x in xs))


def _softplus(x: float) -> float:
    return max(x, 0.0) + math.log1p(math.exp(-abs(x)))


def _pl_nll(s: list[float], rank: list[float]) -> float:
    """Σ_i log Σ_{j: rank_j ≤ rank_i} exp(s_j − s_i) (Plackett–Luce with the Breslow convention for ties)."""
    return math.fsum(_lse([s[j] - s[i] for j in range(len(s)) if rank[j] <= rank[i]]) for i in range(len(s)))


def _minmax(values: list[float], eps: float) -> Callable[[float], float]:
    lo, hi = min(values), max(values)
    d = hi + eps - lo
    return (lambda v: (v + eps - lo) / d) if d > 0 else (lambda v: 0.0)


def _mml_scores(groups: list[Group], p: Any) -> list[list[float]]:
    """s_k = log π + R̂_k with R = r + β·log π_ref, both normalisations over every real completion of the batch."""
    if p.reward_from == "rank":
        r = [[p.reward_epsilon if it["rank"] == max(x["rank"] for x in grp) else p.rejected_reward for it in grp]
             for grp in groups]
    else:
        scale = _minmax([it["rank"] for grp in groups for it in grp], 0.0)
        r = [[scale(it["rank"]) for it in grp] for grp in groups]
    R = [[ri + p.beta * it["ref"] for ri, it in zip(rg, grp, strict=True)] for rg, grp in zip(r, groups, strict=True)]
    norm = _minmax([v for rg in R for v in rg], p.norm_eps)
    return [[it["logp"] + norm(v) for v, it in zip(rg, grp, strict=True)] for rg, grp in zip(R, groups, strict=True)]


def _mml(groups: list[Group], p: Any) -> list[float]:
    return [-_lse(s) for s in _mml_scores(groups, p)]


def _mmpo_list(groups: list[Group], p: Any) -> list[float]:
    return [-_lse(s) + _pl_nll(s, [it["rank"] for it in grp])
            for s, grp in zip(_mml_scores(groups, p), groups, strict=True)]


def _u(grp: Group, p: Any) -> list[float]:
    return [p.beta * (it["logp"] - it["ref"]) for it in grp]


def _dpo_pl(groups: list[Group], p: Any) -> list[float]:
    return [_pl_nll(_u(grp, p), [it["rank"] for it in grp]) for grp in groups]


def _lipo(groups: list[Group], p: Any) -> list[float]:
    out = []
    for grp in groups:
        u, psi = _u(grp, p), [it["rank"] for it in grp]
        n = len(grp)
        # the ranks τ each completion can take when tied u are ordered either way: 1 + #(higher u) + 0..#(tied) − 1
        places = [range(1 + sum(u[j] > u[i] for j in range(n)), 1 + sum(u[j] >= u[i] for j in range(n)))
                  for i in range(n)]
        terms = []
        for i in range(n):
            for j in range(n):
                if psi[i] > psi[j]:
                    gaps = [abs(1 / math.log2(1 + x) - 1 / math.log2(1 + y)) for x in places[i] for y in places[j]
                            if x != y]  # every order of the ties, equally likely
                    delta = abs(2 ** psi[i] - 2 ** psi[j]) * math.fsum(gaps) / len(gaps)
                    terms.append(delta * _softplus(-(u[i] - u[j])))
        out.append(math.fsum(terms))
    return out


def _rrhf(groups: list[Group], p: Any) -> list[float]:
    out = []
    for grp in groups:
        pk = [it["logp"] / it["length"] for it in grp]
        rank = [it["rank"] for it in grp]
        hinge = math.fsum(max(0.0, pk[i] - pk[j]) for i in range(len(grp)) for j in range(len(grp))
                          if rank[i] < rank[j])
        best = [it["logp"] for it in grp if it["rank"] == max(rank)]
        out.append(hinge - p.sft_weight * math.fsum(best) / len(best))
    return out


_FORMULAS: dict[str, Callable[[list[Group], Any], list[float]]] = {
    "mml": _mml, "mmpo-list": _mmpo_list, "dpo-pl": _dpo_pl, "lipo": _lipo, "rrhf": _rrhf,
}


def _on_groups(f: Callable[[list[Group], Any], list[float]]) -> Callable[[GroupBatch, Any], Tensor]:
    return lambda batch, p: torch.tensor(f(groups_of(batch), p), dtype=torch.float64)


LIST_REFERENCES: dict[str, Callable[[GroupBatch, Any], Tensor]] = {k: _on_groups(f) for k, f in _FORMULAS.items()}


def pair_reference(name: str) -> Callable[[dict[str, Any], Any], Tensor]:
    """The list formula ``name`` on a pair batch's float64 fields (prefzoo.testing.reference.to_float64's dict)."""
    f = _FORMULAS[name]

    def ref(x: dict[str, Any], p: Any) -> Tensor:
        groups: list[Group] = []
        for i in range(x["policy_chosen_logps"].shape[0]):
            grp = []
            for side, rank in (("chosen", 1.0), ("rejected", 0.0)):
                q = x[f"ref_{side}_logps"]
                n = x[f"{side}_lengths"]
                grp.append({"logp": float(x[f"policy_{side}_logps"][i]), "rank": rank,
                            "ref": float(q[i]) if q is not None else math.nan,
                            "length": float(n[i]) if n is not None else math.nan})
            groups.append(grp)
        return torch.tensor(f(groups, p), dtype=torch.float64)

    return ref
