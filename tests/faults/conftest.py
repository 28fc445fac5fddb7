"""Fault tests reuse the trainer tests' tiny model and pairs (tests/train/tiny.py, helpers.py)."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
TRAIN_TESTS = Path(__file__).parents[1] / "train"
sys.path.insert(0, str(TRAIN_TESTS))
sys.path.insert(0, str(Path(__file__).parent))


@pytest.fixture(scope="session")
def tiny_dir(tmp_path_factory) -> Path:
    pytest.importorskip("transformers")
    import torch

    torch.set_num_threads(1)
    from tiny import make_model_dir

    return make_model_dir(tmp_path_factory.mktemp("model"))


@pytest.fixture(scope="session")
def pairs_file(tmp_path_factory) -> Path:
    from tiny import make_pairs, write_jsonl

    return write_jsonl(tmp_path_factory.mktemp("data") / "pairs.jsonl", make_pairs(64))


@pytest.fixture
def faults(monkeypatch):
    """Set PREFZOO_FAULTS (and the sleep) for an in-process run."""

    def set_faults(spec: str, sleep: float | None = None) -> None:
        monkeypatch.setenv("PREFZOO_FAULTS", spec)
        if sleep is not None:
            monkeypatch.setenv("PREFZOO_FAULT_SLEEP", str(sleep))

    monkeypatch.delenv("PREFZOO_FAULTS", raising=False)
    return set_faults
