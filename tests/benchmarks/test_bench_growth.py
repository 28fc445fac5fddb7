"""The growth benchmark's arithmetic and tables: the fitted exponent, fixed-length pairs, merged side-by-side rows."""

from __future__ import annotations

import importlib
from pathlib import Path

import pytest

BENCH_DIR = Path(__file__).resolve().parents[2] / "benchmarks"


@pytest.fixture(scope="module")
def growth():
    with pytest.MonkeyPatch.context() as mp:  # the benchmarks are scripts in a folder, not a package
        mp.syspath_prepend(str(BENCH_DIR))
        yield importlib.import_module("bench_growth")


@pytest.mark.parametrize("a", [0.5, 1.0, 1.7])
def test_fit_exponent_recovers_a_power_law(growth, a):
    tokens = [256, 512, 1024, 4096]
    assert growth.fit_exponent(tokens, [3.0 * t**a for t in tokens]) == pytest.approx(a, abs=1e-9)


def test_fixed_pairs_have_exact_word_counts(growth):
    pairs = growth.fixed_pairs(3, completion=10, vocab_size=100, prompt=7)
    assert [len(p["prompt"].split()) for p in pairs] == [7, 7, 7]
    assert all(len(p[k].split()) == 9 for p in pairs for k in ("chosen", "rejected"))  # + eos = 10 tokens


def test_step_table_pairs_the_sides_and_prefers_measured_points(growth):
    rows = [
        {"side": "prefzoo", "completion": 256, "batch": 1, "tokens": 768, "step_s": 2.0, "peak_mb": 1000,
         "peak_steps_mb": 800},
        {"side": "trl", "completion": 256, "batch": 1, "error": "not run: time"},
        {"side": "trl", "completion": 256, "batch": 1, "tokens": 768, "step_s": 8.0, "peak_mb": 2000},
    ]  # fmt: skip
    line = next(ln for ln in growth.step_table(rows, "completion") if ln.startswith("| 256 "))
    cells = [c.strip() for c in line.strip("|").split("|")]
    assert cells == ["256", "768", "2.00", "8.00", "4.00×", "1000 (800)", "2000", "0.50 (0.40)"]
