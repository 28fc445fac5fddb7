"""Small list and unpaired datasets for the trainer and data tests (addition prompts, like tests/support/tiny.py)."""

from __future__ import annotations

import random
from typing import Any


def make_ultrafeedback_raw(n: int, k: int = 4, seed: int = 0) -> list[dict[str, Any]]:
    """n raw UltraFeedback rows: an instruction and k completions rated by closeness to the sum (10 = exact)."""
    rng = random.Random(seed)
    rows = []
    for _ in range(n):
        a, b = rng.randint(0, 49), rng.randint(0, 49)
        offsets = rng.sample([0, 1, 2, 3, 4, 5, 6, 7], k)
        comps = [
            {"response": str(a + b + o), "overall_score": float(10 - o), "model": "m", "annotations": {}}
            for o in offsets
        ]
        rows.append({"source": "test", "instruction": f"add {a}+{b}=", "completions": comps})
    return rows


def make_lists(n: int, k: int = 4, seed: int = 0, scores: bool = True) -> list[dict[str, Any]]:
    """n generic list rows: prompt, k completions and (``scores``) a score each; without scores best first."""
    rng = random.Random(seed)
    rows = []
    for i in range(n):
        a, b = rng.randint(0, 49), rng.randint(0, 49)
        offsets = rng.sample([0, 1, 2, 3, 4, 5, 6, 7], k)
        if not scores:
            offsets.sort()
        comps = [str(a + b + o) for o in offsets]
        row: dict[str, Any] = {"id": f"l{i}", "prompt": f"add {a}+{b}=", "completions": comps}
        if scores:
            row["scores"] = [float(-o) for o in offsets]
        rows.append(row)
    return rows


def make_unpaired(n: int, seed: int = 0) -> list[dict[str, Any]]:
    """n TRL unpaired rows: the right sum labelled true, a wrong one false, alternating."""
    rng = random.Random(seed)
    rows = []
    for i in range(n):
        a, b = rng.randint(0, 49), rng.randint(0, 49)
        good = i % 2 == 0
        answer = a + b if good else a + b + rng.choice([1, 2, 3])
        rows.append({"prompt": f"add {a}+{b}=", "completion": str(answer), "label": good})
    return rows
