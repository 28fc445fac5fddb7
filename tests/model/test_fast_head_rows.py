"""The row-sum LM head (prefzoo/model/fast/head_rows.py): what it keeps for backward, and that it is exact.

Without per-token outputs (a sequence-level loss such as simpo or dpo), autograd must not keep the head's
(positions × vocabulary) softmax when the rows are longer than the hidden size: each row's (V, H) weight gradient is
smaller.  The bytes are counted from the autograd graph itself (every tensor a node keeps, each storage once), so the
check is exact and independent of the allocator and the machine.
"""

from __future__ import annotations

import pytest
import torch
from torch import Tensor, nn

from prefzoo.data.collate import PreferenceCollator
from prefzoo.model.fast.head import HeadOptions, head_logps
from prefzoo.model.fast.head_rows import head_row_logps, row_path_bytes
from prefzoo.model.logps import sequence_logps

V, H = 8192, 16  # vocabulary, hidden: rows of 40+ completion tokens are longer than H


def _tiny_llama() -> nn.Module:
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(
        vocab_size=V, hidden_size=H, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2,
        num_key_value_heads=2, max_position_embeddings=256, tie_word_embeddings=False, attn_implementation="sdpa",
    )  # fmt: skip
    torch.manual_seed(0)
    return LlamaForCausalLM(cfg).float().train()


def _examples() -> list[dict[str, object]]:
    g = torch.Generator().manual_seed(1)

    def ids(n: int) -> list[int]:
        return torch.randint(3, V, (n,), generator=g).tolist()

    return [
        {"id": "a", "prompt_ids": ids(9), "chosen_ids": ids(50), "rejected_ids": ids(41)},
        {"id": "b", "prompt_ids": ids(5), "chosen_ids": ids(44), "rejected_ids": ids(60)},
    ]


def _kept_bytes(out: Tensor) -> int:
    """Bytes of every tensor the autograd graph behind ``out`` keeps for backward (each storage once; leaves that
    require a gradient, the parameters, excluded: they exist without the graph)."""
    storages: dict[int, int] = {}
    seen, stack = set(), [out.grad_fn]

    def add(v: object) -> None:
        if isinstance(v, (list, tuple)):
            for x in v:
                add(x)
        elif isinstance(v, Tensor) and not (v.is_leaf and v.requires_grad):
            storages[v.untyped_storage().data_ptr()] = v.untyped_storage().nbytes()

    while stack:
        node = stack.pop()
        if node is None or node in seen:
            continue
        seen.add(node)
        for name in dir(node):
            if name.startswith("_saved_"):
                add(getattr(node, name))
        add(list(getattr(node, "__dict__", {}).values()))  # a custom Function's ctx attributes (kept chunks, ...)
        if hasattr(node, "saved_tensors") and not any(n.startswith("_saved_") for n in dir(node)):
            add(node.saved_tensors)
        stack += [f for f, _ in node.next_functions]
    return sum(storages.values())


@pytest.mark.parametrize("share_prompt", [False, True])
def test_a_sequence_level_forward_keeps_row_gradients_not_the_softmax(share_prompt):
    model = _tiny_llama()
    b = PreferenceCollator(0, share_prompt=share_prompt)(_examples())
    m = sum(len(e[k]) for e in _examples() for k in ("chosen_ids", "rejected_ids"))  # 195 scored positions
    softmax = m * V * 4  # what the per-token head keeps: 6.4 MB
    rows = 4 * V * H * 4  # four rows' (V, H) float32 weight gradients: 2.1 MB (the decoder keeps 0.5 MB more)
    seq = sequence_logps(model, b["input_ids"], b["attention_mask"], b["completion_mask"])
    kept = _kept_bytes(seq.logps)
    assert rows <= kept < softmax // 2, (kept, rows, softmax)
    tok = sequence_logps(model, b["input_ids"], b["attention_mask"], b["completion_mask"], token_logps=True)
    assert _kept_bytes(tok.token_logps) >= softmax  # per-token outputs: each token's own gradient needs the softmax


@pytest.mark.parametrize("layout", ["plain", "shared", "packed"])
def test_row_path_log_probs_and_gradients_equal_the_per_token_head(layout):
    model = _tiny_llama()
    b = PreferenceCollator(0, share_prompt=layout != "plain")(_examples())
    results = []
    for fused in (True, False):  # the row path / the autograd per-token head
        model.zero_grad(set_to_none=True)
        out = sequence_logps(model, b["input_ids"], b["attention_mask"], b["completion_mask"], fused_head=fused,
                             packing=layout == "packed", chunk_size=17)  # fmt: skip
        (out.logps * torch.tensor([0.7, -1.3, 0.4, 2.0])).sum().backward()
        results.append((out.logps.detach(), {n: p.grad.clone() for n, p in model.named_parameters()}))
    (lp_rows, g_rows), (lp_tok, g_tok) = results
    torch.testing.assert_close(lp_rows, lp_tok, atol=1e-5, rtol=1e-6)
    for name in g_tok:
        torch.testing.assert_close(g_rows[name], g_tok[name], atol=1e-6, rtol=1e-4, msg=name)


def _head_case(seed: int, lengths: list[int]) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    g = torch.Generator().manual_seed(seed)
    m = sum(lengths)
    h = torch.randn(m, 4, generator=g, dtype=torch.float64)
    w = torch.randn(50, 4, generator=g, dtype=torch.float64)
    targets = torch.randint(0, 50, (m,), generator=g)
    row = torch.repeat_interleave(torch.arange(len(lengths)), torch.tensor(lengths))
    return h, w, targets, row


@pytest.mark.parametrize("chunk", [1, 7, 64])
def test_values_and_gradients_equal_summed_token_log_probs(chunk):
    lengths = [20, 0, 25, 15]  # an empty row too
    h, w, targets, row = _head_case(chunk, lengths)
    g_rows = torch.tensor([0.5, 3.0, -1.5, 2.0], dtype=torch.float64)
    got = []
    for rows_path in (True, False):
        h_, w_ = h.clone().requires_grad_(True), w.clone().requires_grad_(True)
        if rows_path:
            lp = head_row_logps(h_, w_, targets, row, 4, HeadOptions(chunk))
            assert lp is not None
        else:
            tok, _ = head_logps(h_, w_, targets, False, HeadOptions(chunk))
            lp = torch.zeros(4, dtype=tok.dtype).index_add(0, row, tok)
        (lp * g_rows).sum().backward()
        got.append((lp.detach(), h_.grad, w_.grad))
    for a, b in zip(*got, strict=True):
        torch.testing.assert_close(a, b, atol=1e-10, rtol=1e-10)


def test_second_backward_recomputes_after_the_row_gradients_were_consumed():
    h, w, targets, row = _head_case(3, [30, 31])
    h.requires_grad_(True)
    w.requires_grad_(True)
    lp = head_row_logps(h, w, targets, row, 2, HeadOptions(8))
    assert lp is not None
    first = torch.autograd.grad(lp.sum(), (h, w), retain_graph=True)
    second = torch.autograd.grad(lp.sum(), (h, w))
    for a, b in zip(first, second, strict=True):
        torch.testing.assert_close(a, b, atol=1e-10, rtol=1e-10)


def test_the_row_path_is_taken_only_where_it_keeps_less():
    h, w, targets, row = _head_case(4, [30, 31])  # M = 61 positions, N·H = 8 < M
    w.requires_grad_(True)
    assert row_path_bytes(2, w, h) == 2 * 50 * 4 * 8
    opts = HeadOptions(8)
    assert head_row_logps(h, w, targets, row, 2, opts) is not None
    short = torch.tensor([0, 0, 0, 1, 1, 1])  # rows of 3 positions, shorter than H = 4: the softmax is smaller
    assert head_row_logps(h[:6], w, targets[:6], short, 2, opts) is None
    assert head_row_logps(h, w, targets, row.flip(0), 2, opts) is None  # positions not grouped by row in order
    lean = HeadOptions(8, keep_bytes=0)  # the softmax not kept: recomputed as before
    assert head_row_logps(h, w, targets, row, 2, lean) is None
    assert head_row_logps(h, w.detach(), targets, row, 2, opts) is None  # a frozen head keeps (M, H) only already
    with torch.no_grad():
        assert head_row_logps(h, w, targets, row, 2, opts) is None
