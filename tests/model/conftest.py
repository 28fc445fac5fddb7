"""Model-engine tests need transformers; the tiny model and pairs come from tests/conftest.py."""

from __future__ import annotations

import pytest

pytest.importorskip("transformers")
