"""The fuzz tests build a tiny character tokenizer (tests/train/tiny.py) once."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
sys.path.insert(0, str(Path(__file__).parents[1] / "train"))


@pytest.fixture(scope="session")
def char_tokenizer():
    pytest.importorskip("transformers")
    from tiny import build_tokenizer

    return build_tokenizer()
