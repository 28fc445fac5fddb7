"""The memory benchmark runs end to end on a tiny model: a well-formed table, exact state sizes, the same training.

Memory and time are measured, never asserted: the checks are on what is exact (bytes of parameters and AdamW moments
a rank holds, the formula) and on every engine training the same thing (same global batch: same final loss).
"""

from __future__ import annotations

import importlib
import importlib.util
import json
from pathlib import Path

import pytest

BENCH_DIR = Path(__file__).resolve().parents[2] / "benchmarks"
HAS_DEEPSPEED = importlib.util.find_spec("deepspeed") is not None
ENGINES = ["ddp", "fsdp2-full", *(["zero3"] if HAS_DEEPSPEED else [])]  # the bench env has no deepspeed extra


@pytest.fixture(scope="module")
def bench():
    with pytest.MonkeyPatch.context() as mp:  # the benchmarks are scripts in a folder, not a package
        mp.syspath_prepend(str(BENCH_DIR))
        yield importlib.import_module("bench_memory")


def test_formula_by_hand(bench):
    mb = 2**20
    psi = 1000 * mb  # Ψ parameters: the formula in MB is bytes-per-parameter × 1000
    assert bench.expected_mb("ddp", psi, 2) == 16 * 1000  # 4 params + 4 grads + 8 moments
    assert bench.expected_mb("fsdp2-full", psi, 4) == 4 * 1000  # all of it over 4 ranks
    assert bench.expected_mb("zero2", psi, 2) == (4 + 8) * 1000  # full params; grads, moments, master over 2
    assert bench.expected_mb("zero3", psi, 2) == 10 * 1000  # (16 + 4 master) / 2


def test_write_page_replaces_only_its_block(bench, tmp_path):
    page = tmp_path / "perf.md"
    page.write_text(
        f"# Title\n\n<!-- bench:begin -->\nother\n<!-- bench:end -->\n\n{bench.BEGIN}\nold\n{bench.END}\nend\n"
    )
    bench.write_page(page, "new table\n")
    text = page.read_text()
    assert "old" not in text and "new table" in text and "other" in text and text.rstrip().endswith("end")
    fresh = tmp_path / "fresh.md"
    bench.write_page(fresh, "t\n")
    assert fresh.read_text() == f"\n{bench.BEGIN}\nt\n{bench.END}\n"


@pytest.mark.slow
@pytest.mark.distributed
def test_quick_run_table_and_exact_sizes(bench, tmp_path):
    out = tmp_path / "res.json"
    argv = ["--quick", "--engines", *ENGINES, "--cache", str(tmp_path / "cache"), "--out", str(out)]
    assert bench.main([*argv, "--write-page", str(tmp_path / "page.md")]) == 0
    res, page = json.loads(out.read_text()), (tmp_path / "page.md").read_text()
    rows = {r["engine"]: r for r in res["rows"]}
    assert list(rows) == ENGINES and res["meta"]["world"] == 2 and res["meta"]["global_batch"] == 4

    table = [ln for ln in page.splitlines() if ln.startswith("|")]
    assert len(table) == 2 + len(ENGINES) and len({ln.count("|") for ln in table}) == 1
    assert [ln.split("|")[1].strip() for ln in table[2:]] == ENGINES
    assert "Command: `python benchmarks/bench_memory.py --quick" in page and "torch 2." in page

    psi = res["meta"]["params"]
    ddp, fsdp = rows["ddp"], rows["fsdp2-full"]
    for r in rows.values():  # measured, so only sane: positive, ordered, finite
        assert 0 < r["import_rss_mb"] <= r["setup_rss_mb"] and r["step_peak_rss_mb"] >= r["setup_rss_mb"] * 0.5
        assert r["median_step_s"] > 0 and r["steps"] == 2 and r["params"] == psi
    assert ddp["params_mb"] == pytest.approx(4 * psi / 2**20)  # fp32, every rank holds the whole model
    assert ddp["optim_state_mb"] == pytest.approx(2 * ddp["params_mb"])  # AdamW: exp_avg + exp_avg_sq
    for sharded in (
        fsdp,
        rows.get("zero3", fsdp),
    ):  # the tiny model's dimensions are even: exactly half on each of 2 ranks
        assert sharded["params_mb"] == pytest.approx(ddp["params_mb"] / 2, rel=0.01)
        assert sharded["optim_state_mb"] == pytest.approx(ddp["optim_state_mb"] / 2, rel=0.01)
    if "zero3" in rows:  # DeepSpeed's fp32 partition: another copy of the rank's share
        assert rows["zero3"]["master_mb"] == pytest.approx(rows["zero3"]["params_mb"], rel=0.01)
    assert ddp["master_mb"] == fsdp["master_mb"] == 0
    losses = [r["final_loss"] for r in rows.values()]  # same global batch, same steps: the same training
    assert max(losses) - min(losses) <= 1e-5, losses
