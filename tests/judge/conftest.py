"""The judge tests use the evaluation tests' tiny local models (a random causal LM and reward classifier)."""

from __future__ import annotations

import pytest

pytest.importorskip("transformers")
pytest.importorskip("datasets")

from tests.eval.conftest import causal_dirs, classifier_dir  # noqa: F401  (fixtures, shared)
