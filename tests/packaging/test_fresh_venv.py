"""Installing prefzoo leaves other projects' pytest alone: fresh venvs with ``[train]`` + pytest and with ``[all]``.

Each venv is built by uv (the ``plugins`` tox env has it) from the caller's cache and find-links (the local CPU
torch wheel), then a project that knows nothing of prefzoo runs its own one-line test in another folder.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
UV = shutil.which("uv")
pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(UV is None, reason="needs uv (the plugins tox env installs it) to build fresh venvs"),
]


def _fresh_venv(tmp_path: Path, requirements: list[str]) -> Path:
    """A new venv with torch pinned and ``requirements`` installed; returns its ``bin/``."""
    venv = tmp_path / "venv"
    subprocess.run([UV, "venv", "-q", "-p", sys.executable, str(venv)], check=True, timeout=120)
    env = {**os.environ, "VIRTUAL_ENV": str(venv)}
    subprocess.run(
        [UV, "pip", "install", "-q", "torch==2.13.0", *requirements], env=env, check=True, timeout=900, cwd=tmp_path
    )
    return venv / "bin"


def _foreign_project(tmp_path: Path, body: str) -> Path:
    project = tmp_path / "someone-elses-project"
    project.mkdir()
    (project / "test_theirs.py").write_text(body)
    return project


def _pytest(bin_dir: Path, project: Path, *args: str, **extra_env: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTEST_", "HYPOTHESIS_"))} | extra_env
    return subprocess.run(
        [str(bin_dir / "pytest"), "-q", "-p", "no:cacheprovider", *args],
        cwd=project, env=env, capture_output=True, text=True, timeout=300,
    )


def test_train_extra_without_hypothesis_keeps_a_foreign_pytest_working(tmp_path):
    bin_dir = _fresh_venv(tmp_path, ["-e", f"{ROOT}[train]", "pytest"])
    probe = subprocess.run([str(bin_dir / "python"), "-c", "import hypothesis"], capture_output=True, text=True)
    assert probe.returncode != 0, "this venv was meant to be without Hypothesis"
    project = _foreign_project(tmp_path, "def test_one():\n    assert 1 + 1 == 2\n")
    result = _pytest(bin_dir, project)
    assert result.returncode == 0 and "1 passed" in result.stdout, result.stdout + result.stderr


def test_all_extra_keeps_a_foreign_sessions_settings_and_offers_prefzoo_profiles(tmp_path):
    bin_dir = _fresh_venv(tmp_path, ["-e", f"{ROOT}[all]"])
    project = _foreign_project(
        tmp_path,
        "import os\nfrom hypothesis import settings\n\n"
        "def test_profile():\n"
        "    name = settings.get_current_profile_name()\n"
        "    assert name == os.environ['WANT'] if 'WANT' in os.environ else not name.startswith('prefzoo-')\n",
    )
    plain = _pytest(bin_dir, project)  # Hypothesis' own choice: default, or ci where it detects CI
    assert plain.returncode == 0 and "1 passed" in plain.stdout, plain.stdout + plain.stderr
    asked = _pytest(bin_dir, project, "--hypothesis-profile", "prefzoo-ci", WANT="prefzoo-ci")
    assert asked.returncode == 0 and "1 passed" in asked.stdout, asked.stdout + asked.stderr
