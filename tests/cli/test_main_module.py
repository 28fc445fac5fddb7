"""`python -m prefzoo.cli.main` (as tests/faults/_run.py runs it) reports errors in one line like `prefzoo`."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest


@pytest.mark.parametrize("module", ["prefzoo", "prefzoo.cli.main"])
def test_cli_error_is_one_line_whichever_module_runs(module: str, tmp_path) -> None:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.run(
        [sys.executable, "-m", module, "inspect", "dpo", "--points", "1"],
        capture_output=True, text=True, env=env, timeout=300, cwd=tmp_path,
    )  # fmt: skip
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr
    assert proc.stderr.strip().splitlines()[-1] == "prefzoo inspect: error: --points must be >= 2 and --min < --max"
