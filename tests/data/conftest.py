"""Data tests use the trainer tests' character tokenizer (tests/support/tiny.py)."""

from __future__ import annotations

from typing import Any

import pytest

pytest.importorskip("datasets")
pytest.importorskip("transformers")


@pytest.fixture(scope="session")
def tokenizer(char_tokenizer: Any) -> Any:
    return char_tokenizer
