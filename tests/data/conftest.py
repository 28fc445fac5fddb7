"""Data tests use the tiny character tokenizer of the trainer tests."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
sys.path.insert(0, str(Path(__file__).parents[1] / "train"))

pytest.importorskip("datasets")
pytest.importorskip("transformers")


@pytest.fixture(scope="session")
def tokenizer():
    from tiny import build_tokenizer

    return build_tokenizer()
