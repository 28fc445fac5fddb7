"""``import prefzoo`` loads nothing heavy, so ``prefzoo train`` prints its first lines before torch loads (issue 16:
on a first run nothing is byte-compiled yet, README command 1 installs with ``--no-compile``, and importing torch
is the first slow step)."""

from __future__ import annotations

import ast
import importlib
import subprocess
import sys
from pathlib import Path

import pytest

import prefzoo

INIT = Path(prefzoo.__file__)

# torch (and what needs it) cannot be imported in this child: whatever prints before the ImportError printed first
_CHILD = """
import sys
sys.modules["torch"] = None
import prefzoo
from prefzoo.cli.main import main
try:
    main(["train", "--threads", "1", "--loss", "mmpo"])
except ImportError as e:
    print("ImportError:", e)
"""


def test_prefzoo_train_prints_its_first_lines_before_torch_loads():
    proc = subprocess.run([sys.executable, "-c", _CHILD], capture_output=True, text=True, timeout=120)
    lines = proc.stdout.splitlines()
    assert lines[:2] == [
        "prefzoo train: 1 CPU thread (--threads)",
        "prefzoo train: loading torch, transformers, datasets and accelerate",
    ], proc.stdout + proc.stderr[-2000:]
    assert lines[2].startswith("ImportError:") and "torch" in lines[2], proc.stdout


@pytest.mark.parametrize("name", ["prefzoo.model", "prefzoo.judge"])
def test_the_engine_packages_are_lazy_and_load_from_the_modules_that_type_checkers_see(name):
    package = importlib.import_module(name)
    _assert_lazy_names_match(package, _type_checked_names(package), set())


def _type_checked_names(package) -> dict[str, str]:
    """name -> module of the ``if TYPE_CHECKING:`` imports of a lazy package's ``__init__``."""
    tree = ast.parse(Path(package.__file__).read_text(encoding="utf-8"))
    guard = next(n for n in tree.body if isinstance(n, ast.If) and ast.unparse(n.test) == "TYPE_CHECKING")
    return {a.name: imp.module for imp in guard.body if isinstance(imp, ast.ImportFrom) for a in imp.names}


def _assert_lazy_names_match(package, seen: dict[str, str], extra: set[str]) -> None:
    assert seen == package._LAZY
    assert set(package.__all__) == {*seen, *extra}
    for name in package.__all__:
        if name not in extra:
            assert getattr(package, name) is getattr(sys.modules[seen[name]], name), name


def test_every_public_name_is_lazy_and_loads_from_the_module_that_type_checkers_see():
    seen = _type_checked_names(prefzoo)
    seen["sequence_logps"] = "prefzoo.model"  # not in that block: an import of the model layer points up
    _assert_lazy_names_match(prefzoo, seen, {"__version__"})


def test_the_testing_kit_is_lazy_and_loads_from_the_module_that_type_checkers_see():
    import prefzoo.testing

    _assert_lazy_names_match(prefzoo.testing, _type_checked_names(prefzoo.testing), set())


_KIT_CHILD = """
import sys
import prefzoo.testing, prefzoo.testing.pytest_plugin
heavy = sorted(m for m in ("torch", "hypothesis", "transformers", "numpy") if m in sys.modules)
print(heavy)
"""


def test_the_pytest_plugin_and_the_kit_package_import_nothing_heavy():
    """Every pytest session where prefzoo is installed imports the plugin: it must not load torch or Hypothesis."""
    proc = subprocess.run([sys.executable, "-c", _KIT_CHILD], capture_output=True, text=True, timeout=120)
    assert proc.stdout.strip() == "[]", proc.stdout + proc.stderr[-2000:]


def test_the_metadata_declares_an_spdx_license_expression_and_ships_the_license_file(tmp_path):
    """PEP 639: ``license`` is an SPDX expression and ``license-files`` names the text (setuptools drops the table
    form ``license = {text = ...}`` after 2027-02-18).  Built here from pyproject.toml, warnings as errors."""
    import textwrap

    script = textwrap.dedent(f"""
        import sys, warnings
        warnings.simplefilter("error")
        from setuptools import build_meta
        print(build_meta.prepare_metadata_for_build_wheel({str(tmp_path)!r}))
    """)
    root = INIT.parents[1]
    proc = subprocess.run([sys.executable, "-c", script], cwd=root, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    dist_info = tmp_path / proc.stdout.strip().splitlines()[-1]
    metadata = (dist_info / "METADATA").read_text(encoding="utf-8")
    assert "License-Expression: Apache-2.0" in metadata.splitlines(), metadata[:1500]
    assert "License-File: LICENSE" in metadata.splitlines(), metadata[:1500]
    assert (root / "LICENSE").read_text(encoding="utf-8").lstrip().startswith("Apache License")


def _extra_requirements(extras: dict[str, list[str]], name: str) -> set[str]:
    """The package names ``prefzoo[name]`` installs, its ``prefzoo[...]`` references expanded."""
    import re

    out: set[str] = set()
    for req in extras[name]:
        if req.startswith("prefzoo["):
            for sub in req[len("prefzoo[") : req.index("]")].split(","):
                out |= _extra_requirements(extras, sub.strip())
        else:
            out.add(re.split(r"[<>=!\[; ]", req, maxsplit=1)[0].lower())
    return out


def test_the_all_extra_installs_the_tensorboard_tracker():
    """``--report-to tensorboard`` is documented; ``pip install 'prefzoo[all]'`` must make it work."""
    import tomllib

    extras = tomllib.loads((INIT.parents[1] / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    installed = _extra_requirements(extras, "all")
    assert {"tensorboard", "transformers", "deepspeed", "bitsandbytes", "lm-eval", "trl"} <= installed
