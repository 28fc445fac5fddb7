"""docs/architecture.md matches the tree: every module it names exists, and every package of prefzoo is named."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "architecture.md"
PACKAGE = ROOT / "prefzoo"


def named_modules(text: str) -> set[str]:
    """Paths below prefzoo/ the page names: ``train/run.py`` in code spans, and in the layer diagram (the first code
    block) each ``x.py`` under the package whose line it continues (``fast/:`` opens a subpackage)."""
    names = set(re.findall(r"`((?:[a-z_]+/)*[a-z_]+\.py)(?:::\w+)?`", text))
    diagram = text.split("```", 2)[1] if text.count("```") >= 2 else ""
    package = sub = ""
    for line in diagram.splitlines():
        if m := re.match(r"^ ([a-z_]+/)\s", line):
            package, sub = m.group(1), ""
        elif re.match(r"^ [a-z_]+\.py\s", line):
            package, sub = "", ""
        for token in re.findall(r"[a-z_]+/:|[a-z_]+\.py\b", line):
            if token.endswith(":"):
                sub = token[:-1]
            else:
                names.add(f"{package}{sub}{token}")
    return {n for n in names if not n.startswith(("tests/", "benchmarks/", "docs/"))}


def test_every_module_the_page_names_exists():
    text = DOC.read_text(encoding="utf-8")
    missing = sorted(n for n in named_modules(text) if not (PACKAGE / n).is_file() and not (ROOT / n).is_file())
    assert missing == [], f"docs/architecture.md names modules that do not exist: {missing}"


def test_every_module_is_named():
    """A reader finds every module of the package on the page (its package's line of the diagram, or a code span)."""
    named = named_modules(DOC.read_text(encoding="utf-8"))
    modules = sorted(p.relative_to(PACKAGE).as_posix() for p in PACKAGE.rglob("*.py") if p.name != "__init__.py")
    assert [m for m in modules if m not in named] == []


def test_every_package_is_named():
    text = DOC.read_text(encoding="utf-8")
    packages = sorted(p.parent.relative_to(PACKAGE).as_posix() + "/" for p in PACKAGE.rglob("__init__.py"))
    unnamed = [p for p in packages if p != "./" and p.rsplit("/", 2)[-2] + "/" not in text]
    assert unnamed == [], f"docs/architecture.md does not name the packages {unnamed}"


def test_the_checks_see_a_missing_module():
    assert "train/nowhere.py" in named_modules("the `train/nowhere.py` module")
    page = "```\n model/   loading.py\n   │   fast/: head.py fused\n registry.py  x\n```\n"
    assert named_modules(page) == {"model/loading.py", "model/fast/head.py", "registry.py"}
