"""The recompute-in-backward LM head equals the plain autograd chunked head: values, entropies and gradients."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from prefzoo.model.fast.head import HeadOptions, fusable_head, head_logps
from prefzoo.model.logps import PolicyLogps, _chunked_head_logps


def _plain(h, w, targets, chunk, want_entropy):
    return _chunked_head_logps(lambda x: x @ w.t(), h, targets, want_entropy, HeadOptions(chunk))  # the autograd path


def _fused(keep_bytes):
    return lambda h, w, targets, chunk, want_entropy: head_logps(
        h, w, targets, want_entropy, HeadOptions(chunk, keep_bytes=keep_bytes)
    )


def _grads(fn, h, w, targets, chunk, want_entropy, g_lp, g_ent):
    h = h.detach().clone().requires_grad_(True)
    w_leaf = w.detach().clone().requires_grad_(w.requires_grad)
    lp, ent = fn(h, w_leaf, targets, chunk, want_entropy)
    total = (lp * g_lp).sum() + ((ent * g_ent).sum() if want_entropy else 0.0)
    total.backward()
    return lp.detach(), (ent.detach() if ent is not None else None), h.grad, w_leaf.grad


@pytest.mark.parametrize("chunk", [1, 5, 64])
@pytest.mark.parametrize("want_entropy", [False, True])
@pytest.mark.parametrize("frozen", [False, True])
@pytest.mark.parametrize("keep_bytes", [0, 1 << 30])  # recompute in backward / keep log p from the forward
def test_values_and_gradients_equal_plain_path(chunk, want_entropy, frozen, keep_bytes):
    g = torch.Generator().manual_seed(chunk + 2 * want_entropy + 4 * frozen)
    m, hid, v = 13, 8, 50
    h = torch.randn(m, hid, generator=g, dtype=torch.float64)
    w = torch.randn(v, hid, generator=g, dtype=torch.float64).requires_grad_(not frozen)
    targets = torch.randint(0, v, (m,), generator=g)
    g_lp, g_ent = torch.randn(m, generator=g, dtype=torch.float64), torch.randn(m, generator=g, dtype=torch.float64)
    fast = _grads(_fused(keep_bytes), h, w, targets, chunk, want_entropy, g_lp, g_ent)
    plain = _grads(_plain, h, w, targets, chunk, want_entropy, g_lp, g_ent)
    for a, b in zip(fast, plain, strict=True):
        if b is None:
            assert a is None
        else:
            torch.testing.assert_close(a.double(), b.double(), atol=2e-5, rtol=1e-5)  # both log-softmax in float32


def test_float32_agrees_with_float64():
    g = torch.Generator().manual_seed(0)
    h, w = torch.randn(40, 16, generator=g), torch.randn(300, 16, generator=g).requires_grad_(True)
    targets = torch.randint(0, 300, (40,), generator=g)
    lp32, _ = head_logps(h, w, targets, False, HeadOptions(7))
    lp64 = torch.log_softmax(h.double() @ w.detach().double().t(), -1).gather(-1, targets[:, None]).squeeze(-1)
    torch.testing.assert_close(lp32.double(), lp64, atol=1e-4, rtol=1e-5)


def test_second_backward_recomputes_when_log_p_was_kept():
    g = torch.Generator().manual_seed(1)
    h = torch.randn(6, 4, generator=g).requires_grad_(True)
    w = torch.randn(20, 4, generator=g).requires_grad_(True)
    lp, _ = head_logps(h, w, torch.randint(0, 20, (6,), generator=g), False, HeadOptions(4, keep_bytes=1 << 30))
    first = torch.autograd.grad(lp.sum(), (h, w), retain_graph=True)
    second = torch.autograd.grad(lp.sum(), (h, w))  # the kept chunks were consumed in place by the first
    for a, b in zip(first, second, strict=True):
        torch.testing.assert_close(a, b)


def test_fusable_head_only_for_plain_bias_free_linear():
    assert fusable_head(nn.Linear(4, 9, bias=False))
    assert not fusable_head(nn.Linear(4, 9, bias=True))
    assert not fusable_head(nn.Embedding(9, 4))


@pytest.fixture(scope="module")
def model_and_batch():
    from prefzoo.data.collate import PreferenceCollator
    from tests.support.tiny import build_model, build_tokenizer

    tok = build_tokenizer()
    model = build_model(tok, seed=3)
    ex = [
        {"id": "a", "prompt_ids": [5, 6, 7], "chosen_ids": [8, 9, 2], "rejected_ids": [10, 2]},
        {"id": "b", "prompt_ids": [5], "chosen_ids": [11, 12, 13, 14, 2], "rejected_ids": [2]},
    ]
    return model, PreferenceCollator(tok.pad_token_id)(ex)


@pytest.mark.parametrize("loss_name", ["dpo", "mmpo-entropy", "simpo"])
def test_policy_logps_loss_and_grads_equal_unfused(model_and_batch, loss_name):
    from prefzoo.registry import get_loss
    from prefzoo.types import Need, PreferenceBatch

    model, b = model_and_batch
    loss = get_loss(loss_name)
    results = []
    for fused in (True, False):
        model.zero_grad()
        out = PolicyLogps(model, chunk_size=3, fused_head=fused)(
            b["input_ids"],
            b["attention_mask"],
            b["completion_mask"],
            token_logps=Need.TOKEN_LOGPS in loss.needs,
            token_entropies=Need.TOKEN_ENTROPIES in loss.needs,
        )
        w, l_ = out.split()
        fields = dict(
            policy_chosen_logps=w["logps"],
            policy_rejected_logps=l_["logps"],
            chosen_lengths=w["lengths"],
            rejected_lengths=l_["lengths"],
            example_ids=("a", "b"),
        )
        if Need.REFERENCE in loss.needs:
            fields.update(ref_chosen_logps=torch.tensor([-30.0, -40.0]), ref_rejected_logps=torch.tensor([-20.0, -9.0]))
        if out.token_mask is not None:
            fields.update(chosen_mask=w["token_mask"], rejected_mask=l_["token_mask"])
        if Need.TOKEN_LOGPS in loss.needs:
            fields.update(policy_chosen_token_logps=w["token_logps"], policy_rejected_token_logps=l_["token_logps"])
        if Need.TOKEN_ENTROPIES in loss.needs:
            fields.update(chosen_token_entropies=w["token_entropies"], rejected_token_entropies=l_["token_entropies"])
        value = loss(PreferenceBatch(**fields)).losses.mean()
        value.backward()
        results.append((out.logps.detach(), value.detach(), {n: p.grad.clone() for n, p in model.named_parameters()}))
    (lp_f, v_f, g_f), (lp_p, v_p, g_p) = results
    torch.testing.assert_close(lp_f, lp_p, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(v_f, v_p, atol=1e-6, rtol=1e-5)
    for name in g_p:
        torch.testing.assert_close(g_f[name], g_p[name], atol=1e-5, rtol=1e-4, msg=name)


def test_the_shifted_exponential_gives_logsumexp_also_on_infinite_rows():
    from prefzoo.model.fast.head import _exp_shifted

    inf = float("inf")
    z = torch.tensor(
        [[1.0, 2.0, -3.0], [-inf, -inf, -inf], [-inf, 0.5, -inf], [80.0, 90.0, 100.0], [inf, 0.0, 1.0]],
        dtype=torch.float64,
    )
    want = torch.logsumexp(z, -1)
    e = torch.empty_like(z)
    lse, s = _exp_shifted(z, out=e)
    torch.testing.assert_close(lse, want)  # the all −∞ row is −∞ (no nan from −∞ − (−∞)), the +∞ row +∞
    finite = torch.isfinite(want)
    torch.testing.assert_close((e / s.unsqueeze(-1))[finite], torch.softmax(z, -1)[finite])  # e / s is the softmax


def test_the_backward_recomputes_every_chunk_into_one_buffer(monkeypatch):
    """Recomputing the logits in backward writes every chunk into one (chunk, V) buffer, as the forward does, not a
    fresh one per chunk: one buffer's memory at the step's peak instead of two, and no fresh pages to fault in (at
    4,096-token completions and a 49k vocabulary that is 24 chunks of 64 MB a step). The values stay the same bits."""
    from prefzoo.model.fast import head as fastpath_head

    outs: list[int | None] = []
    real = fastpath_head._chunk_logp_all

    def recording(h_c, w, transform, out=None):
        outs.append(None if out is None else out.untyped_storage().data_ptr())
        return real(h_c, w, transform, out)

    g = torch.Generator().manual_seed(3)
    h = torch.randn(23, 8, generator=g).requires_grad_(True)
    w = torch.randn(50, 8, generator=g).requires_grad_(True)
    targets = torch.randint(0, 50, (23,), generator=g)
    lp, _ = head_logps(h, w, targets, False, HeadOptions(5, keep_bytes=0))  # 5 chunks, the last of 3 positions
    monkeypatch.setattr(fastpath_head, "_chunk_logp_all", recording)
    got = torch.autograd.grad(lp.sum(), (h, w))
    assert len(outs) == 5 and outs[0] is not None and len(set(outs)) == 1
    monkeypatch.setattr(fastpath_head, "_chunk_logp_all", lambda h_c, w, transform, out=None: real(h_c, w, transform))
    lp, _ = head_logps(h, w, targets, False, HeadOptions(5, keep_bytes=0))
    fresh = torch.autograd.grad(lp.sum(), (h, w))  # a fresh buffer per chunk, as before
    assert all(torch.equal(a, b) for a, b in zip(got, fresh, strict=True))


def test_row_sums_accumulate_beyond_float32():
    """A row's sum of many float32 log-probs is the float64 sum rounded once: index_add in float32 adds them one after
    another and drifts (SPPO's squared margin on summed log-probs multiplies that drift into every gradient)."""
    from prefzoo.model.fast.head import row_sums

    g = torch.Generator().manual_seed(0)
    tok = -5.0 - 5.0 * torch.rand(4000, generator=g)  # (M,) float32 log-probs of -5 to -10
    row = torch.arange(4000) % 2  # (M,) two rows, interleaved
    exact = torch.zeros(2, dtype=torch.float64).index_add(0, row, tok.double())  # (N,)
    got = row_sums(tok, row, 2)
    assert got.dtype == torch.float32
    assert torch.equal(got, exact.float())  # rounded once
    sequential = torch.zeros(2).index_add(0, row, tok)  # what float32 accumulation gives
    assert not torch.equal(sequential, exact.float())  # the case is one where accumulation precision shows
