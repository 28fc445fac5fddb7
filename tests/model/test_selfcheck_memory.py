"""The run-start self-check's memory is bounded at long completions, and it still compares every position."""

from __future__ import annotations

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from prefzoo.testing.architectures import tiny_config, tiny_pairs

pytest.importorskip("transformers")

VOCAB = 4096


class LargestTensor(TorchDispatchMode):
    """Records the bytes of the largest tensor any operator returns inside the block."""

    def __init__(self) -> None:
        super().__init__()
        self.largest = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in out if isinstance(out, (tuple, list)) else (out,):
            if isinstance(t, torch.Tensor):
                self.largest = max(self.largest, t.numel() * t.element_size())
        return out


def _model(model_type: str, attn: str = "eager", **overrides):
    from transformers import AutoModelForCausalLM

    cfg = tiny_config(model_type)
    for k, v in {"vocab_size": VOCAB, "max_position_embeddings": 512, **overrides}.items():
        setattr(cfg, k, v)
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(cfg, attn_implementation=attn, dtype=torch.float32)
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() >= 2:
                p.normal_(0.0, 0.3)
    return model.eval()


def _batch(shapes, share: bool = False):
    from prefzoo.data.collate import PreferenceCollator

    return PreferenceCollator(0, share_prompt=share)(tiny_pairs(VOCAB, shapes=shapes))


def test_the_models_logits_never_exist_whole_at_long_lengths():
    """4 rows of 300 tokens × 4,096 vocabulary: 19.7 MB of float32 logits whole; chunks of 1 MB here, and the
    largest tensor is the model's own (N, 1, T, T) padding mask (1.4 MB; SDPA: no attention scores)."""
    from prefzoo.model.logps import PolicyLogps
    from prefzoo.model.selfcheck import check_logps

    model = _model("llama", attn="sdpa")
    batch = _batch(((20, 280, 270), (20, 250, 280)))
    n, t = batch["input_ids"].shape
    whole = n * t * VOCAB * 4
    budget = 1 << 20
    with LargestTensor() as probe:
        res = check_logps(PolicyLogps(model, chunk_size=16), batch, logits_bytes=budget)
    assert res.ok, res
    assert probe.largest <= max(budget, n * t * t * 4), (probe.largest, whole)  # the old check: (N, T, V) logits


@pytest.mark.parametrize("model_type", ["gemma2", "cohere", "granite"])
def test_chunked_own_forward_equals_the_whole_logits(model_type):
    """Soft-capped / scaled logits: the chunked model forward sums the same log-probs as its whole logits."""
    from prefzoo.model.logps import completion_logps_naive
    from prefzoo.model.selfcheck import own_forward_logps

    model = _model(model_type)
    b = _batch(((12, 40, 33), (9, 21, 45)))
    with torch.no_grad():
        want = completion_logps_naive(model, b["input_ids"], b["attention_mask"], b["completion_mask"])
        got, _ = own_forward_logps(model, b["input_ids"], b["attention_mask"], b["completion_mask"], False, 3 * VOCAB)
    torch.testing.assert_close(got, want, atol=1e-4, rtol=0)


def test_a_bug_only_past_the_sliding_window_is_caught(monkeypatch):
    """The shared-prompt mask forgets the sliding window (48): rows of ~100 tokens differ only at positions ≥ 48."""
    from prefzoo.model.fast import prompt as fastpath_prompt
    from prefzoo.model.logps import PolicyLogps
    from prefzoo.model.selfcheck import check_logps

    model = _model("mistral", sliding_window=48)
    batch = _batch(((30, 70, 64), (24, 75, 70)), share=True)
    policy = PolicyLogps(model, chunk_size=16)
    assert check_logps(policy, batch, logits_bytes=1 << 16).ok
    monkeypatch.setattr(fastpath_prompt, "windowed", lambda allowed, position_ids, window: allowed)
    res = check_logps(policy, batch, logits_bytes=1 << 16)  # chunks of 2 positions
    assert not res.ok and res.max_error > 10 * res.tolerance, res
