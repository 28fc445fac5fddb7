"""The bundled synthetic task: noisy two-digit addition (skill A, exact oracle) and string reversal (skill B).

Everything here is pure Python and deterministic given a seed; no torch, no transformers.

Skill A -- addition.  Prompt ``"12+35="``, correct answer ``"47"``.  The oracle
grades an answer by its distance to the truth, ``|answer − (a + b)|``: the closer
answer wins, equal distance is a tie, and a malformed answer (not a plain
non-negative integer) loses to any well-formed one.  The warm-up data for skill A
comes from a deliberately *sloppy annotator*: the right answer only
:data:`NOISE_PROBS`\\[0] of the time, most often one too high, sometimes off by
one or two the other way.  So the warmed-up policy's most likely answer is often
wrong.  The preference pairs come from a different source: two *drafts* per
prompt with errors symmetric around the truth (:data:`DRAFT_OFFSETS`), ranked by
the oracle.  Symmetric drafts make "closer to the truth" the only signal in the
pairs: with the annotator's upward-biased drafts, "the smaller answer wins" would
be a shortcut (measured: DPO then learns to answer 10-12 too low).

Skill B -- reversal.  Prompt ``"rev abc="``, answer ``"cba"``.  Taught exactly in
the warm-up and absent from the preference data; its greedy exact-match accuracy
after preference training measures what the training destroyed (retention).
"""

from __future__ import annotations

import random
import re
from dataclasses import dataclass

__all__ = [
    "ADD_RANGE",
    "DRAFT_OFFSETS",
    "DRAFT_PROBS",
    "LETTERS",
    "NOISE_OFFSETS",
    "NOISE_PROBS",
    "REV_LENGTHS",
    "AdditionProblem",
    "Splits",
    "addition_prompt",
    "distance",
    "draft_answer",
    "judge",
    "make_lists",
    "make_pairs",
    "make_splits",
    "make_unpaired",
    "noisy_answer",
    "parse_addition_prompt",
    "parse_answer",
    "reversal_prompt",
    "sample_rev_strings",
]

ADD_RANGE = (10, 49)  # operands a, b ∈ [10, 49]: 40 × 40 = 1600 problems, sums 20..98 (two digits)
LETTERS = "abcdefgh"  # alphabet of the reversal skill
REV_LENGTHS = (3, 4, 5)  # lengths of the strings to reverse: 8^3 + 8^4 + 8^5 ≈ 37k strings
NOISE_OFFSETS = (0, +1, -1, +2)  # the sloppy annotator's error: answer = truth + offset
NOISE_PROBS = (0.30, 0.45, 0.15, 0.10)  # mode is +1: a greedy warmed-up policy tends to answer one too high
DRAFT_OFFSETS = (-3, -2, -1, 0, +1, +2, +3)  # errors of the drafts that preference pairs compare
DRAFT_PROBS = (0.05, 0.10, 0.20, 0.30, 0.20, 0.10, 0.05)  # symmetric: no direction is a shortcut

_PROMPT_RE = re.compile(r"^(\d+)\+(\d+)=$")
_ANSWER_RE = re.compile(r"^\d{1,4}$")


@dataclass(frozen=True)
class AdditionProblem:
    a: int
    b: int

    @property
    def prompt(self) -> str:
        return addition_prompt(self.a, self.b)

    @property
    def truth(self) -> int:
        return self.a + self.b


def addition_prompt(a: int, b: int) -> str:
    return f"{a}+{b}="


def reversal_prompt(s: str) -> str:
    return f"rev {s}="


def parse_addition_prompt(prompt: str) -> tuple[int, int]:
    """``"12+35="`` -> ``(12, 35)``; a ValueError naming the expected form otherwise."""
    m = _PROMPT_RE.match(prompt.strip())
    if not m:
        raise ValueError(f"prompt {prompt!r} is not an addition prompt of the form '12+35='")
    return int(m.group(1)), int(m.group(2))


def parse_answer(text: str) -> int | None:
    """The integer in a completion, or None when it is malformed (empty, non-digits, too long)."""
    t = text.strip()
    return int(t) if _ANSWER_RE.match(t) else None


def distance(prompt: str, completion: str) -> float:
    """|answer − truth| for an addition prompt; ``inf`` for a malformed answer."""
    a, b = parse_addition_prompt(prompt)
    ans = parse_answer(completion)
    return float("inf") if ans is None else float(abs(ans - (a + b)))


def judge(prompt: str, completion_1: str, completion_2: str) -> float:
    """Exact oracle: 1.0 if completion_1 is better, 0.0 if completion_2 is, 0.5 for a tie.

    Addition prompts: the closer answer wins (two malformed answers tie).
    Reversal prompts (``"rev abc="``): the exact reversal beats anything else.
    """
    if prompt.startswith("rev "):
        target = prompt[4:].rstrip("=")[::-1]
        ok1, ok2 = completion_1.strip() == target, completion_2.strip() == target
        return 0.5 if ok1 == ok2 else float(ok1)
    d1, d2 = distance(prompt, completion_1), distance(prompt, completion_2)
    if d1 == d2:
        return 0.5
    return 1.0 if d1 < d2 else 0.0


def noisy_answer(truth: int, rng: random.Random) -> int:
    """One answer from the sloppy annotator (NOISE_OFFSETS with NOISE_PROBS)."""
    return truth + rng.choices(NOISE_OFFSETS, weights=NOISE_PROBS)[0]


@dataclass(frozen=True)
class Splits:
    """Disjoint prompt sets of skill A, and disjoint string sets of skill B."""

    warmup: list[AdditionProblem]  # supervised warm-up (noisy answers)
    pref_train: list[AdditionProblem]  # preference pairs for training
    pref_eval: list[AdditionProblem]  # held-out preference pairs (reward accuracy)
    heldout: list[AdditionProblem]  # win-rate prompts: in no other split
    rev_warmup: list[str]  # reversal strings taught in the warm-up
    rev_heldout: list[str]  # reversal strings for the retention check: not in the warm-up


def sample_rev_strings(rng: random.Random, n: int, exclude: set[str] | frozenset[str] = frozenset()) -> list[str]:
    """``n`` distinct random strings over LETTERS with lengths REV_LENGTHS, none in ``exclude``."""
    out: list[str] = []
    seen = set(exclude)
    while len(out) < n:
        s = "".join(rng.choice(LETTERS) for _ in range(rng.choice(REV_LENGTHS)))
        if s not in seen:
            seen.add(s)
            out.append(s)
    return out


def make_splits(
    seed: int = 0,
    n_heldout: int = 200,
    n_pref_eval: int = 200,
    n_pref_train: int = 600,
    n_rev_warmup: int = 2000,
    n_rev_heldout: int = 200,
) -> Splits:
    """Shuffle all 1600 addition problems with ``seed`` and cut them into disjoint splits.

    The warm-up gets every problem not in the held-out sets (so it overlaps
    ``pref_train``, as SFT and preference data usually do); ``heldout`` and
    ``pref_eval`` are seen by nothing else.
    """
    lo, hi = ADD_RANGE
    problems = [AdditionProblem(a, b) for a in range(lo, hi + 1) for b in range(lo, hi + 1)]
    rng = random.Random(f"prefzoo-splits-{seed}")
    rng.shuffle(problems)
    if n_heldout + n_pref_eval + n_pref_train > len(problems):
        raise ValueError(f"n_heldout + n_pref_eval + n_pref_train must be <= {len(problems)}")
    heldout = problems[:n_heldout]
    pref_eval = problems[n_heldout : n_heldout + n_pref_eval]
    rest = problems[n_heldout + n_pref_eval :]
    pref_train = rest[:n_pref_train]
    rev_heldout = sample_rev_strings(rng, n_rev_heldout)
    rev_warmup = sample_rev_strings(rng, n_rev_warmup, exclude=set(rev_heldout))
    return Splits(rest, pref_train, pref_eval, heldout, rev_warmup, rev_heldout)


def draft_answer(truth: int, rng: random.Random) -> int:
    """One draft answer for a preference pair (DRAFT_OFFSETS with DRAFT_PROBS), never negative."""
    return max(0, truth + rng.choices(DRAFT_OFFSETS, weights=DRAFT_PROBS)[0])


def make_pairs(problems: list[AdditionProblem], seed: int, prefix: str, pairs_per_prompt: int = 1) -> list[dict]:
    """Preference pairs ranked by the exact oracle, deterministic in ``seed``.

    For each prompt, two drafts are drawn (:func:`draft_answer`) until their
    distances to the truth differ; the closer one is ``chosen``.  Chosen is the
    exact answer in about 59% of pairs, and chosen is below rejected exactly as
    often as above (in expectation).  Returns dicts with ``id``, ``prompt``,
    ``chosen``, ``rejected``.
    """
    rng = random.Random(f"prefzoo-pairs-{prefix}-{seed}")
    rows = []
    for i, p in enumerate(problems):
        for k in range(pairs_per_prompt):
            while True:
                x, y = draft_answer(p.truth, rng), draft_answer(p.truth, rng)
                dx, dy = abs(x - p.truth), abs(y - p.truth)
                if dx != dy:
                    break
            chosen, rejected = (x, y) if dx < dy else (y, x)
            row = {"id": f"{prefix}-{i}-{k}", "prompt": p.prompt, "chosen": str(chosen), "rejected": str(rejected)}
            rows.append(row)
    return rows


def make_lists(problems: list[AdditionProblem], seed: int, prefix: str, k: int = 4) -> list[dict]:
    """Lists of ``k`` drafts per prompt ranked by the exact oracle, deterministic in ``seed``.

    ``k`` distinct drafts are drawn like the pairs' (:func:`draft_answer`, a repeated answer drawn again);
    ``scores`` are −|answer − truth| (higher is better; an answer and its mirror image tie).  Returns dicts with
    ``id``, ``prompt``, ``completions``, ``scores``.
    """
    rng = random.Random(f"prefzoo-lists-{prefix}-{seed}")
    rows = []
    for i, p in enumerate(problems):
        drafts: list[int] = []
        while len(drafts) < k:
            d = draft_answer(p.truth, rng)
            if d not in drafts:
                drafts.append(d)
        rows.append({"id": f"{prefix}-{i}", "prompt": p.prompt, "completions": [str(d) for d in drafts],
                     "scores": [float(-abs(d - p.truth)) for d in drafts]})  # fmt: skip
    return rows


def make_unpaired(problems: list[AdditionProblem], seed: int, prefix: str, per_prompt: int = 2) -> list[dict]:
    """Unpaired thumbs-up/down feedback: ``per_prompt`` independent drafts per prompt, each labelled desirable
    exactly when the oracle finds it correct (about 30% of drafts).  Returns dicts with ``id``, ``prompt``,
    ``completion``, ``label``."""
    rng = random.Random(f"prefzoo-unpaired-{prefix}-{seed}")
    rows = []
    for i, p in enumerate(problems):
        for k in range(per_prompt):
            d = draft_answer(p.truth, rng)
            rows.append({"id": f"{prefix}-{i}-{k}", "prompt": p.prompt, "completion": str(d), "label": d == p.truth})
    return rows
