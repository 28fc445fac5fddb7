"""Shared fixtures: a tiny model folder and a jsonl of pairs, built once per session."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
sys.path.insert(0, str(Path(__file__).parent))

pytest.importorskip("transformers")
pytest.importorskip("accelerate")


@pytest.fixture(scope="session")
def tiny_dir(tmp_path_factory) -> Path:
    import torch

    torch.set_num_threads(1)
    from tiny import make_model_dir

    return make_model_dir(tmp_path_factory.mktemp("model"))


@pytest.fixture(scope="session")
def pairs_file(tmp_path_factory) -> Path:
    from tiny import make_pairs, write_jsonl

    return write_jsonl(tmp_path_factory.mktemp("data") / "pairs.jsonl", make_pairs(64))
