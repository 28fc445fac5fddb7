"""The run-start self-check stops a run whose fast-path log-probs differ from the model's own forward, or falls back."""

from __future__ import annotations

import pytest
import torch

from prefzoo.testing.architectures import build_tiny, tiny_pairs

pytest.importorskip("transformers")


def _scaled_llama(factor: float):
    """An architecture nobody told prefzoo about: a Llama whose forward multiplies its logits by ``factor``."""
    from transformers import LlamaForCausalLM

    class ScaledLlama(LlamaForCausalLM):
        def forward(self, *args, **kwargs):
            out = super().forward(*args, **kwargs)
            out.logits = out.logits * factor
            return out

    base = build_tiny("llama")
    model = ScaledLlama(base.config)
    model.load_state_dict(base.state_dict())
    return model.eval()


def _batch(share: bool = False):
    from prefzoo.data.collate import PreferenceCollator

    return PreferenceCollator(0, share_prompt=share)(tiny_pairs(96))


def test_passes_on_a_supported_architecture():
    from prefzoo.model.logps import PolicyLogps
    from prefzoo.model.selfcheck import run_self_check

    lines = []
    for share in (False, True):
        res = run_self_check(PolicyLogps(build_tiny("gemma2")), None, _batch(share), fallback=False, say=lines.append)
        assert res.ok and res.max_error < 1e-4
    assert "passed for gemma2" in lines[0]


def test_an_unknown_logit_transform_stops_the_run_with_one_line():
    from prefzoo.model.logps import PolicyLogps
    from prefzoo.model.selfcheck import LogpsSelfCheckError, run_self_check

    with pytest.raises(LogpsSelfCheckError) as e:
        run_self_check(PolicyLogps(_scaled_llama(3.0)), None, _batch(), fallback=False, say=lambda s: None)
    msg = str(e.value)
    assert "\n" not in msg and "llama (ScaledLlama)" in msg and "--logps-fallback" in msg


def test_fallback_switches_policy_and_reference_to_the_models_forward():
    from prefzoo.model.logps import PolicyLogps
    from prefzoo.model.selfcheck import run_self_check
    from prefzoo.scoring import FrozenReference

    model = _scaled_llama(3.0)
    policy, ref = PolicyLogps(model), FrozenReference(model, 1024)
    lines = []
    res = run_self_check(policy, ref, _batch(True), fallback=True, say=lines.append)
    assert not res.ok and "WARNING" in lines[0]
    assert policy.path == "model" and ref.module.path == "model"
    b = _batch()
    with torch.no_grad():
        logits = model(input_ids=b["input_ids"], attention_mask=b["attention_mask"]).logits.float()[:, :-1]
        want = (
            torch.log_softmax(logits, -1).gather(-1, b["input_ids"][:, 1:, None])[..., 0] * b["completion_mask"][:, 1:]
        ).sum(1)
        got = policy(b["input_ids"], b["attention_mask"], b["completion_mask"]).logps
        shared = _batch(True)
        got_shared = policy(shared["input_ids"], shared["attention_mask"], shared["completion_mask"]).logps
    torch.testing.assert_close(got, want, atol=1e-5, rtol=0)
    torch.testing.assert_close(got_shared, want, atol=1e-5, rtol=0)


def test_a_refused_share_prompt_is_a_one_line_error():
    from prefzoo.model.logps import PolicyLogps
    from prefzoo.model.selfcheck import LogpsSelfCheckError, run_self_check

    model = build_tiny("qwen3_next")  # linear-attention layers carry y_w's state into y_l
    with pytest.raises(LogpsSelfCheckError, match="turn share_prompt off"):
        run_self_check(PolicyLogps(model), None, _batch(True), fallback=False, say=lambda s: None)


def test_train_runs_the_self_check(tiny_dir, pairs_file, tmp_path, capsys, monkeypatch):
    """A run stops at the start when the fast path is wrong (here prefzoo applies a scale the model lacks)."""
    from prefzoo.model import logps as logps_mod
    from prefzoo.model.arch import LogitTransform
    from prefzoo.model.selfcheck import LogpsSelfCheckError
    from tests.train.helpers import base_config, run_inprocess

    run_inprocess(base_config(tiny_dir, pairs_file, tmp_path / "ok", max_steps=1))
    assert "self-check passed for llama" in capsys.readouterr().out
    monkeypatch.setattr(logps_mod, "logit_transform", lambda cfg: LogitTransform(scale=0.5))
    with pytest.raises(LogpsSelfCheckError, match="llama"):
        run_inprocess(base_config(tiny_dir, pairs_file, tmp_path / "bad", max_steps=1))
    res = run_inprocess(base_config(tiny_dir, pairs_file, tmp_path / "fb", max_steps=1, logps_fallback=True))
    assert "WARNING: log-prob self-check failed" in capsys.readouterr().out
    assert res.global_step == 1
