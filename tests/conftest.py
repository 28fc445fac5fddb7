"""Session set-up of prefzoo's own tests: one thread, an offline hub, the Hypothesis profile, shared tiny fixtures.

The Hypothesis profile is chosen here, not by the ``prefzoo`` pytest plugin (which only registers profiles, so
projects that merely have prefzoo installed keep their settings): ``--hypothesis-profile NAME`` wins, else
``HYPOTHESIS_PROFILE`` (tox sets ``ci``), else ``dev``.
"""

from __future__ import annotations

import atexit
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

import pytest

# ---- hermetic: the suite passes however and wherever it is started (docs/reliability.md, "A hermetic suite") ----
HERMETIC_CACHES = ("PREFZOO_CACHE", "HF_HOME", "TORCH_EXTENSIONS_DIR")  # everything the suite may write to a cache


def _private_caches() -> None:
    """A cache the run was not pointed at lives in one temp folder per session, never below ``$HOME``.

    ``$HOME`` may be read-only (CI sandboxes) and a second copy of the suite may be using its caches at the same
    time.  Runs that set these variables (tox sets them to ``.tox/.cache``) keep their cache between sessions.
    Set here, at conftest import, before any test imports ``datasets``/``huggingface_hub`` (they read ``HF_HOME``
    once); subprocesses the tests start inherit them.
    """
    missing = [name for name in HERMETIC_CACHES if not os.environ.get(name)]
    if not missing:
        return
    root = tempfile.mkdtemp(prefix="prefzoo-tests-cache-")
    atexit.register(shutil.rmtree, root, ignore_errors=True)
    for name in missing:
        os.environ[name] = os.path.join(root, name.lower())


_private_caches()
# ---- end hermetic ----

pytest_plugins = ["pytester"]  # tests/testing/test_pytest_plugin.py runs a foreign project's session

os.environ.setdefault("OMP_NUM_THREADS", "1")  # PLATFORM.md: forked/threaded tests deadlock or crawl otherwise
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")


def _select_hypothesis_profile() -> None:
    try:
        from hypothesis import settings
    except ImportError:
        return
    from prefzoo.testing.pytest_plugin import register_profiles

    register_profiles(prefix="")  # dev, ci, thorough, mutation: the names tox.ini and the docs use, this session only
    settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE") or "dev")  # Hypothesis' plugin applies the flag later


_select_hypothesis_profile()


@pytest.fixture(scope="session")
def char_tokenizer() -> Any:
    """The trainer tests' character tokenizer (tests/support/tiny.py)."""
    pytest.importorskip("transformers")
    from tests.support.tiny import build_tokenizer

    return build_tokenizer()


@pytest.fixture(scope="session")
def tiny_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A save_pretrained folder with the tests' tiny Llama and tokenizer, built once per session."""
    pytest.importorskip("transformers")
    import torch

    from tests.support.tiny import make_model_dir

    torch.set_num_threads(1)
    return make_model_dir(tmp_path_factory.mktemp("model"))


@pytest.fixture(scope="session")
def pairs_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """64 preference pairs as jsonl."""
    from tests.support.tiny import make_pairs, write_jsonl

    return write_jsonl(tmp_path_factory.mktemp("data") / "pairs.jsonl", make_pairs(64))
