"""The mutation-sample driver's bookkeeping: names from mutmut's meta files, the seeded draw, the test order, the
verdicts and the score table with Wilson intervals.  (Generating and running mutants needs mutmut and minutes: the
recorded runs are in docs/properties.md.)"""

from __future__ import annotations

import importlib
import json
import random
from pathlib import Path

import pytest

BENCH_DIR = Path(__file__).resolve().parents[2] / "benchmarks"


@pytest.fixture(scope="module")
def ms():
    with pytest.MonkeyPatch.context() as mp:  # the benchmarks are scripts in a folder, not a package
        mp.syspath_prepend(str(BENCH_DIR))
        yield importlib.import_module("mutation_sample")


def _workdir(tmp_path: Path) -> Path:
    (tmp_path / "pyproject.toml").write_text(
        '[tool.mutmut]\nonly_mutate = ["prefzoo/losses/*"]\n'
        'pytest_add_cli_args_test_selection = ["tests/properties", "tests/losses", "tests/registry"]\n'
        'pytest_add_cli_args = ["-p", "no:cacheprovider"]\n'
    )
    for rel, names in {
        "prefzoo/losses/dpo.py": ["prefzoo.losses.dpo.x_a__mutmut_2", "prefzoo.losses.dpo.x_a__mutmut_1"],
        "prefzoo/spec.py": ["prefzoo.spec.x_b__mutmut_1"],
    }.items():
        meta = tmp_path / "mutants" / (rel + ".meta")
        meta.parent.mkdir(parents=True, exist_ok=True)
        meta.write_text(json.dumps({"exit_code_by_key": dict.fromkeys(names)}))
    return tmp_path


def test_names_come_from_every_meta_file_sorted(ms, tmp_path):
    assert ms.mutant_names(_workdir(tmp_path)) == [
        "prefzoo.losses.dpo.x_a__mutmut_1",
        "prefzoo.losses.dpo.x_a__mutmut_2",
        "prefzoo.spec.x_b__mutmut_1",
    ]


def test_a_mutants_own_tests_run_first_then_the_rest_of_the_selection_once(ms, tmp_path):
    args = ms.selection(_workdir(tmp_path), "prefzoo.losses.dpo.x_a__mutmut_1")
    assert args == [
        "-p",
        "no:cacheprovider",
        "-x",
        "-q",
        "tests/losses",
        "tests/properties/test_reference_values.py",
        "tests/properties",
        "tests/registry",
    ]


def test_first_only_keeps_the_mutants_own_tests_and_drops_the_rest(ms, tmp_path):
    args = ms.selection(_workdir(tmp_path), "prefzoo.losses.dpo.x_a__mutmut_1", first_only=True)
    assert args == ["-p", "no:cacheprovider", "-x", "-q", "tests/losses", "tests/properties/test_reference_values.py"]


def test_named_mutants_run_instead_of_a_draw_and_an_unknown_name_is_one_line(ms, tmp_path, monkeypatch):
    wd = _workdir(tmp_path)
    ran = []

    def fake_run(cmd, cwd, env, capture_output, text, timeout):
        ran.append((env["MUTANT_UNDER_TEST"], "tests/properties" in cmd))  # in the selection, not spec's first
        return ms.subprocess.CompletedProcess(cmd, 1, "FAILED tests/x.py::t\n", "")

    monkeypatch.setattr(ms.subprocess, "run", fake_run)
    rows = ms.run(wd, 0, 60, 5, 1, 9, tmp_path / "n.jsonl", chosen=["prefzoo.spec.x_b__mutmut_1"], first_only=True)
    assert ran == [("prefzoo.spec.x_b__mutmut_1", False)] and [r["status"] for r in rows] == ["killed"]
    with pytest.raises(SystemExit, match=r"^mutation_sample: --names: no such mutant 'prefzoo.x_c__mutmut_1' in "):
        ms.run(wd, 0, 60, 5, 1, 9, tmp_path / "m.jsonl", chosen=["prefzoo.x_c__mutmut_1"])
    with pytest.raises(SystemExit, match=r"^mutation_sample: --names \S+missing.txt: no such file"):
        ms.main(
            ["run", "--workdir", str(wd), "--out", str(tmp_path / "o.jsonl"), "--names", str(tmp_path / "missing.txt")]
        )


def test_a_run_draws_a_seeded_sample_and_resumes_from_its_results(ms, tmp_path, monkeypatch):
    wd = _workdir(tmp_path)
    verdict = {
        "prefzoo.losses.dpo.x_a__mutmut_1": 1,
        "prefzoo.losses.dpo.x_a__mutmut_2": 0,
        "prefzoo.spec.x_b__mutmut_1": None,
    }
    ran = []

    def fake_run(cmd, cwd, env, capture_output, text, timeout):
        ran.append(env["MUTANT_UNDER_TEST"])
        assert Path(cwd) == wd / "mutants" and env["PYTHONPATH"] == str(wd / "mutants") and "-x" in cmd
        code = verdict[env["MUTANT_UNDER_TEST"]]
        if code is None:
            raise ms.subprocess.TimeoutExpired(cmd, timeout)
        return ms.subprocess.CompletedProcess(cmd, code, "FAILED tests/x.py::t - boom\n" if code else "1 passed\n", "")

    monkeypatch.setattr(ms.subprocess, "run", fake_run)
    out = tmp_path / "r.jsonl"
    rows = ms.run(wd, seed=3, n=2, minutes=5, jobs=1, timeout=9, out=out)
    assert sorted(ran) == sorted(random.Random(3).sample(ms.mutant_names(wd), 2))
    want = {1: "killed", 0: "survived", None: "timeout"}
    assert {r["mutant"]: r["status"] for r in rows} == {m: want[verdict[m]] for m in ran}
    assert all(r["first_failure"] == ("FAILED tests/x.py::t - boom" if r["status"] == "killed" else "") for r in rows)
    ran.clear()
    assert len(ms.run(wd, seed=3, n=3, minutes=5, jobs=1, timeout=9, out=out)) == 3 and len(ran) == 1  # the rest


def test_the_table_counts_timeouts_as_killed_and_leaves_equivalent_survivors_out(ms):
    rows = [
        {"mutant": f"prefzoo.spec.x_f__mutmut_{i}", "status": s}
        for i, s in enumerate(["killed"] * 17 + ["timeout", "survived", "survived"])
    ]
    table = ms.summarize(rows, {"prefzoo.spec.x_f__mutmut_19"})
    assert "| `prefzoo.spec` | 20 | 17 | 1 | 1 | 1 | 94.7% (75%–99%) |" in table
    assert table.splitlines()[-1].startswith("| **all** | 20 | 17 | 1 | 1 | 1 | 94.7%")


@pytest.mark.parametrize(("k", "n", "lo", "hi"), [(43, 43, 0.918, 1.0), (33, 43, 0.622, 0.868), (0, 10, 0.0, 0.278)])
def test_wilson_intervals(ms, k, n, lo, hi):
    got = ms.wilson(k, n)
    assert got == pytest.approx((lo, hi), abs=1e-3)


def test_boolean_ops_lists_only_the_mutants_that_swap_one_and_or(ms, tmp_path):
    """A module with its original function and four mutants (one 'and' -> 'or', one 'or' -> 'and', one other
    change, one swap not in the meta file) and a class method's swap: the two swaps in the meta file, the method's."""
    src = """
def x_f__mutmut_orig(a, b):
    return a and b or a

def x_f__mutmut_1(a, b):
    return a or b or a

def x_f__mutmut_2(a, b):
    return a and b and a

def x_f__mutmut_3(a, b):
    return a and b or None

def x_f__mutmut_4(a, b):
    return a or b or a

class C:
    def xǁCǁg__mutmut_orig(self, a):
        if a is None and self:
            return 1

    def xǁCǁg__mutmut_1(self, a):
        if a is None or self:
            return 1
"""
    path = tmp_path / "mutants" / "pkg" / "m.py"
    path.parent.mkdir(parents=True)
    path.write_text(src)
    keys = ["pkg.m.x_f__mutmut_1", "pkg.m.x_f__mutmut_2", "pkg.m.x_f__mutmut_3", "pkg.m.xǁCǁg__mutmut_1"]
    (tmp_path / "mutants" / "pkg" / "m.py.meta").write_text(json.dumps({"exit_code_by_key": dict.fromkeys(keys)}))
    assert ms.boolean_ops(tmp_path) == ["pkg.m.x_f__mutmut_1", "pkg.m.x_f__mutmut_2", "pkg.m.xǁCǁg__mutmut_1"]


def test_one_change_sorts_mutants_by_the_class_of_their_single_changed_token(ms, tmp_path):
    """One original and eight mutants: a comparison swap, 'is' -> 'is not', a number changed, a string changed, two
    changes on one line, an 'and' -> 'or' inside an f-string (one token before Python 3.12) and one beside another
    'or', and a comparison swap on a line inside an open bracket. Each class lists exactly its own."""
    body = "    if a < 2 and b is None or a:\n        return f\"{a and 'x'}\", (a == 1,\n                b or 0)\n"
    changes = [("a < 2", "a <= 2"), ("is None", "is not None"), ("a < 2", "a < 3"), ("'x'", "'XXxXX'"),
               ("a < 2", "a <= 3"), ("{a and", "{a or"), ("2 and b", "2 or b"), ("a == 1", "a != 1")]  # fmt: skip
    src = f"def x_f__mutmut_orig(a, b):\n{body}\n" + "".join(
        f"def x_f__mutmut_{k}(a, b):\n{body.replace(old, new, 1)}\n" for k, (old, new) in enumerate(changes, 1)
    )
    path = tmp_path / "mutants" / "pkg" / "m.py"
    path.parent.mkdir(parents=True)
    path.write_text(src)
    keys = [f"pkg.m.x_f__mutmut_{k}" for k in range(1, 9)]
    (tmp_path / "mutants" / "pkg" / "m.py.meta").write_text(json.dumps({"exit_code_by_key": dict.fromkeys(keys)}))
    assert ms.one_change(tmp_path, "comparison") == [f"pkg.m.x_f__mutmut_{k}" for k in (1, 2, 8)]
    assert ms.one_change(tmp_path, "number") == ["pkg.m.x_f__mutmut_3"]
    assert ms.one_change(tmp_path, "boolean") == ["pkg.m.x_f__mutmut_6", "pkg.m.x_f__mutmut_7"]
    assert ms.boolean_ops(tmp_path) == ms.one_change(tmp_path, "boolean")


def test_one_change_lists_a_class_on_the_command_line_and_refuses_an_unknown_one(ms, tmp_path, capsys):
    path = tmp_path / "mutants" / "pkg" / "m.py"
    path.parent.mkdir(parents=True)
    path.write_text("def x_f__mutmut_orig(a):\n    return a > 1\n\ndef x_f__mutmut_1(a):\n    return a >= 1\n")
    meta = {"exit_code_by_key": {"pkg.m.x_f__mutmut_1": 0}}
    (tmp_path / "mutants" / "pkg" / "m.py.meta").write_text(json.dumps(meta))
    assert ms.main(["one-change", "--workdir", str(tmp_path), "--kind", "comparison"]) == 0
    assert capsys.readouterr().out.split() == ["pkg.m.x_f__mutmut_1"]
    with pytest.raises(SystemExit):
        ms.main(["one-change", "--workdir", str(tmp_path), "--kind", "strings"])
    assert "invalid choice: 'strings'" in capsys.readouterr().err
