"""Root conftest of the suite."""

from __future__ import annotations

# ---- hermetic: the suite passes however and wherever it is started (docs/reliability.md, "A hermetic suite") ----
import atexit
import os
import shutil
import tempfile

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
