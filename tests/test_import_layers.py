"""The package's imports point down (cli → integrations → eval → train → scoring → callbacks → testing → judge → nn
→ prefzoo's __init__ → model → data → registry → losses → spec → types → private helpers).

No cycles. Every ``import`` in ``prefzoo/`` is read with ``ast`` (function-level and ``TYPE_CHECKING`` imports
count: a lazy import is still an arrow), and so is every string constant that is a module path,
``"prefzoo.pkg.module"`` or ``"prefzoo.pkg.module:Name"`` (what importlib, an entry point or a registry table
resolves later); nothing is imported, so the test needs no optional dependency.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "prefzoo"

# rank of each layer, one package a layer: a module may import its own package, or a package of a lower rank
LAYERS: dict[str, int] = {
    "prefzoo._safefs": 0,  # the package's private helpers, below everything: no-follow file access, ...
    "prefzoo._filelock": 1,
    "prefzoo._attrs": 2,
    "prefzoo._thirdparty": 3,  # every use of another library's private names (uses _attrs)
    "prefzoo._dist": 4,  # the launcher's rank, local rank and processes per node, from the environment
    "prefzoo._lazy": 5,
    "prefzoo._secrets": 6,
    "prefzoo.types": 7,
    "prefzoo.errors": 8,
    "prefzoo.spec": 9,
    "prefzoo.hookspecs": 10,
    "prefzoo.losses": 11,
    "prefzoo.modifiers": 12,  # pure functions of tensors like losses (spec, types, hookspecs); the registry sits above
    "prefzoo.registry": 13,
    "prefzoo.data": 14,
    "prefzoo.model": 15,  # loading, architecture adapters, sequence log-probs and their fast paths: no trainer
    "prefzoo": 16,  # the package's __init__: re-exports registry, losses, spec, types and (lazily) sequence_logps
    "prefzoo.nn": 17,  # the fused head + any loss as one torch module (model's fused head, the registry): no trainer
    "prefzoo.judge": 18,  # judges, generation engines, scoring: used by online training and by evaluation
    "prefzoo.testing": 19,
    "prefzoo.callbacks": 20,  # the callback API (Callback, RunState): the trainer calls it, evaluation implements it
    "prefzoo.scoring": 21,  # a batch -> the loss's fields, scoring batches, the reference variants, the gather
    "prefzoo.train": 22,
    "prefzoo.eval": 23,  # beside train on scoring and callbacks: reward accuracy, win-rate, lm-eval (no train import)
    "prefzoo.integrations": 24,  # other trainers (TRL) around prefzoo's losses and scoring's gather (no train import)
    "prefzoo.cli": 25,
    "prefzoo.__main__": 26,
}

# a string constant that names a module of the package, optionally ``:Attr``: an import resolved later
MODULE_PATH = re.compile(r"(prefzoo(?:\.[a-z_]+)+)(?::[A-Za-z_][A-Za-z0-9_.]*)?")


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
            if isinstance(node, ast.Constant) and isinstance(node.value, str):
                targets |= _named_module(node.value, files)
            elif isinstance(node, ast.Import):
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


def _named_module(text: str, files: dict[str, Path]) -> set[str]:
    """The module a ``"prefzoo.pkg.module[:Name]"`` string names (the whole string is the path): its longest
    prefix that is a module of the package, so ``"prefzoo.eval.callbacks.WinRateCallback"`` names eval.callbacks."""
    match = MODULE_PATH.fullmatch(text.strip())
    if match is None:
        return set()
    parts = match.group(1).split(".")
    for n in range(len(parts), 1, -1):
        if ".".join(parts[:n]) in files:
            return {".".join(parts[:n])}
    return set()


def _arrow(src: str, dst: str) -> str:
    """How :func:`upward_arrows` reports ``src -> dst``, with the layers' ranks read from LAYERS."""
    a, b = layer(src), layer(dst)
    return f"{src} -> {dst} ({a} is layer {LAYERS[a]}, {b} is layer {LAYERS[b]})"


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
        _arrow("prefzoo.data.default", "prefzoo.eval.judges"),
        _arrow("prefzoo.losses.combine", "prefzoo.registry"),
    ]
    assert g["prefzoo.eval.judges"] == {"prefzoo.registry"}  # relative imports resolve


# packages whose ``__init__`` is their whole public surface: no other package imports their modules
SURFACE_ONLY = ("prefzoo.model", "prefzoo.judge", "prefzoo.scoring")


@pytest.mark.parametrize("package", SURFACE_ONLY)
def test_other_packages_use_only_the_public_surface(graph, package) -> None:
    """Other packages use the model engine, the judges and scoring through their ``__init__``."""
    bad = sorted(
        f"{mod} -> {t}"
        for mod, targets in graph.items()
        if mod != package and not mod.startswith(package + ".")
        for t in targets
        if t.startswith(package + ".")
    )
    assert bad == []


def test_a_package_on_the_same_layer_is_an_upward_arrow(tmp_path) -> None:
    """Strict layering: eval -> train passes by rank (21 over 20), train -> eval does not, nor two on one layer."""
    graph = {"prefzoo.train.setup": {"prefzoo.eval.reward"}, "prefzoo.eval.reward": {"prefzoo.train.step"}}
    assert upward_arrows(graph) == [
        _arrow("prefzoo.train.setup", "prefzoo.eval.reward")
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


def test_a_module_path_string_is_an_arrow(tmp_path) -> None:
    """``"prefzoo.pkg.module:Name"`` strings (a registry table, an importlib target) are arrows like imports, so a
    name table pointing up, or closing a circle, fails; prose that mentions a module in passing is no arrow."""
    pkg = tmp_path / "prefzoo"
    for sub in ("train", "eval", "modifiers"):
        (pkg / sub).mkdir(parents=True)
        (pkg / sub / "__init__.py").write_text("")
    (pkg / "__init__.py").write_text("")
    (pkg / "train" / "loading.py").write_text('BUILTIN = {"win-rate": "prefzoo.eval.callbacks:WinRateCallback"}\n')
    (pkg / "eval" / "callbacks.py").write_text("from prefzoo.train.loading import BUILTIN\n")
    (pkg / "modifiers" / "trdpo.py").write_text(
        '"""Its callback lives in prefzoo.train.loading (prose)."""\nCALLBACK = "prefzoo.train.loading"\n'
    )
    g = import_graph(module_files(pkg))
    assert g["prefzoo.train.loading"] == {"prefzoo.eval.callbacks"}
    assert g["prefzoo.modifiers.trdpo"] == {"prefzoo.train.loading"}
    assert cycles(g) == [["prefzoo.eval.callbacks", "prefzoo.train.loading"]]
    assert upward_arrows(g) == [
        _arrow("prefzoo.modifiers.trdpo", "prefzoo.train.loading"),
        _arrow("prefzoo.train.loading", "prefzoo.eval.callbacks"),
    ]


@pytest.mark.parametrize("package", ["prefzoo.eval", "prefzoo.integrations", "prefzoo.modifiers"])
def test_beside_the_trainer_nothing_names_it(graph, package) -> None:
    """Evaluation, the integrations and the modifiers stand beside the trainer (on scoring and the callback API):
    no import of ``prefzoo.train``, no module-path string naming it, not even in prose."""
    arrows = sorted(f"{m} -> {t}" for m, ts in graph.items() if layer(m) == package for t in ts
                    if layer(t) == "prefzoo.train")  # fmt: skip
    root = PACKAGE.joinpath(*package.split(".")[1:])
    named = sorted(str(p.relative_to(PACKAGE)) for p in root.rglob("*.py") if "prefzoo.train" in p.read_text())
    assert (arrows, named) == ([], [])
