"""Inkling 1 divides its last hidden state by ``logits_mup_width_multiplier`` and keeps only the first
``unpadded_vocab_size`` logits of a head over the whole embedding table.  prefzoo's head reproduces both: its
log-probs, entropies and gradients equal the model's own, and without either part they are off by far more.
"""

from __future__ import annotations

import pytest
import torch
from torch import nn

from prefzoo.testing.architectures import UNPADDED, VOCAB, _token_range, build_tiny, tiny_pairs

pytest.importorskip("transformers.models.inkling")


@pytest.fixture(scope="module")
def inkling():
    model = build_tiny("inkling_text").double()
    model.set_experts_implementation("eager")  # grouped_mm takes no float64
    assert model.config.unpadded_vocab_size == VOCAB - 6 < model.get_output_embeddings().out_features == VOCAB
    return model


def _batch(model, shapes=UNPADDED):
    from prefzoo.data.collate import PreferenceCollator

    return PreferenceCollator(0)(tiny_pairs(_token_range(model), shapes=shapes))


def _own(model, b):
    """Per-sequence log-probs, per-token log-probs and entropies from the model's own (cut, divided) logits."""
    ids, cm = b["input_ids"], b["completion_mask"]
    logits = model(input_ids=ids, attention_mask=b["attention_mask"], use_cache=False).logits[:, :-1]
    assert logits.shape[-1] == VOCAB - 6  # the forward's cut
    logp_all = torch.log_softmax(logits, -1)
    tok = logp_all.gather(-1, ids[:, 1:].unsqueeze(-1)).squeeze(-1)
    ent = -(logp_all.exp() * logp_all).sum(-1)
    m = cm[:, 1:].bool()
    return (tok * m).sum(1), tok[m], ent[m]


def _ours(model, b, **kw):
    from prefzoo.model.logps import sequence_logps

    out = sequence_logps(
        model, b["input_ids"], b["attention_mask"], b["completion_mask"], token_logps=True, token_entropies=True,
        chunk_size=4, **kw,
    )  # fmt: skip
    m = out.token_mask
    return out.logps, out.token_logps[m], out.token_entropies[m]


def test_the_head_is_the_first_rows_and_the_logits_are_divided(inkling):
    from prefzoo.model.arch import FirstRows, logit_transform, logits_head
    from prefzoo.model.fast.head import fusable_head

    head = logits_head(inkling)
    assert type(head) is FirstRows and head.n == head.out_features == VOCAB - 6
    w = inkling.get_output_embeddings().weight
    assert head.weight.shape == (VOCAB - 6, w.shape[1]) and head.weight.data_ptr() == w.data_ptr()  # a view
    assert head.bias is None and fusable_head(head)
    assert logit_transform(inkling.config).scale == pytest.approx(1 / inkling.config.logits_mup_width_multiplier)
    assert logit_transform(inkling.config).describe() == f"× {1 / 24:g}"


@pytest.mark.parametrize("fused_head", [True, False])
def test_log_probs_and_entropies_equal_the_models_own(inkling, fused_head):
    b = _batch(inkling)
    with torch.no_grad():
        want, got = _own(inkling, b), _ours(inkling, b, fused_head=fused_head)
    for name, w, g in zip(("sequence", "token", "entropy"), want, got, strict=True):
        assert w.shape == g.shape
        assert float((g - w).abs().max()) <= 1e-10, name


@pytest.mark.parametrize("frozen_head", [False, True])
def test_gradients_equal_the_models_own_and_skip_the_cut_rows(inkling, frozen_head):
    b = _batch(inkling)
    a = torch.randn(b["input_ids"].shape[0], generator=torch.Generator().manual_seed(3), dtype=torch.float64)
    inkling.get_output_embeddings().weight.requires_grad_(not frozen_head)
    try:
        grads = []
        for fn in (_own, _ours):
            inkling.zero_grad()
            seq, _, ent = fn(inkling, b)
            ((a * seq).sum() + 0.1 * ent.sum()).backward()
            grads.append({n: p.grad.clone() for n, p in inkling.named_parameters() if p.grad is not None})
    finally:
        inkling.get_output_embeddings().weight.requires_grad_(True)
    want, got = grads
    assert want.keys() == got.keys() and want
    for name, g in want.items():
        assert float((got[name] - g).norm() / g.norm().clamp_min(1e-300)) <= 1e-8, name
    if not frozen_head:
        head_grad = got[next(n for n in got if n.startswith("lm_head"))]
        assert bool(head_grad[: VOCAB - 6].abs().sum() > 0) and bool((head_grad[VOCAB - 6 :] == 0).all())


@pytest.mark.parametrize("part", ["cut", "divisor"])
def test_without_either_part_the_log_probs_are_wrong(inkling, part, monkeypatch):
    from prefzoo.model import arch, logps
    from prefzoo.model.arch import LogitTransform

    b = _batch(inkling)
    with torch.no_grad():
        want = _own(inkling, b)[0]
        if part == "cut":
            monkeypatch.setattr(arch, "vocab_cut", lambda config: None)
        else:
            monkeypatch.setattr(logps, "logit_transform", lambda config: LogitTransform())
        got = _ours(inkling, b)[0]
    assert float((got - want).abs().max()) > 0.05


def test_the_cut_is_read_only_where_the_architecture_cuts():
    from prefzoo.model.arch import FirstRows, logits_head, vocab_cut

    llama = build_tiny("llama")
    llama.config.unpadded_vocab_size = 10  # a field llama's forward never reads
    assert vocab_cut(llama.config) is None and type(logits_head(llama)) is nn.Linear
    inkling2 = build_tiny("inkling2_text")  # its head already has the rows: nothing to cut
    assert vocab_cut(inkling2.config) is None and type(logits_head(inkling2)) is not FirstRows


@pytest.mark.parametrize("value", [0, 2.5, -3])
def test_a_count_that_is_not_one_is_refused_naming_the_field(value):
    """transformers' config refuses a float itself; a config read from elsewhere (remote code) may hold one."""
    from types import SimpleNamespace

    from prefzoo.model.arch import vocab_cut

    cfg = SimpleNamespace(model_type="inkling_text", unpadded_vocab_size=value)
    with pytest.raises(ValueError, match=rf"unpadded_vocab_size={float(value)}: .* a count >= 1"):
        vocab_cut(cfg)
    assert vocab_cut(SimpleNamespace(model_type="inkling_text", unpadded_vocab_size=7)) == 7


def test_a_biased_head_cut_to_its_first_rows_is_not_fused():
    from prefzoo.model.arch import FirstRows
    from prefzoo.model.fast.head import fusable_head

    biased = FirstRows(nn.Linear(4, 6, bias=True), 3)
    assert not fusable_head(biased) and biased.bias.shape == (3,)
    x = torch.randn(2, 4)
    assert torch.equal(biased(x), biased.head(x)[:, :3])
    assert fusable_head(FirstRows(nn.Linear(4, 6, bias=False), 3))


def test_a_lora_layer_on_the_head_is_cut_too(inkling):
    """LoRA on lm_head wraps the linear head: its logits are cut all the same (the chunked path runs the LoRA layer),
    and the log-probs equal the wrapped model's own."""
    peft = pytest.importorskip("peft")
    from prefzoo.model.arch import FirstRows, logits_head
    from prefzoo.model.logps import unwrap

    model = peft.get_peft_model(
        build_tiny("inkling_text").double(), peft.LoraConfig(r=4, target_modules=["lm_head"], init_lora_weights=False)
    )
    model.base_model.model.set_experts_implementation("eager")
    head = logits_head(unwrap(model, "base"))
    assert type(head) is FirstRows and type(head.head) is not nn.Linear
    b = _batch(inkling)
    with torch.no_grad():
        want, got = _own(model, b), _ours(model, b)
    for name, w, g in zip(("sequence", "token", "entropy"), want, got, strict=True):
        assert float((g - w).abs().max()) <= 1e-10, name
