"""The β sweep's machinery: run planning, tables, identity check, page and CSV; a tiny real sweep (slow)."""

from __future__ import annotations

import importlib
import math
from pathlib import Path

import pytest

BENCH_DIR = Path(__file__).resolve().parents[2] / "benchmarks"


@pytest.fixture(scope="module")
def sweep():
    with pytest.MonkeyPatch.context() as mp:  # the benchmarks are scripts in a folder, not a package
        mp.syspath_prepend(str(BENCH_DIR))
        yield (
            importlib.import_module("_sweep_run"),
            importlib.import_module("_sweep_report"),
            importlib.import_module("bench_beta_sweep"),
        )


def _row(loss, beta, seed, epoch, win, ret, group="sweep", sha=None):
    return {
        "group": group, "loss": loss, "beta": beta, "seed": seed, "epoch": epoch, "win_rate": win,
        "lc_win_rate": win, "retention": ret, "addition_accuracy": win, "addition_mae": 1.0 - win,
        "malformed": 0.0, "mean_policy_length": 2.0, "weights_sha": sha or f"{loss}{beta}{seed}{epoch}",
        "seconds": 1.0, "eval_seconds": 0.1,
    }  # fmt: skip


def test_plan_runs_covers_grid_and_ablation_once(sweep):
    run, _, _ = sweep
    cfg = run.SweepConfig(seeds=(0, 1))
    runs = run.plan_runs(cfg)
    keys = [(r.loss, r.beta, r.seed) for r in runs]
    assert len(keys) == len(set(keys))  # mmpo at the ablation β is not run twice
    assert len(runs) == 2 * (3 * 3 + 4)
    assert {(r.loss, r.beta) for r in runs if r.group == "ablation"} == {
        (a, 0.05) for a in ("mmpo-no-aux", "mmpo-no-norm", "mmpo-length-norm", "mmpo-entropy")
    }


def test_peak_tables_pick_the_peak_epoch_and_report_the_other_axis(sweep):
    _, rep, _ = sweep
    rows = [_row("dpo", 0.1, 0, 0, 0.5, 1.0)]
    for seed, jitter in ((0, 0.0), (1, 0.02)):
        rows += [
            _row("dpo", 0.1, seed, 1, 0.6 + jitter, 0.9),
            _row("dpo", 0.1, seed, 2, 0.8 + jitter, 0.5),  # peak win-rate
            _row("dpo", 0.1, seed, 3, 0.7 + jitter, 0.95),  # peak retention
        ]
    (t,) = rep.peak_tables(rep.aggregate(rows), ["dpo"])
    assert t["win_epoch"] == 2 and t["ret_epoch"] == 3
    assert t["win"]["win_rate"]["mean"] == pytest.approx(0.81)
    assert t["win"]["win_rate"]["std"] == pytest.approx(math.sqrt(2) * 0.01)
    assert t["win"]["retention"]["mean"] == pytest.approx(0.5)
    assert t["ret"]["win_rate"]["mean"] == pytest.approx(0.71)


def test_identity_check_distinguishes_equal_from_different_trajectories(sweep):
    _, rep, _ = sweep
    rows = []
    for beta in (0.01, 0.5):
        rows += [_row("mmpo", beta, 0, e, 0.7, 0.9, sha=f"s{e}") for e in (1, 2)]
        rows += [_row("dpo", beta, 0, e, 0.6 + beta / 10, 0.9) for e in (1, 2)]
    recs = {r["loss"]: r for r in rep.identity_check(rows, None)}
    assert recs["mmpo"]["metrics_identical"] and recs["mmpo"]["sha_identical"]
    assert not recs["dpo"]["metrics_identical"] and not recs["dpo"]["sha_identical"]


def test_csv_roundtrip_and_page_keeps_hand_written_text(sweep, tmp_path):
    _, rep, _ = sweep
    rows = [_row(lo, b, s, e, 0.5 + 0.1 * e, 1.0 - 0.1 * e) for lo in ("mmpo", "dpo") for b in (0.01, 0.5)
            for s in (0, 1) for e in (0, 1, 2)]  # fmt: skip
    rows += [_row("mmpo-no-aux", 0.05, s, e, 0.6, 0.9, group="ablation") for s in (0, 1) for e in (0, 1, 2)]
    rows += [_row("mmpo", 0.05, s, e, 0.6, 0.9) for s in (0, 1) for e in (0, 1, 2)]
    rep.write_csv(rows, tmp_path / "s.csv")
    back = rep.read_csv(tmp_path / "s.csv")
    assert list(back[0]) == list(rep.CSV_COLUMNS)
    assert sorted(map(repr, back)) == sorted(map(repr, [{k: r[k] for k in rep.CSV_COLUMNS} for r in rows]))
    page = tmp_path / "p.md"
    page.write_text(f"# Title\n\nmy discussion\n\n{rep.BEGIN}\nold\n{rep.END}\n\nafter\n")
    block = rep.render_block(
        rows, {"wall time": "1 s"}, ["mmpo", "dpo"], ["mmpo", "mmpo-no-aux"], 0.05, None, {"t": "x.png"}
    )
    rep.write_page(page, block, "skeleton")
    text = page.read_text()
    assert text.startswith("# Title\n\nmy discussion\n\n") and text.endswith(f"{rep.END}\n\nafter\n")
    assert "old" not in text and "- wall time: 1 s" in text and "![t](x.png)" in text
    assert "| mmpo | 0.01 | 0.700 ± 0.000 (2) | 0.800 ± 0.000 |" in text  # peak win-rate row
    assert "| mmpo-no-aux | 0.600 ± 0.000 (1) |" in text  # ablation row
    # β sensitivity: mmpo's seed-means differ over β (0.05 is flat), dpo's two β coincide; std is 0 here
    assert "| mmpo | peak win-rate | 0.01: 0.700, 0.05: 0.600, 0.5: 0.700 | 0.100 | 0.000 | yes |" in text
    assert "| dpo | peak win-rate | 0.01: 0.700, 0.5: 0.700 | 0.000 | 0.000 | no |" in text
    # identity table: dpo's two β share metrics (not weights); mmpo's β = 0.05 rows differ from its other two
    assert "| dpo | 1 | yes | no |" in text and "| mmpo | 1 | no | no |" in text


def test_bad_arguments_are_named(sweep):
    _, _, bench = sweep
    with pytest.raises(SystemExit, match=r"unknown losses.*'nope'"):
        bench.config_from_args(bench.parse_args(["--methods", "mmpo,nope"]))
    with pytest.raises(SystemExit, match="--epochs=0 must be >= 1"):
        bench.config_from_args(bench.parse_args(["--epochs", "0"]))


@pytest.mark.slow
def test_tiny_sweep_mmpo_identical_across_beta_dpo_not(sweep, tmp_path, monkeypatch):
    """Real training (1 epoch of 48 pairs): MMPO's trajectory does not depend on β (up to float32 rounding), DPO's does.

    This is docs/theory.md's identity L_mmpo = −s_w seen through the trainer: β only shifts the loss value.
    """
    _, rep, bench = sweep
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    out, res = tmp_path / "out", tmp_path / "res"
    argv = ["--epochs", "1", "--pairs", "48", "--eval-prompts", "20", "--seeds", "0", "--lr", "5e-4",
            "--methods", "mmpo,dpo", "--betas", "0.01,0.5", "--ablation", "", "--workers", "1",
            "--out-dir", str(out), "--results-dir", str(res)]  # fmt: skip
    assert bench.main(argv) == 0
    rows = rep.read_csv(res / "beta-sweep.csv")
    assert {(r["loss"], r["beta"], r["epoch"]) for r in rows} == {
        (lo, b, e) for lo in ("mmpo", "dpo") for b in (0.01, 0.5) for e in (0, 1)
    }
    recs = {r["loss"]: r for r in rep.identity_check(rows, str(out / "weights"))}
    assert recs["mmpo"]["metrics_identical"]
    assert recs["mmpo"]["max_abs_dtheta"] < 1e-5  # float32 rounding of σ(a) + σ(−a), not a β effect
    assert recs["dpo"]["max_abs_dtheta"] > 1e-4  # DPO's update scales with β
    pages = ("beta-sweep.md", "beta-sweep-tables.md")
    for name in (*pages, "beta-sweep-trajectories.png", "beta-sweep-trajectories-lc.png"):
        assert (res / name).stat().st_size > 0
    # a rerun finds every run finished and trains nothing
    assert bench.main(argv) == 0
    assert len((out / "runs.jsonl").read_text().splitlines()) == 4
