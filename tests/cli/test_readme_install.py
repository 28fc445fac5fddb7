"""README command 1 installs only extras that pyproject.toml defines, and the light ``[train]`` one (issue 16)."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - CI runs 3.11
    tomllib = pytest.importorskip("tomli")


def _command_1() -> str:
    lines = (ROOT / "README.md").read_text(encoding="utf-8").splitlines()
    return lines[lines.index(next(x for x in lines if x.startswith("# 1. "))) + 1]


def _extras() -> dict[str, list[str]]:
    with open(ROOT / "pyproject.toml", "rb") as f:
        return dict(tomllib.load(f)["project"]["optional-dependencies"])


def test_command_1_uses_only_extras_pyproject_defines():
    cmd = _command_1()
    asked = [e.strip() for group in re.findall(r'"\.\[([^\]]*)\]"', cmd) for e in group.split(",")]
    assert asked, f"README command 1 installs no prefzoo extra: {cmd}"
    unknown = sorted(set(asked) - set(_extras()))
    assert not unknown, f"README command 1 asks for extras pyproject.toml does not define: {unknown}"
    assert "torch==" in cmd, "command 1 must pin torch (an unpinned torch pulls a CUDA build)"


def test_bitsandbytes_is_in_qlora_and_all_but_not_in_train():
    extras = _extras()
    assert not any(r.startswith("bitsandbytes") for r in extras["train"])
    assert any(r.startswith("bitsandbytes") for r in extras["qlora"])
    assert "qlora" in re.search(r"\[([^\]]*)\]", extras["all"][0]).group(1).split(",")


def test_docs_record_the_time_of_the_command_the_readme_gives():
    """docs/training-verified.md's measurement of command 1 quotes the command it timed: it must be the README's own."""
    text = (ROOT / "docs" / "training-verified.md").read_text(encoding="utf-8")
    start = text.index("### The first command, measured")
    end = text.find("\n## ", start)
    section = text[start : end if end > 0 else len(text)]
    assert f"`{_command_1()}`" in section, "README command 1 changed: measure it (docs/training-verified.md)"
