"""Which exact fast paths a run uses: ``--share-prompt``, ``--packing`` and ``--group-by-length`` as auto | on | off.

``auto`` (the default) decides per run from the training pairs' token lengths (:func:`length_stats`), with one log
line saying what was chosen and why (:func:`choose_fast_paths`, a pure function):

- prompt sharing when the prompt is at least ``SHARE_MIN_SAVING`` of the plain layout's tokens (it is processed
  once instead of twice; measured 1.09× on UltraFeedback-shaped pairs, 1.35× on Orca-shaped ones, and slower when
  the prompt is short next to long completions of uneven length, where the one-row layout pads more);
- packing when random batches of this size would be at least ``PACK_MIN_PADDING`` padding (measured on CPU: 0.93×
  at 20% padding, 1.19–1.26× at 30–36%: the mask and the scatter back cost about what a few padded positions do),
  or ``PACK_SPLIT_MIN_PADDING`` where the model's attention takes the split (SDPA without windows or soft-caps:
  one padding-free row whose attention needs no mask, :mod:`prefzoo.model.fast.split`; measured 1.03–1.07× on
  the goals benchmark's batches at 5–17% padding, 1.14× on 2,000-token plain rows at 11%);
- length grouping only when packing is off and padding is as high, and never for a batch-coupled loss (grouping
  changes which pairs normalise together; packing removes the padding without changing any batch).

Prompt sharing and packing are exact (tested equal to the plain path); grouping changes only the seeded order.
``on``/``off`` force either way; ``True``/``False`` (YAML booleans, ``--share-prompt``/``--no-share-prompt``) mean
on/off.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

__all__ = [
    "AUTO",
    "SWITCHES",
    "FastPaths",
    "LengthStats",
    "choose_fast_paths",
    "length_stats",
    "padding_fraction",
    "switch_value",
]

AUTO, ON, OFF = "auto", "on", "off"
SWITCHES = ("share_prompt", "packing", "group_by_length")  # TrainConfig fields that take auto | on | off
SHARE_MIN_SAVING = 0.15  # prompt share of the plain layout's tokens from which sharing pays
PACK_MIN_PADDING = 0.25  # padding share of random batches from which packing (or grouping) pays
PACK_SPLIT_MIN_PADDING = 0.02  # the same for one padding-free row with the split attention (no mask)
_TRUE, _FALSE = ("on", "true", "yes", "1"), ("off", "false", "no", "0")


def switch_value(name: str, value: object) -> str:
    """``value`` of switch ``name`` as 'auto' | 'on' | 'off'; anything else is a one-line ValueError."""
    if isinstance(value, bool):
        return ON if value else OFF
    text = str(value).strip().lower()
    if text == AUTO:
        return AUTO
    if text in _TRUE:
        return ON
    if text in _FALSE:
        return OFF
    raise ValueError(f"{name}={value!r}: choose auto, on or off (true/false also work)")


def padding_fraction(row_lengths: Sequence[Sequence[int]]) -> float:
    """Share of padded positions in batches given as lists of row lengths (each batch padded to its longest row)."""
    total = sum(max(rows) * len(rows) for rows in row_lengths if rows)
    return 0.0 if total == 0 else 1.0 - sum(sum(rows) for rows in row_lengths) / total


@dataclass(frozen=True)
class LengthStats:
    """Token-length statistics of a run's training pairs at its micro-batch size."""

    pairs: int
    prompt_saving: float  # Σ|x| / Σ(2|x| + |y_w| + |y_l|): the plain layout's tokens sharing saves
    padding_plain: float  # padding share of random micro-batches in the plain (2B, T) layout
    padding_shared: float  # the same in the shared (B, T) layout


def length_stats(triples: Sequence[tuple[int, int, int]], batch_size: int, seed: int = 0) -> LengthStats:
    """Statistics of (|x|, |y_w|, |y_l|) per pair; padding from one seeded shuffle cut into micro-batches."""
    plain_tokens = sum(2 * x + w + r for x, w, r in triples)
    saving = sum(x for x, _, _ in triples) / plain_tokens if plain_tokens else 0.0
    order = random.Random(seed).sample(range(len(triples)), len(triples))
    batches = [[triples[i] for i in order[k : k + batch_size]] for k in range(0, len(order), batch_size)]
    plain = padding_fraction([[x + w for x, w, _ in b] + [x + r for x, _, r in b] for b in batches])
    shared = padding_fraction([[x + w + r for x, w, r in b] for b in batches])
    return LengthStats(len(triples), saving, plain, shared)


@dataclass(frozen=True)
class FastPaths:
    """The fast paths a run uses, and why (one reason per switch)."""

    share_prompt: bool
    packing: bool
    group_by_length: bool
    reasons: tuple[str, str, str]

    def line(self) -> str:
        names = ("share-prompt", "packing", "group-by-length")
        flags = (self.share_prompt, self.packing, self.group_by_length)
        parts = [f"{n} {'on' if f else 'off'} ({why})" for n, f, why in zip(names, flags, self.reasons, strict=True)]
        return "fast paths: " + "; ".join(parts)


def choose_fast_paths(
    stats: LengthStats | None,
    share_prompt: str = AUTO,
    packing: str = AUTO,
    group_by_length: str = AUTO,
    batch_coupled: bool = False,
    unavailable: str | None = None,
    refusal: str | None = None,
    share_refusal: str | None = None,
    split: bool = False,
) -> FastPaths:
    """The fast paths to use: forced switches as given, ``auto`` ones from ``stats`` (None: no pair statistics).

    ``split``: the model's attention takes the split (said on the prompt-sharing part of the line), so packing is
    one padding-free row without a mask and pays from ``PACK_SPLIT_MIN_PADDING`` instead of ``PACK_MIN_PADDING``.

    ``unavailable`` (a reason) turns every ``auto`` off: e.g. lists or unpaired batches, on-policy data, sharded
    engines the fast paths are not tested under.  ``refusal`` (the model's attention cannot take the custom mask)
    turns an ``auto`` prompt sharing or packing off, ``share_refusal`` prompt sharing only (a flash kernel packs
    by sequence boundaries but cannot express y_l ↛ y_w); forced on, the run stops with that reason later.
    """

    blocked = unavailable or ("no pair statistics" if stats is None else None)
    share, share_why = _choose_sharing(stats, share_prompt, blocked or refusal or share_refusal)
    if share and split:
        share_why += ", attention split in two causal parts"
    padding = None if stats is None else (stats.padding_shared if share else stats.padding_plain)
    pack, pack_why = _choose_packing(padding, packing, blocked or refusal, split)
    group, group_why = _choose_grouping(padding, group_by_length, blocked, pack, batch_coupled)
    return FastPaths(share, pack, group, (share_why, pack_why, group_why))


def _unmeasured(switch: str, blocked: str | None) -> tuple[bool, str]:
    """(on, why) of a switch forced on or off, else (off, why) of an ``auto`` choice that is blocked (the reason)
    or has nothing to measure."""
    return (switch == ON, "forced") if switch != AUTO else (False, f"auto: {blocked}")


def _choose_sharing(stats: LengthStats | None, switch: str, blocked: str | None) -> tuple[bool, str]:
    """(prompt sharing on, why): forced, blocked (the reason), or when the prompt is a large enough share."""
    if switch != AUTO or blocked or stats is None:
        return _unmeasured(switch, blocked)
    share = stats.prompt_saving >= SHARE_MIN_SAVING
    cmp = "≥" if share else "<"
    return share, f"auto: prompt is {stats.prompt_saving:.0%} of plain tokens, {cmp} {SHARE_MIN_SAVING:.0%}"


def _choose_packing(padding: float | None, switch: str, blocked: str | None, split: bool) -> tuple[bool, str]:
    """(packing on, why): forced, blocked, or when the batches would be padded enough to pay for the mask."""
    if switch != AUTO or blocked or padding is None:
        return _unmeasured(switch, blocked)
    least = PACK_SPLIT_MIN_PADDING if split else PACK_MIN_PADDING
    pack = padding >= least
    how = ": one row, split attention" if split and pack else ""
    return pack, f"auto: batches {padding:.0%} padding, {'≥' if pack else '<'} {least:.0%}{how}"


def _choose_grouping(
    padding: float | None, switch: str, blocked: str | None, pack: bool, batch_coupled: bool
) -> tuple[bool, str]:
    """(length grouping on, why): only when packing is off, the loss is not batch-coupled and padding is high."""
    if switch != AUTO or blocked or padding is None:
        return _unmeasured(switch, blocked)
    if pack:
        return False, "auto: packing removes the padding"
    if batch_coupled:
        return False, "auto: the loss normalises over its batch; grouping would change the batches"
    group = padding >= PACK_MIN_PADDING
    return group, f"auto: batches {padding:.0%} padding, {'≥' if group else '<'} {PACK_MIN_PADDING:.0%}"


def pair_triples(tokenized: Any) -> list[tuple[int, int, int]]:
    """(|x|, |y_w|, |y_l|) of every pair of a tokenized dataset (columns prompt_ids, chosen_ids, rejected_ids)."""
    cols = ["prompt_ids", "chosen_ids", "rejected_ids"]
    data = tokenized.select_columns(cols)
    lengths = data.map(  # in memory: a cheap pass, and no cache file of its own to be truncated or go stale
        lambda b: {f"n_{c}": [len(v) for v in b[c]] for c in cols}, batched=True, remove_columns=cols, desc="lengths",
        keep_in_memory=True, load_from_cache_file=False,
    )  # fmt: skip
    return list(zip(*(lengths[f"n_{c}"] for c in cols), strict=True))


def fast_paths_for_run(
    switches: dict[str, Any], batch_size: int, seed: int, batch_coupled: bool, pairs: Any | None,
    unavailable: str | None, causal: Any,
) -> FastPaths:
    """:func:`choose_fast_paths` for a run and its model: ``switches`` the run's auto|on|off value of each of
    :data:`SWITCHES`, ``batch_size`` and ``seed`` its per-device batch and seed (the length statistics' batches),
    ``pairs`` its tokenized training pairs (None: not pairs), ``causal`` the unwrapped CausalLM, whose architecture
    may refuse a fast path or take the split attention."""
    from prefzoo.model.arch import model_capabilities  # torch: not at config-validation time
    from prefzoo.model.fast.packing import packing_takes_split

    caps = model_capabilities(causal)  # declared by the architecture (prefzoo.model.arch)
    unavailable = unavailable or caps.fast_path_block()
    split = packing_takes_split(causal.get_decoder(), causal.config)  # packing without a mask: pays sooner
    stats = None
    if pairs is not None and unavailable is None and AUTO in (switches[k] for k in SWITCHES):
        stats = length_stats(pair_triples(pairs), batch_size, seed)
    return choose_fast_paths(
        stats, switches["share_prompt"], switches["packing"], switches["group_by_length"], batch_coupled, unavailable,
        caps.packing_refusal, caps.custom_mask_refusal, split,  # flash: packs, does not share
    )  # fmt: skip
