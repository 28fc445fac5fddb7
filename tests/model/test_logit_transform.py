"""The fused head's backward with the model's logit transform equals autograd through the model's own logits.

float64, tiny Gemma 2 (tanh soft-capping), Cohere (× logit_scale), Granite (÷ logits_scaling) and a model with
both a scale and a cap; trainable head (full fine-tuning: recomputed or kept log p) and frozen head (LoRA: the
closed form from E, F, d_y), with and without entropies.  ≤ 1e-8 relative per parameter.
"""

from __future__ import annotations

import pytest
import torch

from prefzoo.testing.architectures import UNPADDED, build_tiny, tiny_pairs

pytest.importorskip("transformers")


def _model(model_type: str, **overrides):
    m = build_tiny(model_type).double()
    for k, v in overrides.items():
        setattr(m.config, k, v)
    return m


def _weights(b):
    g = torch.Generator().manual_seed(1)
    n, t = b["input_ids"].shape
    return torch.randn(n, generator=g, dtype=torch.float64), torch.randn(n, t, generator=g, dtype=torch.float64)


def _objective_model(model, b, a, c):
    """Σ a_i log π(y_i) + Σ c_it H_it from the model's own logits (autograd end to end)."""
    ids, cm = b["input_ids"], b["completion_mask"]
    logits = model(input_ids=ids, attention_mask=b["attention_mask"], use_cache=False).logits[:, :-1]
    logp_all = torch.log_softmax(logits, -1)
    tok = logp_all.gather(-1, ids[:, 1:].unsqueeze(-1)).squeeze(-1)
    ent = -(logp_all.exp() * logp_all).sum(-1)
    m = cm[:, 1:].double()
    return (a * (tok * m).sum(1)).sum() + (c[:, 1:] * ent * m).sum()


def _objective_fast(model, b, a, c):
    from prefzoo.model.logps import sequence_logps

    out = sequence_logps(
        model, b["input_ids"], b["attention_mask"], b["completion_mask"], token_entropies=True, chunk_size=4
    )
    pos = b["completion_mask"][:, 1:]
    c_sel = torch.zeros_like(out.token_entropies)
    for i in range(pos.shape[0]):
        v = c[i, 1:][pos[i]]
        c_sel[i, : v.numel()] = v
    return (a * out.logps).sum() + (c_sel * out.token_entropies).sum()


def _grads(model, fn):
    model.zero_grad()
    fn().backward()
    return {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


@pytest.mark.parametrize(
    ("model_type", "overrides"),
    [
        ("gemma2", {}),
        ("cohere", {}),
        ("granite", {}),
        ("gemma2", {"final_logit_softcapping": 2.0}),
    ],
)
@pytest.mark.parametrize("head", ["trainable-kept", "trainable-recomputed", "frozen"])
def test_fused_backward_equals_autograd_through_model_logits(model_type, overrides, head, monkeypatch):
    from prefzoo.data.collate import PreferenceCollator
    from prefzoo.model.arch import logit_transform
    from prefzoo.model.fast import head as fastpath_head

    model = _model(model_type, **overrides)
    assert not logit_transform(model.config).identity
    if head == "frozen":
        model.get_output_embeddings().weight.requires_grad_(False)
    if head == "trainable-recomputed":
        monkeypatch.setattr(fastpath_head, "MAX_KEEP_BYTES", 0)
    b = PreferenceCollator(0)(tiny_pairs(96, shapes=UNPADDED))  # padded rows can be all-masked under a window: NaN
    a, c = _weights(b)
    want = _grads(model, lambda: _objective_model(model, b, a, c))
    got = _grads(model, lambda: _objective_fast(model, b, a, c))
    assert want.keys() == got.keys() and want
    for name, g in want.items():
        rel = float((got[name] - g).norm() / g.norm().clamp_min(1e-300))
        assert rel <= 1e-8, f"{model_type} {head} {name}: relative error {rel:.2e}"


def test_the_gradient_check_can_fail(monkeypatch):
    """Dropping the tanh derivative from the fused backward is caught by the comparison above."""
    from prefzoo.data.collate import PreferenceCollator
    from prefzoo.model.arch import LogitTransform

    model = _model("gemma2")
    monkeypatch.setattr(LogitTransform, "derivative_", lambda self, z: z.fill_(self.scale))
    b = PreferenceCollator(0)(tiny_pairs(96, shapes=UNPADDED))  # padded rows can be all-masked under a window: NaN
    a, c = _weights(b)
    want = _grads(model, lambda: _objective_model(model, b, a, c))
    got = _grads(model, lambda: _objective_fast(model, b, a, c))
    worst = max(float((got[n] - g).norm() / g.norm()) for n, g in want.items())
    assert worst > 1e-4
