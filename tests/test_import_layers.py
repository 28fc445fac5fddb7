"""The package's imports point down (cli → train/eval/testing → nn → model → data/registry → losses → spec → types).

No cycles. Every ``import`` in ``prefzoo/`` is read with ``ast`` (function-level and ``TYPE_CHECKING`` imports
count: a lazy import is still an arrow); nothing is imported, so the test needs no optional dependency.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "prefzoo"

# rank of each layer, one package a layer: a module may import its own package, or a package of a lower rank
LAYERS: dict[str, int] = {
    "prefzoo.types": 0,
    "prefzoo.errors": 1,
    "prefzoo.spec": 2,
    "prefzoo.hookspecs": 3,
    "prefzoo.losses": 4,
    "prefzoo.modifiers": 5,  # pure functions of tensors like losses (spec, types, hookspecs); the registry sits above
    "prefzoo.registry": 6,
    "prefzoo": 7,  # the package's __init__: re-exports of registry, losses, spec and types
    "prefzoo.data": 8,
    "prefzoo.model": 9,  # loading, architecture adapters, sequence log-probs and their fast paths: no trainer
    "prefzoo.nn": 10,  # the fused head + any loss as one torch module (model's fused head, the registry): no trainer
    "prefzoo.judge": 11,  # judges, generation engines, scoring: used by online training and by evaluation
    "prefzoo.testing": 12,
    "prefzoo.train": 13,
    "prefzoo.eval": 14,  # a top layer beside train: reward accuracy, win-rate, lm-eval (uses train's callbacks)
    "prefzoo.integrations": 15,  # other trainers (TRL) around prefzoo's losses and gather
    "prefzoo.cli": 16,
    "prefzoo.__main__": 17,
}


def module_files(root: Path = PACKAGE) -> dict[str, Path]:
    """Dotted module name -> file, for every module of the package under ``root``."""
    out = {}
    for path in root.rglob("*.py"):
        parts = list(path.relative_to(root.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        out[".".join(parts)] = path
    return out


def import_graph(files: dict[str, Path]) -> dict[str, set[str]]:
    """module -> the package's modules it imports (``from pkg import submodule`` is an arrow to the submodule)."""
    graph: dict[str, set[str]] = {}
    for mod, path in files.items():
        targets: set[str] = set()
        is_pkg = path.name == "__init__.py"
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                targets |= {a.name for a in node.names if a.name in files}
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:  # relative: resolve against this module's package
                    pkg = mod.split(".") if is_pkg else mod.split(".")[:-1]
                    pkg = pkg[: len(pkg) - node.level + 1]
                    base = ".".join([*pkg, base] if base else pkg)
                if base not in files:
                    continue
                subs = {f"{base}.{a.name}" for a in node.names} & files.keys()
                targets |= subs
                if len(subs) < len(node.names):  # a name defined in ``base`` itself
                    targets.add(base)
        targets.discard(mod)
        graph[mod] = targets
    return graph


def layer(mod: str) -> str:
    """The entry of LAYERS that ``mod`` belongs to (its longest prefix)."""
    return max((k for k in LAYERS if mod == k or mod.startswith(k + ".")), key=len)


def upward_arrows(graph: dict[str, set[str]]) -> list[str]:
    bad = []
    for mod, targets in sorted(graph.items()):
        for t in sorted(targets):
            a, b = layer(mod), layer(t)
            if a != b and LAYERS[b] >= LAYERS[a]:
                bad.append(f"{mod} -> {t} ({a} is layer {LAYERS[a]}, {b} is layer {LAYERS[b]})")
    return bad


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                found.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


@pytest.fixture(scope="module")
def graph() -> dict[str, set[str]]:
    return import_graph(module_files())


def test_every_module_has_a_layer(graph) -> None:
    assert all(any(m == k or m.startswith(k + ".") for k in LAYERS) for m in graph)
    assert {"prefzoo.registry", "prefzoo.losses.combine", "prefzoo.data.formats"} <= graph.keys()


def test_no_import_cycles(graph) -> None:
    assert cycles(graph) == []


def test_imports_point_down(graph) -> None:
    assert upward_arrows(graph) == []


def test_the_checks_see_a_cycle_and_an_upward_arrow(tmp_path) -> None:
    """The walker on a small fake package: a lazy import cycle and a data -> eval arrow are both reported."""
    pkg = tmp_path / "prefzoo"
    for sub in ("data", "eval"):
        (pkg / sub).mkdir(parents=True)
        (pkg / sub / "__init__.py").write_text("")
    (pkg / "__init__.py").write_text("")
    (pkg / "registry.py").write_text("from prefzoo.losses import combine\n")
    (pkg / "losses").mkdir()
    (pkg / "losses" / "__init__.py").write_text("")
    (pkg / "losses" / "combine.py").write_text("def f():\n    from prefzoo import registry\n")
    (pkg / "data" / "default.py").write_text("def g():\n    from prefzoo.eval.judges import get_judge\n")
    (pkg / "eval" / "judges.py").write_text("from .. import registry\n")
    g = import_graph(module_files(pkg))
    assert cycles(g) == [["prefzoo.losses.combine", "prefzoo.registry"]]
    assert upward_arrows(g) == [
        "prefzoo.data.default -> prefzoo.eval.judges (prefzoo.data is layer 8, prefzoo.eval is layer 14)",
        "prefzoo.losses.combine -> prefzoo.registry (prefzoo.losses is layer 4, prefzoo.registry is layer 6)",
    ]
    assert g["prefzoo.eval.judges"] == {"prefzoo.registry"}  # relative imports resolve


# packages whose ``__init__`` is their whole public surface: no other package imports their modules
SURFACE_ONLY = ("prefzoo.model", "prefzoo.judge")


@pytest.mark.parametrize("package", SURFACE_ONLY)
def test_other_packages_use_only_the_public_surface(graph, package) -> None:
    """Other packages use the model engine and the judges through ``prefzoo.model`` / ``prefzoo.judge``."""
    bad = sorted(
        f"{mod} -> {t}"
        for mod, targets in graph.items()
        if mod != package and not mod.startswith(package + ".")
        for t in targets
        if t.startswith(package + ".")
    )
    assert bad == []


def test_a_package_on_the_same_layer_is_an_upward_arrow(tmp_path) -> None:
    """Strict layering: eval -> train is fine (14 over 13), train -> eval is not, nor two packages on one layer."""
    graph = {"prefzoo.train.setup": {"prefzoo.eval.reward"}, "prefzoo.eval.reward": {"prefzoo.train.batch"}}
    assert upward_arrows(graph) == [
        "prefzoo.train.setup -> prefzoo.eval.reward (prefzoo.train is layer 13, prefzoo.eval is layer 14)"
    ]
    assert len(set(LAYERS.values())) == len(LAYERS)  # one package a layer


def test_the_model_package_imports_neither_the_trainer_nor_accelerate() -> None:
    """Below train and eval: no ``prefzoo.train``/``prefzoo.eval`` import and no accelerate, lazy ones included."""
    bad = []
    for path in (PACKAGE / "model").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else []
            if isinstance(node, ast.ImportFrom) and node.module:
                names = [node.module]
            bad += [f"{path.name}: {n}" for n in names if n.split(".")[0] == "accelerate" or n.startswith(
                ("prefzoo.train", "prefzoo.eval", "prefzoo.cli", "prefzoo.integrations"))]
    assert bad == []
