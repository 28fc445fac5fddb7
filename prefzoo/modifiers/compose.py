"""A loss with modifiers is itself a Loss: ``ModifiedLoss(dpo, [ld-dpo(α=0.5), wpo])``.

The modified loss's params class is the loss's own, extended with one field per modifier parameter (``ld_dpo_alpha``),
so validation, the docs, the Hypothesis strategies and the conformance kit treat loss and modifiers as one loss.
Modifiers apply in the order given: the first sees the batch first and the loss's output last.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from prefzoo.spec import (
    Loss,
    LossParamError,
    LossParams,
    LossSpec,
    ModifierError,
    ModifierSpec,
    param_infos,
    parse_assignments,
)
from prefzoo.types import LossContext, LossOutput, Need, PreferenceBatch, Shape

__all__ = ["ModifiedLoss", "Modifier", "modified_spec", "parse_modifier"]

ModifierLookup = Callable[[str], ModifierSpec]


@dataclass(frozen=True)
class Modifier:
    """A modifier bound to validated params."""

    spec: ModifierSpec
    params: LossParams

    @property
    def name(self) -> str:
        return self.spec.name

    def __str__(self) -> str:
        changed = {i.name: getattr(self.params, i.name) for i in param_infos(type(self.params))
                   if getattr(self.params, i.name) != i.default}  # fmt: skip
        return self.name + (":" + ",".join(f"{k}={v}" for k, v in changed.items()) if changed else "")


def parse_modifier(item: str | Mapping[str, Any] | tuple[str, Mapping[str, Any]] | Modifier,
                   lookup: ModifierLookup, flag: str = "--modifier") -> Modifier:  # fmt: skip
    """``"ld-dpo:alpha=0.5"``, ``{"modifier": "ld-dpo", "alpha": 0.5}`` (YAML), ``("ld-dpo", {"alpha": 0.5})``."""
    if isinstance(item, Modifier):
        return item
    if isinstance(item, str):
        name, _, rest = item.partition(":")
        values: dict[str, Any] = parse_assignments(filter(None, rest.split(",")), flag, "ld-dpo:alpha=0.5")
    elif isinstance(item, tuple):
        name, values = item[0], dict(item[1])
    elif isinstance(item, Mapping):
        values = dict(item)
        name = values.pop("modifier", None)
        if not isinstance(name, str):
            raise ModifierError(
                f"modifiers: {item!r} needs a 'modifier: NAME' key, e.g. {{modifier: ld-dpo, alpha: 0.5}}"
            )
    else:
        raise ModifierError(f"{flag} {item!r}: expected NAME[:KEY=VALUE,...]")
    spec = lookup(name.strip())
    return Modifier(spec, spec.params(**{k: spec.parse_param(k, v) for k, v in values.items()}))


def _prefix(mod: ModifierSpec) -> str:
    return mod.name.replace("-", "_") + "_"


def modified_params_cls(base: type[LossParams], mods: Sequence[ModifierSpec], check: Callable[[Any], None]) -> type:
    """The loss's params class plus one field per modifier parameter (``<modifier>_<param>``), checked by ``check``."""
    fields = []
    for mod in mods:
        hints = {i.name: i for i in param_infos(mod.params_cls)}
        for f in dataclasses.fields(mod.params_cls):
            fields.append((_prefix(mod) + f.name, hints[f.name].type,
                           dataclasses.field(default=f.default, metadata=f.metadata)))  # fmt: skip
    name = base.__name__ + "With" + "".join(m.name.title().replace("-", "") for m in mods)
    def both(self: Any) -> None:
        base.check(self)
        check(self)

    cls = dataclasses.make_dataclass(name, fields, bases=(base,), frozen=True, kw_only=True,
                                     namespace={"check": both})  # fmt: skip
    cls.__module__ = __name__
    return cls


def _splitter(base: LossSpec, mods: Sequence[ModifierSpec]) -> Callable[[Any], tuple[Any, list[LossParams]]]:
    """The function that splits a modified loss's params into the loss's own params and each modifier's."""
    base_fields = [i.name for i in param_infos(base.params_cls)]

    def split(params: Any) -> tuple[Any, list[LossParams]]:
        lp = base.params_cls(**{f: getattr(params, f) for f in base_fields})
        mps = [m.params_cls(**{i.name: getattr(params, _prefix(m) + i.name) for i in param_infos(m.params_cls)})
               for m in mods]  # fmt: skip
        return lp, mps

    return split


def _composed_fn(
    base: LossSpec,
    mods: Sequence[ModifierSpec],
    split: Callable[[Any], tuple[Any, list[LossParams]]],
    stateful: bool,
) -> Callable[[PreferenceBatch, Any, LossContext], LossOutput]:
    """The modified loss: the first modifier wraps the next ... wraps ``base``, each with its own slice of the state."""

    def fn(batch: PreferenceBatch, params: Any, ctx: LossContext) -> LossOutput:
        lp, mps = split(params)
        state = dict(ctx.state or {})
        new: dict[str, Any] = {}  # the next state, collected from each stateful piece under its own keys

        def call(i: int, b: PreferenceBatch, p: Any) -> LossOutput:
            if i == len(mods):
                own = {k: v for k, v in state.items() if not _is_modifier_key(k, mods)}
                out = base.fn(b, p, dataclasses.replace(ctx, state=own if base.initial_state else None))
                new.update(out.state or {})
                return out
            m = mods[i]
            sub = {k[len(_state_prefix(m)):]: v for k, v in state.items() if k.startswith(_state_prefix(m))}
            out = m.fn(lambda b2, p2: call(i + 1, b2, p2), b, mps[i], base, p,
                       dataclasses.replace(ctx, state=sub if m.initial_state else None))  # fmt: skip
            if m.initial_state is not None:
                new.update({_state_prefix(m) + k: v for k, v in (out.state or {}).items()})
            return out

        out = call(0, batch, lp)
        return dataclasses.replace(out, state=new if stateful else None)

    return fn


def modified_spec(base: LossSpec, mods: Sequence[ModifierSpec]) -> LossSpec:
    """The LossSpec of ``base`` under ``mods`` (its params drawn like any loss's: loss fields and modifier fields)."""
    names = [m.name for m in mods]
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:
        raise ModifierError(f"modifier {twice[0]!r} is given twice; give each modifier once")
    split = _splitter(base, mods)

    def check(params: Any) -> None:
        try:
            lp, _ = split(params)
        except LossParamError as e:
            raise ModifierError(str(e)) from None
        for m in mods:
            why = m.why_not(base, lp)
            if why is not None:
                raise ModifierError(why)

    stateful = base.initial_state is not None or any(m.initial_state is not None for m in mods)

    needs = set(base.needs)
    for m in mods:
        needs |= m.needs | (m.reference_needs if Need.REFERENCE in base.needs else set())
    preserve_mono = all(m.preserves_monotone for m in mods)

    def monotone(params: Any) -> bool:
        return preserve_mono and base.is_monotone(split(params)[0])

    def equivariant(params: Any) -> bool:
        lp, mps = split(params)
        return base.is_permutation_equivariant(lp) and all(
            bool(m.permutation_equivariant(mp)) if callable(m.permutation_equivariant) else m.permutation_equivariant
            for m, mp in zip(mods, mps, strict=True)
        )

    return LossSpec(
        name=f"{base.name}[{','.join(names)}]",
        fn=_composed_fn(base, mods, split, stateful),
        params_cls=modified_params_cls(base.params_cls, mods, check),
        family=base.family,
        formula=base.formula + "".join(f"; {m.name}: {m.transforms}" for m in mods),
        paper="; ".join([base.paper, *(m.paper for m in mods)]),
        scores=base.scores + " (as the modified loss sees its inputs)",
        needs=frozenset(needs),
        shapes=frozenset({Shape.PAIR}),
        initial_state=_split_state(base, mods, split) if stateful else None,
        batch_coupled=base.batch_coupled or any(m.batch_coupled for m in mods),
        monotone=monotone if base.monotone is not False else False,
        shift_invariant=base.shift_invariant and all(m.preserves_shift_invariance for m in mods),
        permutation_equivariant=equivariant,
        description=f"{base.name} modified by {', '.join(names)}.",
        plugin=base.plugin,
        builtin=base.builtin and all(m.builtin for m in mods),
    )


def _state_prefix(mod: ModifierSpec) -> str:
    return mod.name + "."


def _is_modifier_key(key: str, mods: Sequence[ModifierSpec]) -> bool:
    return any(m.initial_state is not None and key.startswith(_state_prefix(m)) for m in mods)


def _split_state(base: LossSpec, mods: Sequence[ModifierSpec],
                 split: Callable[[Any], tuple[Any, list[Any]]]) -> Callable[[Any], Any]:  # fmt: skip
    """The state of a modified loss: the loss's own keys, and each stateful modifier's as ``<modifier>.<key>``."""

    def init(params: Any) -> dict[str, Any]:
        lp, mps = split(params)
        state = dict(base.initial_state(lp)) if base.initial_state is not None else {}
        for m, mp in zip(mods, mps, strict=True):
            if m.initial_state is not None:
                state.update({_state_prefix(m) + k: v for k, v in m.initial_state(mp).items()})
        return state

    return init


class ModifiedLoss(Loss):
    """A loss under modifiers: one Loss object for the trainer, metrics, ``prefzoo inspect`` and the conformance kit."""

    base: Loss
    modifiers: list[Modifier]

    def __init__(self, base: Loss, modifiers: Sequence[Modifier]) -> None:
        if isinstance(base, ModifiedLoss):  # modifying a modified loss adds to its list
            modifiers = [*base.modifiers, *modifiers]
            base = base.base
        if not modifiers:
            raise ModifierError("ModifiedLoss needs at least one modifier")
        if type(base) is not Loss:
            raise ModifierError(
                f"modifiers apply to one registered loss, not to {base.name!r}: modify each term of a combination"
            )
        self.base, self.modifiers = base, list(modifiers)
        for m in self.modifiers:  # the one-line error before any value is built
            why = m.spec.why_not(base.spec, base.params)
            if why is not None:
                raise ModifierError(why)
        spec = modified_spec(base.spec, [m.spec for m in self.modifiers])
        values = {i.name: getattr(base.params, i.name) for i in param_infos(type(base.params))}
        for m in self.modifiers:
            values.update({_prefix(m.spec) + i.name: getattr(m.params, i.name) for i in param_infos(type(m.params))})
        super().__init__(spec, spec.params(**values))

    def __repr__(self) -> str:
        return f"ModifiedLoss({self.base!r}, [{', '.join(str(m) for m in self.modifiers)}])"
