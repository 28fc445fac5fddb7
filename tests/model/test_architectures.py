"""prefzoo's log-probs equal each architecture's own ``forward(...).logits`` (the fast subset of the sweep).

The whole sweep over transformers' causal-LM model types runs in the ``archs`` tox env (tests/archs).  Here: every
logit transform (Gemma 2/3 soft-capping, Cohere ×, Granite ÷), sliding windows (Mistral, Qwen2, Phi-3, Starcoder2,
alternating local/global Gemma 2/3, Cohere 2) under prompt sharing, mixture-of-experts models, and classic layouts.
"""

from __future__ import annotations

import pytest
import torch

from prefzoo.testing.architectures import FAST_SUBSET, TOKEN_TOL, build_tiny, check_architecture, tiny_pairs

pytest.importorskip("transformers")


@pytest.mark.parametrize("model_type", FAST_SUBSET)
def test_fast_paths_equal_the_models_logits(model_type):
    res = check_architecture(model_type)
    assert res.status == "pass", f"{model_type}: {res.reason} {res.errors}"
    base = {"fused", "chunked", "token", "entropy", "chunked-entropy", "shared"}
    assert base <= set(res.errors) <= base | {"split", "packed"}
    assert max(res.errors.values()) <= TOKEN_TOL * 10, res.errors
    # the shared layout under SDPA with its attention split in two causal parts (fastpath_split), on padded rows
    # and packed into one padding-free row: compared on the types without windows or soft-capped attention, never
    # on the windowed ones
    if model_type in ("llama", "gemma", "cohere", "granite"):
        assert {"split", "packed"} <= set(res.errors)
    if model_type in ("mistral", "qwen2", "gemma2"):
        assert not {"split", "packed"} & set(res.errors)


def test_the_subset_covers_every_transform_and_window():
    from prefzoo.model.arch import attention_layer_types, logit_transform

    seen_scale, seen_cap, seen_mixed, seen_window = set(), set(), set(), set()
    for t in FAST_SUBSET:
        cfg = build_tiny(t).config
        tr = logit_transform(cfg)
        if tr.scale != 1.0:
            seen_scale.add(t)
        if tr.softcap is not None:
            seen_cap.add(t)
        types = set(attention_layer_types(cfg))
        if "sliding_attention" in types:
            seen_window.add(t)
        if len(types) > 1:
            seen_mixed.add(t)
    assert {"gemma2", "gemma3_text"} <= seen_cap
    assert {"cohere", "granite"} <= seen_scale
    assert {"mistral", "qwen2"} <= seen_window
    assert {"gemma2", "gemma3_text", "qwen2"} <= seen_mixed


@pytest.mark.parametrize(
    ("model_type", "field", "value"),
    [("gemma2", "final_logit_softcapping", 5.0), ("cohere", "logit_scale", 0.25), ("granite", "logits_scaling", 4.0)],
)
def test_without_the_transform_the_logps_are_wrong(model_type, field, value, monkeypatch):
    """The equality above is not vacuous: prefzoo without the transform (as before) is off by far more than 1e-4."""
    from prefzoo.data.collate import PreferenceCollator
    from prefzoo.model import logps as logps_mod
    from prefzoo.model.arch import LogitTransform
    from prefzoo.model.logps import sequence_logps

    model = build_tiny(model_type)
    assert getattr(model.config, field) == value
    b = PreferenceCollator(0)(tiny_pairs(96))
    with torch.no_grad():
        good = sequence_logps(model, b["input_ids"], b["attention_mask"], b["completion_mask"])
        monkeypatch.setattr(logps_mod, "logit_transform", lambda cfg: LogitTransform())
        bad = sequence_logps(model, b["input_ids"], b["attention_mask"], b["completion_mask"])
    assert float((good.logps - bad.logps).abs().max()) > 0.05


@pytest.mark.parametrize("model_type", ["mistral", "qwen2", "gemma3_text"])
def test_without_the_window_the_shared_layout_is_wrong(model_type, monkeypatch):
    """Prompt sharing without the sliding window (the old mask) differs from the plain rows."""
    from prefzoo.data.collate import PreferenceCollator
    from prefzoo.model.fast import prompt as fastpath_prompt
    from prefzoo.model.logps import sequence_logps

    model = build_tiny(model_type)
    plain = PreferenceCollator(0)(tiny_pairs(96))
    shared = PreferenceCollator(0, share_prompt=True)(tiny_pairs(96))
    with torch.no_grad():
        ref = sequence_logps(model, plain["input_ids"], plain["attention_mask"], plain["completion_mask"])
        good = sequence_logps(model, shared["input_ids"], shared["attention_mask"], shared["completion_mask"])
        monkeypatch.setattr(fastpath_prompt, "windowed", lambda allowed, pos, window: allowed)
        bad = sequence_logps(model, shared["input_ids"], shared["attention_mask"], shared["completion_mask"])
    torch.testing.assert_close(good.logps, ref.logps, atol=1e-4, rtol=0)
    assert float((bad.logps - ref.logps).abs().max()) > 1e-3


def test_public_function_takes_a_01_mask_and_imports_lazily():
    import subprocess
    import sys

    from prefzoo import sequence_logps
    from prefzoo.data.collate import PreferenceCollator

    model = build_tiny("gemma2")
    b = PreferenceCollator(0)(tiny_pairs(96))
    with torch.no_grad():
        as_bool = sequence_logps(model, b["input_ids"], b["attention_mask"], b["completion_mask"], token_logps=True)
        as_int = sequence_logps(model, b["input_ids"], b["attention_mask"], b["completion_mask"].long())
    torch.testing.assert_close(as_int.logps, as_bool.logps)
    assert as_bool.logps.shape == (6,) and as_bool.token_logps.shape[0] == 6
    code = "import sys, prefzoo; prefzoo.sequence_logps; assert 'transformers' not in sys.modules, 'transformers'"
    subprocess.run([sys.executable, "-c", code], check=True)
