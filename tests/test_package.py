"""``import prefzoo`` loads nothing heavy, so ``prefzoo train`` prints its first lines before torch loads (issue 16:
on a first run nothing is byte-compiled yet, README command 1 installs with ``--no-compile``, and importing torch
is the first slow step)."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

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


def test_every_public_name_is_lazy_and_loads_from_the_module_that_type_checkers_see():
    tree = ast.parse(INIT.read_text(encoding="utf-8"))
    guard = next(n for n in tree.body if isinstance(n, ast.If) and ast.unparse(n.test) == "TYPE_CHECKING")
    seen = {a.name: imp.module for imp in guard.body if isinstance(imp, ast.ImportFrom) for a in imp.names}
    seen["sequence_logps"] = "prefzoo.train.logps"  # not in that block: an import of the train layer points up
    assert seen == prefzoo._LAZY
    assert set(prefzoo.__all__) == {*seen, "__version__"}
    for name in prefzoo.__all__:
        value = getattr(prefzoo, name)
        if name != "__version__":
            assert value is getattr(sys.modules[seen[name]], name), name
