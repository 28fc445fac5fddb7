"""The n-sample arms of the β sweep (--nsample) and the online study's page/arguments: planning, data, CIs, pages."""

from __future__ import annotations

import importlib
import math
from pathlib import Path

import pytest

BENCH_DIR = Path(__file__).resolve().parents[2] / "benchmarks"


@pytest.fixture(scope="module")
def bench():
    with pytest.MonkeyPatch.context() as mp:  # the benchmarks are scripts in a folder, not a package
        mp.syspath_prepend(str(BENCH_DIR))
        yield (
            importlib.import_module("_sweep_run"),
            importlib.import_module("_nsample_report"),
            importlib.import_module("bench_beta_sweep"),
            importlib.import_module("bench_online"),
        )


def _row(loss, k, beta, seed, epoch, win, ret, group="nsample"):
    return {"group": group, "loss": loss, "k": k, "beta": beta, "seed": seed, "epoch": epoch, "win_rate": win,
            "lc_win_rate": win, "retention": ret, "addition_accuracy": win, "addition_mae": 1.0, "malformed": 0.0,
            "mean_policy_length": 2.0, "weights_sha": "x", "seconds": 1.0, "eval_seconds": 0.1}  # fmt: skip


def test_nsample_preset_plans_list_arms_per_k_and_the_pairs_arms(bench):
    run, _, sweep, _ = bench
    cfg = sweep.config_from_args(sweep.parse_args(["--nsample", "--seeds", "0,1"]))
    runs = run.plan_runs(cfg)
    lists = {(r.loss, r.k, r.beta, r.seed) for r in runs if r.group == "nsample"}
    assert lists == {(lo, k, b, s) for lo in ("mml", "mmpo-list") for k in (2, 4, 8) for b in (0.01, 0.05, 0.5)
                     for s in (0, 1)}  # fmt: skip
    assert {(r.loss, r.k) for r in runs if r.group != "nsample"} == {("mmpo", 0), ("dpo", 0)}  # pairs, no ablation
    assert len({sweep._key(r) for r in runs}) == len(runs)  # K is part of the resume key


def test_bad_k_is_named(bench):
    _, _, sweep, _ = bench
    with pytest.raises(SystemExit, match=r"--ks 3: each K must be >= 2 and divide the 16 completions per step"):
        sweep.config_from_args(sweep.parse_args(["--nsample", "--ks", "2,3"]))
    with pytest.raises(SystemExit, match=r"unknown losses.*'nope'"):
        sweep.config_from_args(sweep.parse_args(["--nsample", "--list-losses", "mml,nope"]))


def test_nsample_lists_are_iid_drafts_scored_by_the_oracle(bench):
    run, _, _, _ = bench
    from prefzoo.data import synthetic

    class Task:
        seed = 0

    problems = synthetic.make_splits(0).pref_train
    ds = run.nsample_lists(Task(), 8, 50)
    assert len(ds) == 50 and ds[0]["prompt"] == problems[0].prompt
    repeats = 0
    for row, p in zip(ds, problems, strict=False):
        answers = [int(c) for c in row["completions"]]
        assert len(answers) == 8 and len(set(answers)) > 1  # K = 8 exists (repeats allowed), never all the same
        assert row["scores"] == [float(-abs(a - p.truth)) for a in answers]
        assert all(abs(a - p.truth) <= 3 for a in answers)
        repeats += len(answers) - len(set(answers))
    assert repeats > 0  # i.i.d. draws: 8 answers from 7 offsets must repeat
    assert run.nsample_lists(Task(), 8, 50)[:] == ds[:]  # deterministic in (seed, k)
    with pytest.raises(ValueError, match="only 600 training prompts"):
        run.nsample_lists(Task(), 2, 601)


def test_ci95_is_the_student_t_half_width(bench):
    _, rep, _, _ = bench
    c = rep.ci95([0.5, 0.7])
    assert c["mean"] == pytest.approx(0.6)
    assert c["ci"] == pytest.approx(12.706 * math.sqrt(0.02) / math.sqrt(2))
    c5 = rep.ci95([0.1, 0.2, 0.3, 0.4, 0.5])
    assert c5["ci"] == pytest.approx(2.776 * c5["sd"] / math.sqrt(5))
    assert rep.ci95([0.3])["ci"] == 0.0


def test_nsample_page_tables_and_hand_text(bench, tmp_path):
    _, rep, _, _ = bench
    rows = []
    for seed, j in ((0, 0.0), (1, 0.1)):
        rows += [_row("mml", 4, 0.05, seed, 0, 0.5, 1.0), _row("mml", 4, 0.05, seed, 1, 0.6 + j, 0.9),
                 _row("mml", 4, 0.05, seed, 2, 0.7 + j, 0.4),
                 _row("dpo", 2, 0.05, seed, 0, 0.5, 1.0, "sweep"),
                 _row("dpo", 2, 0.05, seed, 2, 0.55, 0.95, "sweep")]  # fmt: skip
    block = rep.render_block(rows, {"command": "`x`"}, "nsample.png")
    assert "| mml K=4 | 0.05 | 0.750 ± 0.635 |" in block  # mean 0.75, sd 0.0707, t(1) = 12.706
    assert "| dpo (pairs) | 0.05 | 0.550 ± 0.000 |" in block
    assert block.index("dpo (pairs)") < block.index("mml K=4")
    partial = rep.render_block(
        [*rows, _row("mml", 4, 0.05, 2, 0, 0.5, 1.0), _row("mml", 4, 0.05, 2, 2, 0.7, 0.4)], {}, None
    )
    assert "| dpo (pairs) | 0.05 | 0.550 ± 0.000 (n=2) |" in partial  # an interrupted seed is visible per cell
    assert "| mml K=4 | 0.05 | 0.733 ± " in partial and "0.733 ± 0.143 |" in partial
    page = tmp_path / "nsample.md"
    page.write_text("# Title\n\nhand-written reading\n")
    rep.write_page(page, block, "skeleton")
    rep.write_page(page, block.replace("0.750", "0.123"), "skeleton")
    text = page.read_text()
    assert "hand-written reading" in text and "0.123" in text and "0.750" not in text
    assert text.count(rep.BEGIN) == 1
    rep.write_csv(rows, tmp_path / "n.csv")
    assert (tmp_path / "n.csv").read_text().splitlines()[0].startswith("group,loss,k,beta,seed,epoch")


def test_online_arguments_and_page(bench, tmp_path):
    _, _, _, online = bench
    with pytest.raises(SystemExit):
        online.main(["--arms", "online mml n=3", "--out-dir", str(tmp_path)])
    assert online._oracle_reward(["<bos>12+35=", "12+35="], ["47", "x"]) == [-0.0, -10.0]
    st = online.Study(steps=2, seeds=(0, 1), arms=("offline mmpo", "online mml n=2"))
    rows = [{"arm": a, "seed": s, "step": step, "win_rate": w + 0.1 * s, "retention": 1.0, "addition_accuracy": 0.5,
             "malformed": 0.0, "generation_s": 1.0, "judging_s": 0.5, "train_s": 2.0}
            for a, w in (("offline mmpo", 0.6), ("online mml n=2", 0.7)) for s in (0, 1)
            for step in (0, 2)]  # fmt: skip
    page = tmp_path / "online.md"
    page.write_text("# On-policy\n\nmy reading\n")
    online.write_page(rows, st, page, "cmd")
    text = page.read_text()
    assert "my reading" in text and "| online mml n=2 | 0.750 ± 0.635 |" in text
    assert (
        "| offline mmpo | 0.650 ± 0.635 | 1.000 ± 0.000 | 0.500 ± 0.000 | 0.000 ± 0.000 | 1.0 | 0.5 | 2.0 | 3.5 |"
        in text
    )


def test_no_run_reports_only_finished_runs_and_refuses_an_empty_store(bench, tmp_path, capsys):
    _, _, sweep, online = bench
    with pytest.raises(SystemExit, match="no finished run of this sweep"):
        sweep.main(["--nsample", "--no-run", "--out-dir", str(tmp_path / "s"), "--results-dir", str(tmp_path / "r")])
    assert "mml|0.05|0|k4" in capsys.readouterr().out  # the planned runs not run are named
    with pytest.raises(SystemExit, match="no finished run of this study"):
        online.main(["--no-run", "--out-dir", str(tmp_path / "o"), "--results-dir", str(tmp_path / "r")])
