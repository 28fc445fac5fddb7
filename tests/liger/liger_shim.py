"""pytest plugin: Liger-Kernel's own chunked-loss tests with Liger's five preference-loss classes replaced by
prefzoo's (:mod:`prefzoo.nn.liger`), the way a Liger user switches with one import.

``PREFZOO_LIGER_SIDE=liger`` leaves Liger's classes in place (the same tests on Liger itself).  Either way
``torch.compile`` is the identity, so Liger's reference functions run eagerly (compiling each test's function takes
longer on CPU than the test).  Tests that prefzoo is known to miss are marked xfail (strict) with the evidence
(:data:`KNOWN`).
"""

from __future__ import annotations

import os
from typing import Any

import pytest
import torch

CLASSES = {
    "dpo_loss": "LigerFusedLinearDPOLoss",
    "simpo_loss": "LigerFusedLinearSimPOLoss",
    "orpo_loss": "LigerFusedLinearORPOLoss",
    "cpo_loss": "LigerFusedLinearCPOLoss",
    "kto_loss": "LigerFusedLinearKTOLoss",
}

# node-id fragments (all present) → why prefzoo misses the test, against float64 (docs/results/performance-nn.md)
KNOWN: dict[tuple[str, ...], str] = {
    ("test_correctness_functional_apo_loss_types[sppo_hard-", "-3-47-31-123]"): (
        "Liger's float32 result is the less accurate side: the test compares prefzoo with Liger's own functional "
        "path, not with the math. sppo_hard squares margins of log-probs summed over 47 tokens (multipliers ~30-60 "
        "on each row's gradient); against float64 on the test's inputs (float32, bias-free head) the input "
        "gradient's median absolute error is Liger 1.7e-5, prefzoo 7e-6, and the weight gradient misses the test's "
        "own tolerance in 18 entries for Liger, 2 for prefzoo; in bfloat16 Liger misses it in 41-47 input-gradient "
        "entries, prefzoo in 29-44. The gap between the two is Liger's rounding (docs/results/performance-nn.md)"
    ),
}


def _eager(model: Any = None, **_: Any) -> Any:
    return model if model is not None else (lambda f: f)


def pytest_configure(config: pytest.Config) -> None:
    import importlib

    import liger_kernel.chunked_loss as chunked

    torch.compile = _eager  # type: ignore[assignment]
    if os.environ.get("PREFZOO_LIGER_SIDE", "prefzoo") == "liger":
        return
    import prefzoo.nn as ours

    for module, name in CLASSES.items():
        setattr(chunked, name, getattr(ours, name))
        setattr(importlib.import_module(f"liger_kernel.chunked_loss.{module}"), name, getattr(ours, name))


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if os.environ.get("PREFZOO_LIGER_SIDE", "prefzoo") == "liger":
        return
    for item in items:
        for fragments, reason in KNOWN.items():
            if all(f in item.nodeid for f in fragments):
                item.add_marker(pytest.mark.xfail(reason=reason, strict=True))
