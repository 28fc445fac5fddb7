"""A seeded uniform sample of mutmut's mutants, each run against the configured test selection: an unbiased estimate
of the mutation score when the whole configuration (about 8,600 mutants) takes hours on 2 cores.

mutmut 3 generates the mutants (``[tool.mutmut]`` in pyproject.toml: ``only_mutate``, the test selection and the
pytest arguments are read from there); this driver then draws ``--n`` names with ``random.Random(seed)`` from the
sorted list of every generated mutant and runs each in a fresh pytest process with ``MUTANT_UNDER_TEST=<name>`` (the
trampolines mutmut compiles into ``mutants/`` switch the function at call time), ``-x``, the tests of the mutated
module first.  A non-zero pytest status kills the mutant (a failure, an error, or a mutant that breaks collection);
status 0 lets it survive; the per-mutant timeout counts as killed, as in mutmut, and is reported apart.

Unlike ``mutmut run`` there is no stats phase (40 min or more on a loaded 2-core machine), and the sample is uniform
over all the mutants rather than the cheapest first.  The price: every survivor costs a whole run of the selection.

    python benchmarks/mutation_sample.py generate --workdir /tmp/mutsample       # a copy of HEAD, mutants generated
    python benchmarks/mutation_sample.py run --workdir /tmp/mutsample --seed 8 --n 60 --minutes 45 \\
        --out benchmarks/results/mutation_sample_s8.jsonl
    python benchmarks/mutation_sample.py summary benchmarks/results/mutation_sample_s8.jsonl

``one-change --kind {boolean,comparison,number}`` lists the mutants whose only change is one token of that class
(``boolean-ops`` is ``--kind boolean``), for ``run --names FILE --first-only``: a screen of a whole class against each
module's first tests.  ``quick`` generates the mutants of one small module (orpo.py) and runs two of them: a smoke of
the machinery.
"""

from __future__ import annotations

import argparse
import ast
import difflib
import io
import json
import math
import os
import random
import shutil
import subprocess
import sys
import time
import tokenize
from collections import defaultdict
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import tomllib

ROOT = Path(__file__).resolve().parents[1]

# tests to run first for a mutant of each module (a killed mutant then stops early under -x); the rest of the
# configured selection runs after them
FIRST: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("prefzoo.losses.", ("tests/losses", "tests/properties/test_reference_values.py")),
    ("prefzoo.testing.architectures", ("tests/archs/test_tiny_configs.py",)),
    ("prefzoo.testing.", ("tests/testing", "tests/properties/test_lists.py", "tests/properties/test_unpaired.py")),
    (
        "prefzoo.spec",
        (
            "tests/registry",
            "tests/losses/test_api.py",
            "tests/losses/test_shapes.py",
            "tests/losses/test_loss_state.py",
        ),
    ),
    (
        "prefzoo.types",
        (
            "tests/losses/test_api.py",
            "tests/losses/test_shapes.py",
            "tests/losses/test_batch_errors.py",
            "tests/losses/test_pairs_as_groups.py",
        ),
    ),
    ("prefzoo.registry", ("tests/registry",)),
    (
        "prefzoo.train.engines.accelerator",
        (
            "tests/train/engines/test_deepspeed_config.py",
            "tests/train/engines/test_accelerator_setup.py",
            "tests/properties/test_mmpo_identity.py",
        ),
    ),
)


def mutmut_config(root: Path) -> dict:
    return tomllib.loads((root / "pyproject.toml").read_text())["tool"]["mutmut"]


def generate(workdir: Path, only: list[str] | None = None) -> int:
    """A clean copy of HEAD in ``workdir`` (``only``: restrict ``only_mutate``), then mutmut's mutant generation."""
    if workdir.exists():
        shutil.rmtree(workdir)
    workdir.mkdir(parents=True)
    archive = subprocess.run(["git", "-C", str(ROOT), "archive", "HEAD"], check=True, capture_output=True).stdout
    subprocess.run(["tar", "-x", "-C", str(workdir)], input=archive, check=True)
    if only:
        text = (workdir / "pyproject.toml").read_text()
        start = text.index("only_mutate = [")
        end = text.index("]", start) + 1
        (workdir / "pyproject.toml").write_text(text[:start] + f"only_mutate = {json.dumps(only)}" + text[end:])
    code = (  # mutmut's own generation steps (mutmut run's first phase), in the copy's directory
        "from mutmut.mutation.trampoline import set_mutant_under_test\n"
        "import mutmut.__main__ as m\n"
        "set_mutant_under_test('mutant_generation')\n"
        "m.copy_src_dir(); m.copy_also_copy_files(); m.setup_source_paths()\n"
        "print(m.create_mutants(2))\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, cwd=workdir)
    names = mutant_names(workdir)
    print(f"{len(names)} mutants in {workdir / 'mutants'}")
    return len(names)


def mutant_names(workdir: Path) -> list[str]:
    names: list[str] = []
    for meta in sorted((workdir / "mutants").rglob("*.py.meta")):
        names += json.loads(meta.read_text())["exit_code_by_key"]
    return sorted(names)


# the classes ``one-change`` lists: a mutant belongs to one when its only change, token by token, replaces one
# member of the class with another (``is`` -> ``is not`` counts: the tokens are compared joined)
CLASSES: dict[str, frozenset[str]] = {
    "boolean": frozenset({"and", "or"}),
    "comparison": frozenset({"==", "!=", "<", "<=", ">", ">=", "is", "is not", "in", "not in"}),
}


def _tokens(line: str) -> list[tuple[int, str]]:
    """(type, text) of one source line's tokens; a line inside a bracket that closes later still tokenizes up to
    its end (tokenize's error at the missing close is expected)."""
    skip = {tokenize.NEWLINE, tokenize.NL, tokenize.COMMENT, tokenize.INDENT, tokenize.DEDENT, tokenize.ENDMARKER}
    out: list[tuple[int, str]] = []
    try:
        for tok in tokenize.generate_tokens(io.StringIO(line.strip() + "\n").readline):
            if tok.type not in skip:
                out.append((tok.type, tok.string))
    except (tokenize.TokenError, IndentationError, SyntaxError):
        pass
    return out


def _in_class(old: str, new: str, kind: str) -> bool:
    """Whether one changed line ``old`` -> ``new`` is a single change of class ``kind``."""
    a, b = _tokens(old), _tokens(new)
    ops = [op for op in difflib.SequenceMatcher(a=a, b=b, autojunk=False).get_opcodes() if op[0] != "equal"]
    if len(ops) != 1:
        return False
    _, i1, i2, j1, j2 = ops[0]
    was, now = a[i1:i2], b[j1:j2]
    if kind == "number":
        return len(was) == len(now) == 1 and was[0][0] == now[0][0] == tokenize.NUMBER
    members = CLASSES[kind]
    if len(was) == len(now) == 1 and was[0][0] == now[0][0] == tokenize.STRING:
        return _middle(was[0][1], now[0][1]) in {(m, n) for m in members for n in members}
    # a word added or dropped ('is' -> 'is not', 'not in' -> 'in') is read with its neighbour on either side
    spans = [(i1, i2, j1, j2)] if was and now else [(i1 - 1, i2, j1 - 1, j2), (i1, i2 + 1, j1, j2 + 1)]
    return any(
        " ".join(t for _, t in a[p:q]) in members and " ".join(t for _, t in b[r:s]) in members
        for p, q, r, s in spans
        if p >= 0 and r >= 0
    )


def _middle(old: str, new: str) -> tuple[str, str]:
    """The changed words of two strings (an f-string is one token before Python 3.12): the common prefix and suffix
    removed, each cut back to a space or bracket so that a shared first character stays in the words."""
    i = 0
    while i < min(len(old), len(new)) and old[i] == new[i]:
        i += 1
    while i > 0 and old[i - 1] not in " ([{":
        i -= 1
    j = 0
    while j < min(len(old), len(new)) - i and old[-1 - j] == new[-1 - j]:
        j += 1
    while j > 0 and old[-j] not in " )]}":
        j -= 1
    return old[i : len(old) - j].strip(), new[i : len(new) - j].strip()


def one_change(workdir: Path, kind: str) -> list[str]:
    """The mutants whose only change is one token of class ``kind`` (``boolean``: ``and`` <-> ``or``;
    ``comparison``: one comparison operator for another; ``number``: one numeric literal for another), found by
    comparing each mutant's source with its ``__mutmut_orig`` line by line: the classes ``run --names`` screens."""
    names = set(mutant_names(workdir))
    found: list[str] = []
    for meta in sorted((workdir / "mutants").rglob("*.py.meta")):
        path = meta.with_suffix("")
        module = ".".join(path.relative_to(workdir / "mutants").with_suffix("").parts)
        text = path.read_text()
        lines, tree = text.splitlines(), ast.parse(text)
        defs = [n for n in tree.body if isinstance(n, ast.FunctionDef)]
        defs += [m for c in tree.body if isinstance(c, ast.ClassDef) for m in c.body if isinstance(m, ast.FunctionDef)]
        body = {d.name: lines[d.lineno : d.end_lineno] for d in defs}  # without the def line, which names it
        for name, mutant in body.items():
            stem, _, k = name.rpartition("__mutmut_")
            orig = body.get(f"{stem}__mutmut_orig")
            if not k.isdigit() or orig is None or len(orig) != len(mutant) or f"{module}.{name}" not in names:
                continue
            diff = [(a, b) for a, b in zip(orig, mutant, strict=True) if a != b]
            if len(diff) == 1 and _in_class(*diff[0], kind):
                found.append(f"{module}.{name}")
    return sorted(found)


def boolean_ops(workdir: Path) -> list[str]:
    """``one_change(workdir, "boolean")``: the class session 11 screened whole."""
    return one_change(workdir, "boolean")


def selection(workdir: Path, name: str, first_only: bool = False) -> list[str]:
    cfg = mutmut_config(workdir)
    first = next((tests for prefix, tests in FIRST if name.startswith(prefix)), ())
    rest = [] if first_only else [t for t in cfg["pytest_add_cli_args_test_selection"] if t not in first]
    return [*cfg.get("pytest_add_cli_args", []), "-x", "-q", *first, *rest]


def run_one(workdir: Path, name: str, timeout: float, first_only: bool = False) -> dict:
    env = {
        **os.environ,
        "MUTANT_UNDER_TEST": name,
        "PYTHONPATH": str(workdir / "mutants"),
        "OMP_NUM_THREADS": "1",
        "HYPOTHESIS_PROFILE": "mutation",
        "PREFZOO_GENERIC_EXAMPLES": "5",
    }
    t0 = time.monotonic()
    cmd = ["nice", "-n", "10", sys.executable, "-m", "pytest", *selection(workdir, name, first_only)]
    try:
        proc = subprocess.run(cmd, cwd=workdir / "mutants", env=env, capture_output=True, text=True, timeout=timeout)
        code, tail = proc.returncode, (proc.stdout + proc.stderr)[-1500:]
    except subprocess.TimeoutExpired:
        code, tail = None, "timeout"
    status = "timeout" if code is None else ("survived" if code == 0 else "killed")
    first_failure = next((ln for ln in tail.splitlines() if ln.startswith(("FAILED", "ERROR"))), "")
    return {
        "mutant": name,
        "status": status,
        "exit": code,
        "seconds": round(time.monotonic() - t0, 1),
        "first_failure": first_failure[:300],
    }


def module_of(name: str) -> str:
    return name.rsplit(".", 1)[0]


def wilson(k: int, n: int, z: float = 1.96) -> tuple[float, float]:
    if n == 0:
        return 0.0, 1.0
    p = k / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return max(0.0, centre - half), min(1.0, centre + half)


def summarize(rows: list[dict], equivalent: set[str] = frozenset()) -> str:
    by: dict[str, list[dict]] = defaultdict(list)
    for r in rows:
        by[module_of(r["mutant"])].append(r)
    lines = [
        "| module | tested | killed | timeout | survived | equivalent | score (95% CI) |",
        "|---|---|---|---|---|---|---|",
    ]

    def line(label: str, rs: list[dict]) -> str:
        killed = sum(r["status"] == "killed" for r in rs)
        timeout = sum(r["status"] == "timeout" for r in rs)
        eq = sum(r["status"] == "survived" and r["mutant"] in equivalent for r in rs)
        survived = sum(r["status"] == "survived" for r in rs) - eq
        n = killed + timeout + survived
        lo, hi = wilson(killed + timeout, n)
        score = f"{100 * (killed + timeout) / n:.1f}% ({lo:.0%}–{hi:.0%})" if n else "–"
        return f"| {label} | {len(rs)} | {killed} | {timeout} | {survived} | {eq} | {score} |"

    lines += [line(f"`{m}`", by[m]) for m in sorted(by)]
    lines.append(line("**all**", rows))
    return "\n".join(lines)


def run(
    workdir: Path,
    seed: int,
    n: int,
    minutes: float,
    jobs: int,
    timeout: float,
    out: Path,
    chosen: list[str] | None = None,
    first_only: bool = False,
) -> list[dict]:
    """Run a seeded draw of ``n`` mutants, or the ``chosen`` ones; ``first_only``: only each module's FIRST tests
    (a screen for candidates, not a score: a survivor there may still die in the rest of the selection)."""
    names = mutant_names(workdir)
    if not names:
        raise SystemExit(f"mutation_sample: no mutants in {workdir / 'mutants'}: run `generate` first")
    if chosen is not None:
        unknown = sorted(set(chosen) - set(names))
        if unknown:
            raise SystemExit(f"mutation_sample: --names: no such mutant {unknown[0]!r} in {workdir / 'mutants'}")
        sample = list(chosen)
    else:
        sample = random.Random(seed).sample(names, min(n, len(names)))
    deadline = time.monotonic() + 60 * minutes
    done = {json.loads(ln)["mutant"] for ln in out.read_text().splitlines()} if out.exists() else set()
    todo = [m for m in sample if m not in done]
    how = f"{len(sample)} named" if chosen is not None else f"seed {seed}: {len(sample)} drawn"
    print(f"{len(names)} mutants; {how}, {len(todo)} to run, {jobs} at a time", flush=True)
    out.parent.mkdir(parents=True, exist_ok=True)

    def work(name: str) -> dict | None:
        if time.monotonic() > deadline:
            return None
        row = run_one(workdir, name, timeout, first_only)
        with out.open("a") as f:
            f.write(json.dumps(row) + "\n")
        print(f"{row['status']:8} {row['seconds']:7.1f}s {name}  {row['first_failure'][:100]}", flush=True)
        return row

    with ThreadPoolExecutor(jobs) as pool:
        list(pool.map(work, todo))
    return [json.loads(ln) for ln in out.read_text().splitlines()]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    g = sub.add_parser("generate")
    g.add_argument("--workdir", type=Path, required=True)
    g.add_argument("--only", nargs="*", help="restrict only_mutate to these paths")
    r = sub.add_parser("run")
    r.add_argument("--workdir", type=Path, required=True)
    r.add_argument("--seed", type=int, default=8)
    r.add_argument("--n", type=int, default=60)
    r.add_argument("--minutes", type=float, default=45.0, help="start no mutant after this (the running ones finish)")
    r.add_argument("--jobs", type=int, default=2)
    r.add_argument("--timeout", type=float, default=900.0, help="seconds per mutant (counts as killed, reported)")
    r.add_argument("--out", type=Path, required=True, help="JSON lines, one per mutant; a rerun skips those in it")
    r.add_argument("--names", type=Path, help="run these mutants (one name per line) instead of a seeded draw")
    r.add_argument("--first-only", action="store_true", help="only each module's FIRST tests: a screen, not a score")
    s = sub.add_parser("summary")
    s.add_argument("results", type=Path)
    s.add_argument("--equivalent", nargs="*", default=[], help="survivors judged equivalent (names)")
    b = sub.add_parser("boolean-ops", help="print the mutants that only swap one 'and' / 'or' (for run --names)")
    b.add_argument("--workdir", type=Path, required=True)
    o = sub.add_parser("one-change", help="print the mutants whose only change is one token of a class (run --names)")
    o.add_argument("--workdir", type=Path, required=True)
    o.add_argument("--kind", choices=[*CLASSES, "number"], required=True)
    q = sub.add_parser("quick", help="the bench env's smoke: one small module, two mutants")
    q.add_argument("--workdir", type=Path, default=None)
    a = ap.parse_args(argv)
    if a.cmd == "generate":
        generate(a.workdir, a.only)
    elif a.cmd == "run":
        if a.names is not None and not a.names.is_file():
            raise SystemExit(f"mutation_sample: --names {a.names}: no such file (one mutant name per line)")
        chosen = a.names.read_text().split() if a.names else None
        rows = run(a.workdir, a.seed, a.n, a.minutes, a.jobs, a.timeout, a.out, chosen, a.first_only)
        print(summarize(rows))
    elif a.cmd == "boolean-ops":
        print("\n".join(boolean_ops(a.workdir)))
    elif a.cmd == "one-change":
        print("\n".join(one_change(a.workdir, a.kind)))
    elif a.cmd == "summary":
        rows = [json.loads(ln) for ln in a.results.read_text().splitlines()]
        print(summarize(rows, set(a.equivalent)))
    else:
        import tempfile

        workdir = a.workdir or Path(tempfile.mkdtemp(prefix="mutation-quick-"))
        generate(workdir, ["prefzoo/losses/orpo.py"])
        rows = run(workdir, 0, 2, 10.0, 1, 600.0, workdir / "quick.jsonl")
        print(summarize(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
