"""The whole architecture sweep (tox env ``archs``): every causal-LM model type of transformers, built tiny.

Each one either passes (every prefzoo path within 1e-4 nats per token of the model's own logits; prompt sharing
equal or refused with its reason), is skipped with the reason it cannot be built tiny, or, where the fast path
cannot reproduce the architecture, is an expected failure that the run-start self-check catches.  A failure the
self-check misses is a silent wrong result and fails the sweep.  docs/architectures.md records the counts.
"""

from __future__ import annotations

import os

import pytest

pytest.importorskip("transformers")
os.environ.setdefault("OMP_NUM_THREADS", "1")

from prefzoo.testing.architectures import causal_lm_types, check_architecture

PASS_FLOOR = 123  # architectures passing in transformers 5.23 (docs/architectures.md): a number to keep raising
# the fast path cannot reproduce these (docs/architectures.md says why); the self-check stops their runs
KNOWN_FAIL = frozenset({"electra", "llama4_text", "modernbert-decoder", "prophetnet"})
RESULTS: dict[str, str] = {}


@pytest.mark.parametrize("model_type", causal_lm_types())
def test_architecture(model_type):
    res = check_architecture(model_type)
    RESULTS[model_type] = res.status
    if res.status == "skip":
        pytest.skip(res.reason)
    if res.status == "fail":
        assert res.caught, f"{model_type}: silent wrong log-probs: {res.reason} {res.errors}"
        assert model_type in KNOWN_FAIL, f"{model_type} no longer passes (the self-check would stop it): {res}"
        pytest.xfail(f"guarded by the self-check: {res.reason}")
    assert res.status == "pass", res


def test_pass_count_does_not_drop():
    if len(RESULTS) < len(causal_lm_types()):
        pytest.skip("only part of the sweep ran")
    passed = sum(s == "pass" for s in RESULTS.values())
    assert passed >= PASS_FLOOR, f"{passed} architectures pass, fewer than the recorded {PASS_FLOOR}"
