"""Packing under flash attention: every sequence in one row, told apart by ``cu_seq_lens``, no 4-D mask.

No flash kernel runs on this CPU, so transformers' own flash path (``_flash_attention_forward``) is given a reference
kernel written here: per sequence, causal, with the sliding window and soft-capping flash takes, in float32
(:func:`_reference_varlen`).  What is under test is everything above the kernel: prefzoo's one-row packing, the
boundaries it passes, transformers' routing of them, and the unpacking.  The real kernel runs in the GPU test at the
end (skipped without CUDA and flash-attn).
"""

from __future__ import annotations

import importlib.util
import itertools

import pytest
import torch
from transformers import modeling_flash_attention_utils as fa_utils

from prefzoo.data.collate import PreferenceCollator
from prefzoo.model.arch import model_capabilities, varlen_attention
from prefzoo.model.fast.choice import LengthStats, choose_fast_paths
from prefzoo.model.fast.packing import PackingError, pack_rows
from prefzoo.model.logps import sequence_logps
from prefzoo.registry import get_loss
from tests.model.test_packing import EXAMPLES, TOKEN_LOSSES, _fields, assert_same_step

FLASH = "flash_attention_2"


def _reference_varlen(
    q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, dropout_p=0.0, softmax_scale=None,
    causal=False, window_size=(-1, -1), softcap=0.0, deterministic=False,
):  # fmt: skip
    """flash_attn_varlen_func's contract on (total, heads, d) tensors: each sequence attends only within itself."""
    assert torch.equal(cu_seqlens_q, cu_seqlens_k) and causal and dropout_p == 0.0
    _reference_varlen.calls.append((tuple(q.shape), cu_seqlens_q.tolist(), max_seqlen_q))
    bounds = cu_seqlens_q.tolist()
    assert max_seqlen_q == max(b - a for a, b in itertools.pairwise(bounds))
    out = []
    for a, b in itertools.pairwise(bounds):
        qs, ks, vs = (x[a:b].transpose(0, 1).float() for x in (q, k, v))  # (heads, n, d)
        ks, vs = (x.repeat_interleave(qs.shape[0] // x.shape[0], 0) for x in (ks, vs))  # grouped-query heads
        scores = qs @ ks.transpose(-1, -2) * (softmax_scale or qs.shape[-1] ** -0.5)
        if softcap:
            scores = softcap * torch.tanh(scores / softcap)
        i = torch.arange(b - a)
        allowed = i[:, None] >= i[None, :]
        if window_size[0] >= 0:
            allowed &= i[:, None] - i[None, :] <= window_size[0]
        out.append((scores.masked_fill(~allowed, float("-inf")).softmax(-1) @ vs).transpose(0, 1).to(q.dtype))
    return torch.cat(out)


def _no_fixed_length(*args, **kwargs):
    raise AssertionError("flash_attn_func ran: the packed row was not split into its sequences")


@pytest.fixture
def reference_flash(monkeypatch):
    """transformers' flash path with :func:`_reference_varlen` as its kernel; yields the list of kernel calls."""
    monkeypatch.setattr(
        fa_utils, "_lazy_imports", lambda *a, **k: (_no_fixed_length, _reference_varlen, None, None, None)
    )
    for name in ("_loaded_implementation", "_flash_fn", "_flash_varlen_fn", "_process_flash_kwargs_fn"):
        monkeypatch.setattr(fa_utils, name, getattr(fa_utils, name))  # restored after the test
    monkeypatch.setattr(fa_utils, "_loaded_implementation", None)
    _reference_varlen.calls = []
    yield _reference_varlen.calls


@pytest.fixture
def llama():
    from tests.support.tiny import build_model, build_tokenizer

    return build_model(build_tokenizer(), seed=4)


def test_one_row_packing_by_hand():
    b = PreferenceCollator(0)(EXAMPLES)  # 8 rows: [x, y] lengths 9 6 7 4 | 8 2 12 4
    p = pack_rows(b["input_ids"], b["attention_mask"], b["completion_mask"], shared=False, one_row=True)
    assert p.input_ids.shape == (1, 52) and not bool((p.doc == 0).any())  # no padding at all
    kw = p.varlen_kwargs()  # first-fit decreasing: longest first
    assert kw["cu_seq_lens_q"].tolist() == [0, 12, 21, 29, 36, 42, 46, 50, 52]
    assert kw["cu_seq_lens_q"].dtype == torch.int32 and kw["max_length_q"] == kw["max_length_k"] == 12
    starts = kw["cu_seq_lens_q"][:-1].long()
    assert p.position_ids[0, starts].tolist() == [0] * 8  # each sequence's positions restart
    with pytest.raises(PackingError, match="one row without padding"):
        pack_rows(b["input_ids"], b["attention_mask"], b["completion_mask"], shared=False).varlen_kwargs()


@pytest.mark.parametrize(("name", "mods"), TOKEN_LOSSES, ids=["+".join((n, *m)) for n, m in TOKEN_LOSSES])
def test_flash_packing_equals_the_unpacked_path(llama, reference_flash, name, mods):
    """Log-probs, token tensors, loss and every gradient: one flash row against unpacked SDPA rows."""
    loss = get_loss(name, modifiers=list(mods))
    llama.config._attn_implementation = "sdpa"
    plain = _fields(llama, loss, share=False, packing=False)
    llama.config._attn_implementation = FLASH
    packed = _fields(llama, loss, share=False, packing=True)
    layers = llama.config.num_hidden_layers
    assert reference_flash and all(c[0][0] == 52 and len(c[1]) == 9 for c in reference_flash)  # one row of 8 seqs
    assert len(reference_flash) % layers == 0  # every layer, every forward (policy and reference)
    assert_same_step(packed, plain)


def test_without_the_boundaries_the_logps_differ(llama, reference_flash, monkeypatch):
    """The test above can fail: one boundary around the whole row lets every sequence see the ones before it."""
    from prefzoo.model.fast import packing

    b = PreferenceCollator(0)(EXAMPLES)
    args = (b["input_ids"], b["attention_mask"], b["completion_mask"])
    llama.config._attn_implementation = FLASH
    with torch.no_grad():
        good = sequence_logps(llama, *args, packing=True)
        whole = packing.PackedRows.varlen_kwargs

        def one_sequence(self):
            kw = whole(self)
            n = int(kw["cu_seq_lens_q"][-1])
            return {**kw, "cu_seq_lens_q": kw["cu_seq_lens_q"][[0, -1]], "cu_seq_lens_k": kw["cu_seq_lens_k"][[0, -1]],
                    "max_length_q": n, "max_length_k": n}  # fmt: skip

        monkeypatch.setattr(packing.PackedRows, "varlen_kwargs", one_sequence)
        leaky = sequence_logps(llama, *args, packing=True)
    assert not torch.allclose(leaky.logps, good.logps, atol=1e-4)


@pytest.mark.parametrize("model_type", ["gemma2", "qwen2", "opt"])
def test_positions_windows_and_soft_capping_stay_exact_under_flash(model_type, reference_flash):
    """Gemma 2 (soft-capped attention and logits, sliding + full layers) and Qwen 2 (a sliding layer): the kernel
    gets the window and the cap, and applies them within each sequence of the row.  OPT (learned absolute
    positions, where RoPE's relative ones would hide it): each sequence's positions restart at 0."""
    from prefzoo.testing.architectures import build_tiny, tiny_pairs

    m = build_tiny(model_type)
    for layer in m.modules():  # a cap the tiny model's scores reach (50 leaves them all but unchanged)
        if getattr(layer, "attn_logit_softcapping", None) is not None:
            layer.attn_logit_softcapping = 0.5
    window = getattr(m.config, "sliding_window", None)
    b = PreferenceCollator(0)(tiny_pairs(m.config.vocab_size))
    assert window is None or int(b["attention_mask"].sum(1).max()) > window  # the window cuts inside a sequence
    args = (b["input_ids"], b["attention_mask"], b["completion_mask"])
    m.config._attn_implementation = "eager"  # applies the attention soft-cap, as flash does
    with torch.no_grad():
        plain = sequence_logps(m, *args, token_logps=True)
        m.config._attn_implementation = FLASH
        packed = sequence_logps(m, *args, token_logps=True, packing=True)
    assert reference_flash
    torch.testing.assert_close(packed.token_logps, plain.token_logps, atol=1e-4, rtol=1e-4)


def test_the_shared_layout_is_refused_under_flash_in_one_line(llama, reference_flash):
    b = PreferenceCollator(0, share_prompt=True)(EXAMPLES)
    llama.config._attn_implementation = FLASH
    with pytest.raises(PackingError, match="cannot keep the rejected completion from seeing the chosen") as e:
        sequence_logps(llama, b["input_ids"], b["attention_mask"], b["completion_mask"], packing=True)
    assert "\n" not in str(e.value) and "turn share_prompt off" in str(e.value)
    assert not reference_flash  # refused before the decoder ran


def test_flash_models_pack_but_do_not_share(llama):
    """A flash model declares packing possible and prompt sharing not; the automatic choice follows."""
    llama.config._attn_implementation = FLASH
    caps = model_capabilities(llama)
    assert varlen_attention(llama.config) and caps.packing_refusal is None
    assert caps.custom_mask_refusal == "flash_attention_2 attention takes no 4-D mask"
    stats = LengthStats(pairs=100, prompt_saving=0.4, padding_plain=0.5, padding_shared=0.5)
    f = choose_fast_paths(stats, refusal=caps.packing_refusal, share_refusal=caps.custom_mask_refusal)
    assert (f.share_prompt, f.packing) == (False, True)
    assert f.reasons[0] == "auto: flash_attention_2 attention takes no 4-D mask"
    llama.config._attn_implementation = "flex_attention"  # neither a 4-D mask nor sequence boundaries
    caps = model_capabilities(llama)
    assert not varlen_attention(llama.config) and caps.packing_refusal == caps.custom_mask_refusal is not None


@pytest.mark.skipif(
    not torch.cuda.is_available() or importlib.util.find_spec("flash_attn") is None,
    reason="needs a CUDA GPU and the flash-attn package (pip install flash-attn)",
)
def test_real_flash_kernel_packs_like_sdpa_on_gpu(llama):
    """On a GPU with flash-attn: the real varlen kernel, bfloat16, against the unpacked SDPA rows."""
    m = llama.to("cuda", torch.bfloat16)
    b = {k: v.cuda() for k, v in PreferenceCollator(0)(EXAMPLES).items() if isinstance(v, torch.Tensor)}
    args = (b["input_ids"], b["attention_mask"], b["completion_mask"])
    with torch.no_grad():
        m.config._attn_implementation = "sdpa"
        plain = sequence_logps(m, *args, token_logps=True)
        m.config._attn_implementation = FLASH
        packed = sequence_logps(m, *args, token_logps=True, packing=True)
    torch.testing.assert_close(packed.token_logps, plain.token_logps, atol=5e-2, rtol=2e-2)
