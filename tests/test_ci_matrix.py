"""Every test module runs in some env of CI's matrix (tox.ini's ``env_list``): a module no env names never runs.

``tests/modifiers`` (each modifier against TRL's code and the papers) and the two modules at the top of ``tests/``
(the import layering, the light ``import prefzoo``) were in no env's command until this check found them.
"""

from __future__ import annotations

import configparser
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _expand(name: str) -> list[str]:
    """tox's brace factors: ``props-{fp64,fp32}`` is ``props-fp64`` and ``props-fp32``."""
    m = re.search(r"\{([^}]*)\}", name)
    if m is None:
        return [name]
    return [e for alt in m.group(1).split(",") for e in _expand(name[: m.start()] + alt.strip() + name[m.end() :])]


def ci_test_paths(tox_ini: Path) -> set[str]:
    """The ``tests/...`` paths in the commands of every env that ``env_list`` runs (node ids cut at ``::``)."""
    cfg = configparser.ConfigParser(interpolation=None)
    cfg.read(tox_ini, encoding="utf-8")
    names = re.findall(r"[^,\s{]+(?:\{[^}]*\}[^,\s{]*)*", cfg["tox"]["env_list"])  # commas inside braces stay
    env_list = {e for name in names for e in _expand(name)}
    paths: set[str] = set()
    for section in cfg.sections():
        if section.startswith("testenv:") and set(_expand(section.split(":", 1)[1])) & env_list:
            commands = cfg[section].get("commands", "")
            paths.update(p.rstrip("/") for p in re.findall(r"(?<![\w/.])(tests/[\w./-]*[\w/])", commands))
    return paths


def orphans(root: Path, paths: set[str]) -> list[str]:
    modules = sorted(p.relative_to(root).as_posix() for p in (root / "tests").rglob("test_*.py"))
    return [m for m in modules if not any(m == p or m.startswith(p + "/") for p in paths)]


def test_every_test_module_is_run_by_an_env_of_the_ci_matrix():
    missing = orphans(ROOT, ci_test_paths(ROOT / "tox.ini"))
    assert not missing, f"no env in tox.ini's env_list runs {missing}: add them to an env's commands"


def test_an_env_outside_env_list_does_not_count(tmp_path):
    """The mutation env names tests too, but CI never runs it: its paths must not hide an orphan."""
    (tmp_path / "tests" / "a").mkdir(parents=True)
    (tmp_path / "tests" / "a" / "test_x.py").write_text("")
    (tmp_path / "tests" / "test_top.py").write_text("")
    (tmp_path / "tox.ini").write_text(
        "[tox]\nenv_list = unit, props-{fp64}\n"
        "[testenv:unit]\ncommands = pytest -q tests/test_top.py::test_one {posargs}\n"
        "[testenv:props-{fp64,fp32}]\ncommands =\n    fp64: pytest tests/b\n"
        "[testenv:mutation]\ncommands = pytest tests/a\n"
    )
    paths = ci_test_paths(tmp_path / "tox.ini")
    assert paths == {"tests/test_top.py", "tests/b"}
    assert orphans(tmp_path, paths) == ["tests/a/test_x.py"]
