"""Weighted sums of registered losses, e.g. MPO = 0.8·dpo + 0.2·bco-pair + 1.0·sft (Wang et al. 2024)."""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from torch import Tensor

from prefzoo.hookspecs import hookimpl
from prefzoo.spec import Loss, LossParamError, LossParams, LossSpec, param
from prefzoo.types import LossContext, LossOutput, PreferenceBatch

__all__ = ["CombinedLoss", "combine", "combine_from_string", "parse_terms"]

_TERM = re.compile(r"^\s*(?:(?P<w>[-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?)\s*\*\s*)?(?P<name>[A-Za-z0-9_.\-]+)\s*$")


@dataclass(frozen=True, kw_only=True)
class CombinationParams(LossParams):
    pass


def parse_terms(text: str) -> list[tuple[float, str]]:
    """``"0.8*dpo + 0.2*bco-pair + sft"`` → [(0.8, 'dpo'), (0.2, 'bco-pair'), (1.0, 'sft')]."""
    terms = []
    for part in text.split("+"):
        m = _TERM.match(part)
        if not m:
            raise LossParamError(
                f"cannot read the loss combination {text!r} at {part.strip()!r}: write terms as WEIGHT*NAME joined "
                "by '+', e.g. '0.8*dpo + 0.2*bco-pair + 1.0*sft'"
            )
        terms.append((float(m["w"]) if m["w"] else 1.0, m["name"]))
    return terms


class CombinedLoss(Loss):
    """Σ_i w_i · L_i over bound losses; scores (rewards) come from the first term."""

    def __init__(self, terms: Sequence[tuple[float, Loss]]) -> None:
        if not terms:
            raise LossParamError("a loss combination needs at least one term")
        self.terms = list(terms)
        name = " + ".join(f"{w:g}*{loss.name}" for w, loss in self.terms)
        needs = frozenset().union(*(loss.needs for _, loss in self.terms))
        spec = LossSpec(
            name=name,
            fn=self._fn,
            params_cls=CombinationParams,
            family="combination",
            formula=" + ".join(f"{w:g}·[{loss.spec.formula}]" for w, loss in self.terms),
            paper="; ".join(dict.fromkeys(loss.spec.paper for _, loss in self.terms)),
            scores=f"those of {self.terms[0][1].name}: {self.terms[0][1].spec.scores}",
            needs=needs,
            batch_coupled=any(loss.batch_coupled for _, loss in self.terms),
            monotone=all(w >= 0 and loss.spec.is_monotone(loss.params) for w, loss in self.terms),
            shift_invariant=all(loss.spec.shift_invariant for _, loss in self.terms),
            description="Weighted combination of registered losses.",
            plugin="prefzoo.losses.combine",
        )
        super().__init__(spec, CombinationParams())

    def __repr__(self) -> str:
        return f"CombinedLoss({[(w, loss) for w, loss in self.terms]!r})"

    def _fn(self, batch: PreferenceBatch, params: Any, ctx: LossContext) -> LossOutput:
        total: Tensor | None = None
        first: LossOutput | None = None
        metrics: dict[str, Tensor] = {}
        for w, loss in self.terms:
            out = loss.spec.fn(batch, loss.params, ctx)
            total = w * out.losses if total is None else total + w * out.losses
            first = first or out
            metrics[f"{loss.name}/loss"] = out.losses.detach().mean()
            metrics.update({k if "/" in k else f"{loss.name}/{k}": v for k, v in out.metrics.items()})
        assert total is not None and first is not None
        return LossOutput(total, first.chosen_rewards, first.rejected_rewards, metrics)


def combine(terms: Sequence[tuple[float, str | Loss]], **params: Any) -> CombinedLoss:
    """Combine registered losses by name (or bound Loss objects) with weights.

    ``params`` holds ``name.key=value`` for one term or a bare ``key=value`` for
    every term that has that parameter; a key no term has is an error.
    """
    from prefzoo.registry import get_loss, loss_spec

    used: set[str] = set()
    bound: list[tuple[float, Loss]] = []
    for w, item in terms:
        if isinstance(item, Loss):
            bound.append((float(w), item))
            continue
        spec = loss_spec(item)
        fields = set(spec.params_cls.__dataclass_fields__)
        mine: dict[str, Any] = {}
        for key, value in params.items():
            target, _, pname = key.rpartition(".")
            if (target == item or not target) and pname in fields:
                mine[pname] = value
                used.add(key)
        bound.append((float(w), get_loss(item, **mine)))
    unused = sorted(set(params) - used)
    if unused:
        raise LossParamError(f"no term of the combination has the parameter(s) {', '.join(unused)}")
    return CombinedLoss(bound)


def combine_from_string(text: str, params: dict[str, Any]) -> CombinedLoss:
    return combine(parse_terms(text), **params)


@dataclass(frozen=True, kw_only=True)
class MPOParams(LossParams):
    beta: float = param(0.1, "β of the dpo and bco-pair terms", gt=0.0)
    dpo_weight: float = param(0.8, "weight of the dpo (sigmoid) term", ge=0.0)
    bco_weight: float = param(0.2, "weight of the bco-pair term", ge=0.0)
    sft_weight: float = param(1.0, "weight of the sft term", ge=0.0)


def _mpo_terms(p: MPOParams) -> CombinedLoss:
    from prefzoo.registry import get_loss

    return CombinedLoss(
        [
            (p.dpo_weight, get_loss("dpo", beta=p.beta)),
            (p.bco_weight, get_loss("bco-pair", beta=p.beta)),
            (p.sft_weight, get_loss("sft")),
        ]
    )


_mpo_cache: dict[MPOParams, CombinedLoss] = {}


def mpo_loss(batch: PreferenceBatch, p: MPOParams, ctx: LossContext) -> LossOutput:
    """MPO's preference mix (Wang et al. 2024, arXiv:2411.10442): 0.8·dpo + 0.2·bco-pair + 1.0·sft."""
    combo = _mpo_cache.get(p)
    if combo is None:
        combo = _mpo_cache[p] = _mpo_terms(p)
    return combo._fn(batch, combo.params, ctx)


@hookimpl
def prefzoo_register_losses() -> list[LossSpec]:
    from prefzoo.types import Need

    return [
        LossSpec(
            name="mpo",
            fn=mpo_loss,
            params_cls=MPOParams,
            family="combination",
            formula="0.8·[−log σ(βΔ)] + 0.2·[−log σ(βρ_w) − log σ(−βρ_l)] + 1.0·[−log π(y_w|x)/|y_w|]",
            paper="Wang et al. 2024, arXiv:2411.10442 (MPO), as TRL's loss_type=['sigmoid','bco_pair','sft']",
            scores="β·(log π_θ(y|x) − log π_ref(y|x)) (DPO implicit reward)",
            needs=frozenset({Need.REFERENCE, Need.LENGTHS}),
            description="Mixed Preference Optimization: a fixed weighted sum of dpo, bco-pair and sft "
            "(any weights via '--loss \"0.8*dpo + 0.2*bco-pair + 1.0*sft\"').",
        )
    ]
