"""Other libraries' private names appear in one module only: prefzoo/_thirdparty.py (each there a named function whose
test, tests/test_thirdparty.py, fails when the library changes under it).

Every module of ``prefzoo/`` is read with ``ast`` (nothing is imported).  A private name is one with a leading
underscore that is not a dunder.  Flagged outside the adapter: ``from torch.x._y import z`` or ``from lib import _x``
for the libraries below; ``obj._x`` and ``getattr(obj, "_x")`` (also ``setattr``/``hasattr``/``delattr`` and
:func:`prefzoo._attrs.temporarily`) where ``_x`` is no name prefzoo itself defines (a function, class, variable,
argument, keyword or an attribute it assigns on ``self``/``cls``), except on ``self``/``cls`` and on a module of the
standard library (``os._exit``).
"""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "prefzoo"
ADAPTER = "_thirdparty.py"  # relative to PACKAGE
LIBRARIES = {"torch", "accelerate", "transformers", "deepspeed", "peft", "datasets", "bitsandbytes"}
# TRL's trainer internals its metrics hook keeps in step with: TRL is pinned (prefzoo.integrations.trl.TRL_RANGE) and
# integrations/trl is its adapter; the scan's libraries above are the ones the rest of prefzoo runs on
ALLOWED = {"integrations/trl/_common.py": {"_metrics", "_total_train_tokens", "_tp_size"}}
ATTRIBUTE_CALLS = {"getattr", "setattr", "hasattr", "delattr", "temporarily"}


def private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__")) and name != "_"


def own_names(trees: list[ast.AST]) -> set[str]:
    """The private names prefzoo defines itself, anywhere in the package."""
    names: set[str] = set()
    for tree in trees:
        for node in ast.walk(tree):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                names.add(node.name)
            elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
                names.add(node.id)
            elif isinstance(node, ast.arg):
                names.add(node.arg)
            elif isinstance(node, ast.keyword) and node.arg:
                names.add(node.arg)
            elif isinstance(node, ast.alias) and node.asname:
                names.add(node.asname)
            elif (
                isinstance(node, ast.Attribute)
                and isinstance(node.ctx, ast.Store)
                and isinstance(node.value, ast.Name)
                and node.value.id in ("self", "cls")
            ):
                names.add(node.attr)
    return {n for n in names if private(n)}


def _other_modules(tree: ast.AST) -> set[str]:
    """Names bound to an imported module that is none of LIBRARIES (``import os``): their privates are not scanned."""
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                if a.name.split(".")[0] not in LIBRARIES and not a.name.startswith("prefzoo"):
                    out.add(a.asname or a.name.split(".")[0])
    return out


def private_uses(tree: ast.AST, own: set[str]) -> list[tuple[int, str]]:
    """(line, what) for each use of another library's private name in ``tree``."""
    stdlib = _other_modules(tree)
    found: list[tuple[int, str]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] in LIBRARIES:
            parts = node.module.split(".")
            if any(private(p) for p in parts) or any(private(a.name) for a in node.names):
                found.append((node.lineno, f"from {node.module} import {', '.join(a.name for a in node.names)}"))
        elif isinstance(node, ast.Import):
            for a in node.names:
                if a.name.split(".")[0] in LIBRARIES and any(private(p) for p in a.name.split(".")):
                    found.append((node.lineno, f"import {a.name}"))
        elif isinstance(node, ast.Attribute) and private(node.attr) and node.attr not in own:
            base = node.value
            if isinstance(base, ast.Name) and (base.id in ("self", "cls") or base.id in stdlib):
                continue
            found.append((node.lineno, f".{node.attr}"))
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in ATTRIBUTE_CALLS:
            for arg in node.args[1:2]:
                if isinstance(arg, ast.Constant) and isinstance(arg.value, str):
                    if private(arg.value) and arg.value not in own:
                        found.append((node.lineno, f"{node.func.id}(..., {arg.value!r})"))
    return found


def _package() -> dict[str, ast.AST]:
    return {
        path.relative_to(PACKAGE).as_posix(): ast.parse(path.read_text(), str(path)) for path in PACKAGE.rglob("*.py")
    }


def test_other_libraries_private_names_live_in_the_adapter_only():
    trees = _package()
    assert ADAPTER in trees
    own = own_names([t for name, t in trees.items() if name != ADAPTER])
    bad = [
        f"prefzoo/{name}:{line}: {what}"
        for name, tree in sorted(trees.items())
        if name != ADAPTER
        for line, what in private_uses(tree, own)
        if what.lstrip(".") not in ALLOWED.get(name, set())
    ]
    assert not bad, "another library's private name outside prefzoo/_thirdparty.py (add a named function there):\n" + (
        "\n".join(bad)
    )


def test_the_adapter_holds_what_it_is_for():
    """The scan would pass vacuously if it could not see a private use: it sees the adapter's."""
    trees = _package()
    found = {what for _, what in private_uses(trees[ADAPTER], own_names([]))}
    assert {"._models", "from torch.distributed.checkpoint._traverse import set_element"} <= found
    assert "getattr(..., '_fingerprint')" in found


def test_the_scan_tells_a_library_private_from_prefzoos_own():
    src = """
import os
from torch.utils._pytree import tree_map
from accelerate.state import _private_thing

def _helper():
    return 1

class Box:
    def __init__(self):
        self._cache = {}

    def use(self, accelerator, config, other):
        _helper()
        os._exit(0)
        other._cache.clear()                 # prefzoo's own name, on another object
        getattr(config, "_attn_implementation", None)
        return accelerator._models, self.__dict__
"""
    tree = ast.parse(src)
    got = sorted(what for _, what in private_uses(tree, own_names([tree])))
    assert got == [
        "._models",
        "from accelerate.state import _private_thing",
        "from torch.utils._pytree import tree_map",
        "getattr(..., '_attn_implementation')",
    ]
