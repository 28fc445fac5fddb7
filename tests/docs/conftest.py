"""The built site for the docs tests: tox's ``docs`` env builds it once (``mkdocs build --strict``) and points
``PREFZOO_SITE_DIR`` at it; without that variable the first test that needs it builds it into a temporary folder."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="session")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    given = os.environ.get("PREFZOO_SITE_DIR")
    if given:
        return Path(given)
    pytest.importorskip("mkdocs")
    out = tmp_path_factory.mktemp("site")
    subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(out)], cwd=ROOT,
                   check=True, capture_output=True, env={**os.environ, "NO_MKDOCS_2_WARNING": "1"})
    return out
