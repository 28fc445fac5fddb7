"""The package's shape, checked: small functions and classes, and the sharding engines named in one place only.

- No function or method in ``prefzoo/`` is over 60 lines, no class over 250 (a reader sees a piece whole).
- No class in ``prefzoo/train/`` inherits from two or more others (``TrainConfig`` aside): the run composes its step
  and boundary objects instead of mixing phases into one ``self``.
- ``fsdp`` / ``deepspeed`` / ZeRO appear only under ``prefzoo/train/engines/`` and in the configuration and CLI that
  choose an engine: the trainer asks its engine (:class:`prefzoo.train.engines.Engine`) and never tests which it has.
"""

from __future__ import annotations

import ast
import io
import re
import tokenize
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "prefzoo"
MAX_FUNCTION, MAX_CLASS = 60, 250
# where choosing or being an engine is the job
# and the one adapter of other libraries' private names (prefzoo/_thirdparty.py), which names each library it adapts
ENGINE_ROOMS = ("train/engines/", "train/config/", "cli/", "_thirdparty.py")
ENGINE_WORDS = re.compile(r"fsdp|deepspeed|zero-?[123]\b|zero_?stage", re.IGNORECASE)


def oversized(source: str, name: str) -> list[str]:
    """'name:line kind (N lines)' for each function over MAX_FUNCTION and class over MAX_CLASS lines."""
    out = []
    for node in ast.walk(ast.parse(source, name)):
        size = (getattr(node, "end_lineno", 0) or 0) - getattr(node, "lineno", 0) + 1
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and size > MAX_FUNCTION:
            out.append(f"{name}:{node.lineno} def {node.name} ({size} lines)")
        elif isinstance(node, ast.ClassDef) and size > MAX_CLASS:
            out.append(f"{name}:{node.lineno} class {node.name} ({size} lines)")
    return out


def mixed(source: str, name: str) -> list[str]:
    """'name:line class C' for each class with two or more bases."""
    classes = [n for n in ast.walk(ast.parse(source, name)) if isinstance(n, ast.ClassDef)]
    return [f"{name}:{n.lineno} class {n.name}" for n in classes if len(n.bases) > 1]


def engine_mentions(source: str, name: str) -> list[str]:
    """'name:line token' for every name, string or comment that names a sharding engine."""
    out = []
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        if tok.type in (tokenize.NAME, tokenize.STRING, tokenize.COMMENT) and ENGINE_WORDS.search(tok.string):
            out.append(f"{name}:{tok.start[0]} {ENGINE_WORDS.search(tok.string).group(0)}")  # type: ignore[union-attr]
    return out


def _sources() -> list[tuple[str, str]]:
    return [(p.relative_to(PACKAGE).as_posix(), p.read_text()) for p in sorted(PACKAGE.rglob("*.py"))]


def test_no_function_over_60_lines_and_no_class_over_250() -> None:
    assert [x for name, src in _sources() for x in oversized(src, name)] == []


def test_no_class_in_the_trainer_inherits_from_two_or_more() -> None:
    found = [x for name, src in _sources() if name.startswith("train/") for x in mixed(src, name)]
    assert [x for x in found if not x.endswith(" class TrainConfig")] == []


@pytest.mark.parametrize(
    ("source", "expected"),
    [("class C(A, B):\n    pass\n", ["m.py:1 class C"]), ("class C(A):\n    pass\n", []), ("class C:\n    pass\n", [])],
)
def test_the_mixin_check_sees_two_bases(source, expected) -> None:
    assert mixed(source, "m.py") == expected


def test_only_the_engines_config_and_cli_name_a_sharding_engine() -> None:
    found = [x for name, src in _sources() if not name.startswith(ENGINE_ROOMS) for x in engine_mentions(src, name)]
    assert found == []


@pytest.mark.parametrize(
    ("source", "expected"),
    [
        ("def f():\n" + "    x = 1\n" * 60, ["m.py:1 def f (61 lines)"]),
        ("def f():\n" + "    x = 1\n" * 59, []),
        ("class C:\n" + "    x = 1\n" * 250, ["m.py:1 class C (251 lines)"]),
    ],
)
def test_the_size_check_sees_what_it_should(source, expected) -> None:
    assert oversized(source, "m.py") == expected


def test_the_engine_check_sees_names_strings_and_comments() -> None:
    src = "if cfg.deepspeed:  # ZeRO-3 here\n    x = 'under FSDP2'\nzero = 1\n"
    assert engine_mentions(src, "m.py") == ["m.py:1 deepspeed", "m.py:1 ZeRO-3", "m.py:2 FSDP"]
