"""Which batch shape a run trains on: the loss's declared shapes (``LossSpec.shapes``) against the data's shape.

The trainer never reads a loss's name: a loss declares the shapes it takes, the data has one shape (pairs, lists or
unpaired examples, from its columns), and :func:`plan_shape` decides, before any model loads, how the data reaches
the loss:

- the loss takes the data's shape: as it is;
- pairs for a list loss: as pairs (the loss sees K = 2 groups, :func:`prefzoo.group_from_pairs`);
- lists for a pairwise loss: the pairs of ``--pairs-from-lists best-worst | all-pairs | best-vs-rest``;
- pairs for an unpaired loss: with ``--unpair``, a desirable chosen and an undesirable rejected example per pair;
- anything else: a one-line error naming the loss, the data's shape and the flag that fixes it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from prefzoo.data.shapes import LISTS, PAIRS, PAIRS_FROM_LISTS, PROMPTS, UNPAIRED, lists_to_pairs, unpair
from prefzoo.train.config import ConfigError
from prefzoo.types import Need, Shape

__all__ = ["ShapeError", "ShapePlan", "convert", "online_plan", "plan_shape"]

_SHAPE = {PAIRS: Shape.PAIR, LISTS: Shape.LIST, UNPAIRED: Shape.UNPAIRED}
_WORDS = {Shape.PAIR: "pairs", Shape.LIST: "lists", Shape.UNPAIRED: "unpaired examples"}
_COLUMNS = {
    Shape.PAIR: "prompt, chosen, rejected",
    Shape.LIST: "prompt, completions, scores",
    Shape.UNPAIRED: "prompt, completion, label",
}


class ShapeError(ConfigError):
    """The loss does not take the data's shape and no option converts it (the message names the flag that would)."""


@dataclass(frozen=True)
class ShapePlan:
    """How a run's data reaches its loss."""

    data: str  # the shape of the data as loaded: pairs | lists | unpaired
    batches: str  # the shape the loader collates: pairs | lists | unpaired
    pairs_from_lists: str | None = None  # the reduction of lists to pairs, or None
    unpair: bool = False  # pairs split into unpaired examples
    kl: bool = False  # the loss needs KTO's mismatched KL pairs (Need.KL_REFERENCE)

    def describe(self) -> str:
        how = ""
        if self.pairs_from_lists:
            how = f" (--pairs-from-lists {self.pairs_from_lists})"
        elif self.unpair:
            how = " (--unpair: chosen desirable, rejected undesirable)"
        elif self.data != self.batches:
            how = " (K = 2)"
        kl = "; KL pairs: completions rotated by one within each batch (TRL's KTO)" if self.kl else ""
        return f"data shape {self.data}, trained as {self.batches}{how}{kl}"


def _others(shape: Shape) -> str:
    """The registered losses that take ``shape`` (read from their declarations), for the error's hint."""
    from prefzoo.registry import list_losses, loss_spec

    names = [n for n in list_losses() if shape in getattr(loss_spec(n), "shapes", ())]
    return ", ".join(names[:6]) or "none registered"


def plan_shape(loss: Any, data: str, pairs_from_lists: str | None = None, unpair: bool = False) -> ShapePlan:
    """The :class:`ShapePlan` for ``loss`` on data of shape ``data``, or a :class:`ShapeError` (before any model)."""
    if data == PROMPTS:
        raise ShapeError(
            "the data holds prompts only (no chosen/rejected, completions or completion column): add --online to "
            "sample completions from the policy and judge them (--samples-per-prompt, --judge), or give "
            "preference data"
        )
    spec = loss.spec
    shapes = frozenset(spec.shapes)
    have = _SHAPE[data]
    kl = Need.KL_REFERENCE in loss.needs
    name = spec.name
    if pairs_from_lists is not None and pairs_from_lists not in PAIRS_FROM_LISTS:
        raise ShapeError(f"--pairs-from-lists {pairs_from_lists!r}: choose one of {', '.join(PAIRS_FROM_LISTS)}")
    takes = " or ".join(_WORDS[s] for s in sorted(shapes, key=lambda s: s.value))
    if pairs_from_lists is not None and not (have is Shape.LIST and not spec.accepts(Shape.LIST)):
        raise ShapeError(
            f"--pairs-from-lists {pairs_from_lists}: it turns lists into pairs for a pairwise loss, but loss {name!r} "
            f"takes {takes} and the data holds {_WORDS[have]}; drop --pairs-from-lists"
        )
    if unpair and not (have is Shape.PAIR and Shape.UNPAIRED in shapes and not spec.accepts(Shape.PAIR)):
        raise ShapeError(
            f"--unpair: it splits pairs into unpaired examples for an unpaired loss, but loss {name!r} takes {takes} "
            f"and the data holds {_WORDS[have]}; drop --unpair"
        )
    if spec.accepts(have):
        return ShapePlan(data, data, kl=kl and have is Shape.UNPAIRED)
    if have is Shape.LIST and Shape.PAIR in shapes:
        if pairs_from_lists is None:
            raise ShapeError(
                f"loss {name!r} takes pairs but the data holds lists ({_COLUMNS[Shape.LIST]}); choose how lists become "
                f"pairs with --pairs-from-lists {' | '.join(PAIRS_FROM_LISTS)} (pairs_from_lists in YAML), or a list "
                f"loss ({_others(Shape.LIST)})"
            )
        return ShapePlan(data, PAIRS, pairs_from_lists=pairs_from_lists)
    if have is Shape.PAIR and Shape.UNPAIRED in shapes:
        if not unpair:
            raise ShapeError(
                f"loss {name!r} takes unpaired examples ({_COLUMNS[Shape.UNPAIRED]}) but the data holds pairs; add "
                "--unpair (unpair: true in YAML) to train on each pair's chosen as desirable and rejected as "
                "undesirable (TRL's unpair_preference_dataset)"
            )
        return ShapePlan(data, UNPAIRED, unpair=True, kl=kl)
    if have is Shape.UNPAIRED:
        raise ShapeError(
            f"loss {name!r} takes {takes} but the data holds unpaired examples ({_COLUMNS[Shape.UNPAIRED]}); no flag "
            f"makes pairs or lists of them: choose an unpaired loss ({_others(Shape.UNPAIRED)}) or pair data"
        )
    raise ShapeError(
        f"loss {name!r} takes {takes} but the data holds {_WORDS[have]} ({_COLUMNS[have]}); no flag converts them: "
        f"give {takes} ({'; '.join(_COLUMNS[s] for s in sorted(shapes, key=lambda s: s.value))})"
    )


def online_plan(loss: Any, pairs_from_lists: str | None = None, unpair: bool = False) -> ShapePlan:
    """How generated lists (n scored samples per prompt) reach ``loss`` in an on-policy run: a list loss takes them
    as they are, a pairwise loss through ``--pairs-from-lists``, an unpaired loss as examples labelled by score."""
    spec = loss.spec
    if unpair:
        raise ShapeError("--unpair splits pairs; with --online an unpaired loss labels the samples by score: drop it")
    if not spec.accepts(Shape.LIST) and not spec.accepts(Shape.PAIR) and Shape.UNPAIRED in spec.shapes:
        if pairs_from_lists is not None:
            raise ShapeError(f"--pairs-from-lists: loss {spec.name!r} takes unpaired examples; drop it")
        return ShapePlan(LISTS, UNPAIRED, kl=Need.KL_REFERENCE in loss.needs)
    return plan_shape(loss, LISTS, pairs_from_lists, False)


def convert(ds: Any, plan: ShapePlan) -> tuple[Any, int]:
    """``ds`` (normalized, of shape ``plan.data``) in the shape the loader collates; second item: lists dropped
    because all their completions tie (``--pairs-from-lists`` only)."""
    if plan.pairs_from_lists:
        return lists_to_pairs(ds, plan.pairs_from_lists)
    if plan.unpair:
        return unpair(ds), 0
    return ds, 0
