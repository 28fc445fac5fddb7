"""Weighted sums of registered losses, e.g. MPO = 0.8·dpo + 0.2·bco-pair + 1.0·sft (Wang et al. 2024)."""

from __future__ import annotations

import dataclasses
import functools
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from torch import Tensor

from prefzoo.hookspecs import hookimpl
from prefzoo.losses._common import NLL_REDUCTIONS
from prefzoo.spec import Loss, LossParamError, LossParams, LossSpec, param
from prefzoo.types import LossContext, LossOutput, LossState, PreferenceBatch, Shape, group_from_pairs

__all__ = ["CombinedLoss", "combine", "combine_from_string", "is_combination", "parse_params", "parse_terms"]

SpecLookup = Callable[[str], LossSpec]  # a loss name -> its spec (the registry's loss_spec)

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
        shapes = frozenset.intersection(*(loss.spec.shapes for _, loss in self.terms))
        if not shapes and all(loss.spec.accepts(Shape.PAIR) for _, loss in self.terms):
            shapes = frozenset({Shape.PAIR})  # list terms run on pairs as K = 2 groups
        if not shapes:
            raise LossParamError(f"cannot combine {name}: its terms take no batch shape in common")
        spec = LossSpec(
            name=name,
            fn=self._fn,
            params_cls=CombinationParams,
            family="combination",
            formula=" + ".join(f"{w:g}·[{loss.spec.formula}]" for w, loss in self.terms),
            formula_tex=r" + ".join(rf"{w:g}\cdot\left[{loss.spec.formula_tex}\right]" for w, loss in self.terms)
            if all(loss.spec.formula_tex for _, loss in self.terms) else "",
            paper="; ".join(dict.fromkeys(loss.spec.paper for _, loss in self.terms)),
            scores=f"those of {self.terms[0][1].name}: {self.terms[0][1].spec.scores}",
            needs=needs,
            batch_coupled=any(loss.batch_coupled for _, loss in self.terms),
            monotone=all(w >= 0 and loss.spec.is_monotone(loss.params) for w, loss in self.terms),
            shift_invariant=all(loss.spec.shift_invariant for _, loss in self.terms),
            shapes=shapes,
            initial_state=self._initial_state if any(loss.spec.stateful for _, loss in self.terms) else None,
            description="Weighted combination of registered losses.",
            plugin="prefzoo.losses.combine",
            builtin=all(loss.spec.builtin for _, loss in self.terms),
        )
        super().__init__(spec, CombinationParams())

    def __repr__(self) -> str:
        return f"CombinedLoss({[(w, loss) for w, loss in self.terms]!r})"

    def _initial_state(self, params: Any) -> LossState:
        """Each stateful term's state under ``"<term index>.<key>"``."""
        return {f"{i}.{k}": v for i, (_, loss) in enumerate(self.terms) for k, v in loss.state_dict().items()}

    def _fn(self, batch: Any, params: Any, ctx: LossContext) -> LossOutput:
        total: Tensor | None = None
        first: LossOutput | None = None
        metrics: dict[str, Tensor] = {}
        state: LossState = {}
        for i, (w, loss) in enumerate(self.terms):
            native = batch if not isinstance(batch, PreferenceBatch) or Shape.PAIR in loss.spec.shapes else None
            own = None if ctx.state is None or not loss.spec.stateful else {
                k.partition(".")[2]: v for k, v in ctx.state.items() if k.partition(".")[0] == str(i)}
            term_ctx = dataclasses.replace(ctx, state=own)
            out = loss.spec.fn(native if native is not None else group_from_pairs(batch), loss.params, term_ctx)
            state.update({f"{i}.{k}": v for k, v in (out.state or {}).items()})
            total = w * out.losses if total is None else total + w * out.losses
            first = first or out
            metrics[f"{loss.name}/loss"] = out.losses.detach().mean()
            metrics.update({k if "/" in k else f"{loss.name}/{k}": v for k, v in out.metrics.items()})
        assert total is not None and first is not None
        return LossOutput(total, first.chosen_rewards, first.rejected_rewards, metrics, rewards=first.rewards,
                          state=state if ctx.state is not None else None)


def is_combination(name: str) -> bool:
    """Whether ``name`` is a weighted sum (``"0.8*dpo + 0.2*sft"``) rather than one registered name."""
    return "+" in name or "*" in name


def _route(terms: Sequence[tuple[float, str]], params: Mapping[str, Any], lookup: SpecLookup) -> list[dict[str, Any]]:
    """Each term's own params: ``name.key`` goes to that term, a bare ``key`` to every term that has it."""
    per_term: list[dict[str, Any]] = []
    used: set[str] = set()
    for _, name in terms:
        fields = set(lookup(name).params_cls.__dataclass_fields__)
        mine: dict[str, Any] = {}
        for key, value in params.items():
            target, _, pname = key.rpartition(".")
            if (target == name or not target) and pname in fields:
                mine[pname] = value
                used.add(key)
        per_term.append(mine)
    unused = sorted(set(params) - used)
    if unused:
        raise LossParamError(f"no term of the combination has the parameter(s) {', '.join(unused)}")
    return per_term


def combine(terms: Sequence[tuple[float, str | Loss]], lookup: SpecLookup, **params: Any) -> CombinedLoss:
    """Combine losses by name (looked up with ``lookup``) or bound Loss objects, with weights.

    ``params`` holds ``name.key=value`` for one term or a bare ``key=value`` for
    every term that has that parameter; a key no term has is an error.
    ``prefzoo.combine`` is this with the registry's ``loss_spec`` as ``lookup``.
    """
    named = [(w, item) for w, item in terms if not isinstance(item, Loss)]
    routed = iter(_route(named, params, lookup))
    bound: list[tuple[float, Loss]] = []
    for w, item in terms:
        if isinstance(item, Loss):
            bound.append((float(w), item))
        else:
            spec = lookup(item)
            bound.append((float(w), Loss(spec, spec.params(**next(routed)))))
    return CombinedLoss(bound)


def combine_from_string(text: str, params: Mapping[str, Any], lookup: SpecLookup) -> CombinedLoss:
    """``combine`` of the terms written in ``text``."""
    return combine(parse_terms(text), lookup, **params)


def parse_params(text: str, values: Mapping[str, Any], lookup: SpecLookup) -> dict[str, Any]:
    """Typed params of the combination ``text`` from ``KEY=VALUE`` texts (``dpo.beta`` or a bare ``beta``).

    Each text is converted to the type of the first term that has the parameter.
    """
    terms = parse_terms(text)
    out: dict[str, Any] = {}
    for key, value in values.items():
        target, _, pname = key.rpartition(".")
        specs = [lookup(t) for _, t in terms if not target or t == target]
        holders = [s for s in specs if pname in s.params_cls.__dataclass_fields__]
        if not holders:
            raise LossParamError(f"no term of {text!r} has a parameter {pname!r}")
        out[key] = holders[0].parse_param(pname, value)
    return out


@dataclass(frozen=True, kw_only=True)
class MPOParams(LossParams):
    beta: float = param(0.1, r"$\beta$ of the dpo and bco-pair terms", gt=0.0)
    dpo_weight: float = param(0.8, "weight of the dpo (sigmoid) term", ge=0.0)
    bco_weight: float = param(0.2, "weight of the bco-pair term", ge=0.0)
    sft_weight: float = param(1.0, "weight of the sft term", ge=0.0)


@dataclass(frozen=True, kw_only=True)
class RPOParams(LossParams):
    beta: float = param(0.1, r"$\beta$ of the dpo term", gt=0.0)
    alpha: float = param(1.0, r"$\alpha$ (TRL's sft loss weight, formerly rpo_alpha): weight of the NLL on "
        r"$y_w$", ge=0.0)
    nll_reduction: str = param(
        "batch-tokens",
        "NLL over all chosen tokens of the batch ('batch-tokens', TRL's) or averaged per example ('example')",
        choices=NLL_REDUCTIONS,
    )


@functools.cache
def _dpo_family() -> dict[str, LossSpec]:
    """The built-in dpo, bco-pair and sft specs, straight from their module (pure code: nothing to invalidate)."""
    from prefzoo.losses import dpo

    return {s.name: s for s in dpo.prefzoo_register_losses()}


def _mpo_terms(p: MPOParams) -> CombinedLoss:
    specs = _dpo_family()
    terms: tuple[tuple[float, str, dict[str, float]], ...] = (
        (p.dpo_weight, "dpo", {"beta": p.beta}),
        (p.bco_weight, "bco-pair", {"beta": p.beta}),
        (p.sft_weight, "sft", {}),
    )
    return CombinedLoss([(w, Loss(specs[n], specs[n].params(**kw))) for w, n, kw in terms])


def mpo_loss(batch: PreferenceBatch, p: MPOParams, ctx: LossContext) -> LossOutput:
    """MPO's preference mix (Wang et al. 2024, arXiv:2411.10442): 0.8·dpo + 0.2·bco-pair + 1.0·sft."""
    combo = _mpo_terms(p)  # a few dataclasses per step: no cache to outlive reset_registry()
    return combo._fn(batch, combo.params, ctx)


def _rpo_terms(p: RPOParams) -> CombinedLoss:
    specs = _dpo_family()
    dpo, sft = specs["dpo"], specs["sft"]
    return CombinedLoss(
        [(1.0, Loss(dpo, dpo.params(beta=p.beta))), (p.alpha, Loss(sft, sft.params(nll_reduction=p.nll_reduction)))]
    )


def rpo_loss(batch: PreferenceBatch, p: RPOParams, ctx: LossContext) -> LossOutput:
    """RPO (Pang et al. 2024, arXiv:2404.19733, Eq. 2): DPO plus α·NLL of the chosen response, as TRL builds it from
    loss_type=['sigmoid', 'sft'] with loss_weights=[1, α] (NLL over all chosen tokens of the batch by default)."""
    combo = _rpo_terms(p)
    return combo._fn(batch, combo.params, ctx)


@hookimpl
def prefzoo_register_losses() -> list[LossSpec]:
    from prefzoo.losses._common import nll_coupled
    from prefzoo.types import Need

    return [
        LossSpec(
            name="mpo",
            fn=mpo_loss,
            params_cls=MPOParams,
            family="combination",
            formula_tex=r"0.8\,\bigl[-\log\sigma(\beta\Delta)\bigr] + 0.2\,\bigl[-\log\sigma(\beta\rho_w) - "
                        r"\log\sigma(-\beta\rho_l)\bigr] + 1.0\,\left[-\frac{\log\pi(y_w\mid x)}{\lvert "
                        r"y_w\rvert}\right]",
            paper="Wang et al. 2024, arXiv:2411.10442 (MPO), as TRL's loss_type=['sigmoid','bco_pair','sft']",
            scores=r"$\beta\cdot(\log\pi_\theta(y\mid x) - \log\pi_{\mathrm{ref}}(y\mid x))$ (DPO implicit reward)",
            needs=frozenset({Need.REFERENCE, Need.LENGTHS}),
            description="Mixed Preference Optimization: a fixed weighted sum of dpo, bco-pair and sft "
            "(any weights via '--loss \"0.8*dpo + 0.2*bco-pair + 1.0*sft\"').",
        ),
        LossSpec(
            name="rpo",
            fn=rpo_loss,
            params_cls=RPOParams,
            family="combination",
            formula_tex=r"-\log\sigma(\beta\Delta) - \alpha\cdot\frac{\log\pi(y_w\mid x)}{\lvert "
                        r"y_w\rvert}\quad\text{(the NLL over all chosen tokens of the batch by default)}",
            paper="Pang et al. 2024, arXiv:2404.19733 (Iterative RPO), as TRL's loss_type=['sigmoid','sft'] with "
            "loss_weights=[1, α]",
            scores=r"$\beta\cdot(\log\pi_\theta(y\mid x) - \log\pi_{\mathrm{ref}}(y\mid x))$ (DPO implicit reward)",
            needs=frozenset({Need.REFERENCE, Need.LENGTHS}),
            batch_coupled=nll_coupled,
            description=r"The loss of Iterative Reasoning Preference Optimization (RPO): DPO plus $\alpha\cdot$NLL on "
            "the chosen response; at the default alpha the same as `--loss \"dpo + 1.0*sft\"` with "
            "sft.nll_reduction=batch-tokens.",
            notes="nll_reduction defaults to 'batch-tokens' here, unlike sft, cpo and orpo: rpo exists to match TRL's "
            "RPO preset, whose NLL is the mean over all chosen tokens of the batch. 'example' gives each example's "
            "own token mean.",
        ),
    ]
