"""The shared-prompt attention split into two causal parts equals the masked attention, and is taken when it can be.

Against SDPA over the whole row with the [x, y_w, y_l] mask (``fastpath_prompt.shared_prompt_mask``): the outputs
of every real position and the gradients of q, k and v, in float64 so that any wrong key shows far above rounding.
The layouts cover what the plan must get right: a y_l that starts inside the causal part L₁ (a row shorter than the
longest x + y_w), one that reaches past it, a one-token y_l, a row with no padding, and grouped key-value heads.
"""

from __future__ import annotations

import pytest
import torch
from torch.nn import functional as F

from prefzoo.data.collate import PreferenceCollator
from prefzoo.model.fast import prompt as fastpath_prompt
from prefzoo.model.fast import split as fastpath_split
from prefzoo.model.fast.prompt import shared_prompt_mask
from prefzoo.model.fast.split import (
    CHOSEN,
    IMPLEMENTATION,
    PROMPT,
    REJECTED,
    split_attention,
    split_plan,
    split_refusal,
    split_sdpa_forward,
)

pytest.importorskip("transformers")

LAYOUTS = {  # (|x|, |y_w|, |y_l|) per row
    "ragged": [(3, 5, 2), (1, 1, 7), (6, 2, 1), (2, 6, 4)],
    "rejected-longest": [(2, 1, 9), (4, 4, 1)],
    "one-row": [(5, 3, 3)],
    "one-token-rejected": [(3, 2, 1), (2, 4, 1)],  # every y_l a single token
}


def _segments(rows: list[tuple[int, int, int]]) -> torch.Tensor:
    t = max(sum(r) for r in rows)
    seg = torch.zeros(len(rows), t, dtype=torch.long)
    for b, (p, w, l_) in enumerate(rows):
        seg[b, :p], seg[b, p : p + w], seg[b, p + w : p + w + l_] = 1, 2, 3
    return seg


class _Module(torch.nn.Module):  # what the attention function reads from a decoder's attention module
    def __init__(self, groups: int) -> None:
        super().__init__()
        self.num_key_value_groups = groups
        self.is_causal = True


def _qkv(seg: torch.Tensor, heads: int, kv_heads: int, seed: int = 0) -> tuple[torch.Tensor, ...]:
    g = torch.Generator().manual_seed(seed)
    b, t = seg.shape
    shapes = ((b, heads, t, 8), (b, kv_heads, t, 8), (b, kv_heads, t, 8))
    return tuple(torch.randn(s, generator=g, dtype=torch.float64, requires_grad=True) for s in shapes)


def _masked(q, k, v, seg):
    from transformers.integrations.sdpa_attention import repeat_kv

    groups = q.shape[1] // k.shape[1]
    mask = torch.zeros(seg.shape[0], 1, seg.shape[1], seg.shape[1], dtype=q.dtype)
    mask = mask.masked_fill(~shared_prompt_mask(seg), float("-inf"))
    return F.scaled_dot_product_attention(q, repeat_kv(k, groups), repeat_kv(v, groups), attn_mask=mask)


@pytest.mark.parametrize("layout", sorted(LAYOUTS))
@pytest.mark.parametrize(("heads", "kv_heads"), [(2, 2), (4, 2)])
def test_split_equals_the_masked_attention_outputs_and_gradients(layout, heads, kv_heads):
    seg = _segments(LAYOUTS[layout])
    q, k, v = _qkv(seg, heads, kv_heads)
    real = (seg != 0)[:, None, :, None]  # (B, 1, T, 1): padding outputs are nobody's input
    g_out = torch.randn(q.shape, generator=torch.Generator().manual_seed(1), dtype=torch.float64) * real

    want = _masked(q, k, v, seg)
    want_grads = torch.autograd.grad(want, (q, k, v), g_out)
    plan = split_plan(seg)
    got, _ = split_sdpa_forward(_Module(heads // kv_heads), q, k, v, None, prefzoo_split=plan)
    got = got.transpose(1, 2)  # the attention-function contract returns (B, T, H, D)
    got_grads = torch.autograd.grad(got, (q, k, v), g_out)

    assert plan.calls == 1
    torch.testing.assert_close(got * real, want * real, atol=1e-12, rtol=1e-12)
    for name, a, b in zip("qkv", got_grads, want_grads, strict=True):
        torch.testing.assert_close(a, b, atol=1e-12, rtol=1e-12, msg=f"grad {name}")


def test_the_plan_reads_each_part_from_the_right_positions():
    """Row [x x y_w y_l y_l y_l pad] and row [x y_w y_w y_w y_l pad pad]: L₁ = 4, y_l's queries and [x, y_l] keys."""
    seg = torch.tensor([[1, 1, 2, 3, 3, 3, 0], [1, 2, 2, 2, 3, 0, 0]])
    plan = split_plan(seg)
    assert (plan.t, plan.l1) == (7, 4)
    assert plan.q_idx.tolist() == [[3, 4, 5], [4, 0, 0]]
    assert plan.kv_idx.tolist() == [[0, 1, 3, 4, 5], [0, 4, 0, 0, 0]]
    assert plan.allowed[0, 0].int().tolist() == [[1, 1, 1, 0, 0], [1, 1, 1, 1, 0], [1, 1, 1, 1, 1]]
    assert plan.allowed[1, 0].int().tolist() == [[1, 1, 0, 0, 0], [1, 0, 0, 0, 0], [1, 0, 0, 0, 0]]
    assert plan.src.tolist() == [[0, 0, 0, 0, 1, 2, 0], [0, 0, 0, 0, 0, 0, 0]]
    assert plan.is_l.int().tolist() == [[0, 0, 0, 1, 1, 1, 0], [0, 0, 0, 0, 1, 0, 0]]


def test_without_its_mask_the_second_part_lets_y_l_see_later_tokens():
    """The equality above is not vacuous: dropping the shifted causal mask of the y_l part changes y_l's outputs."""
    seg = _segments(LAYOUTS["ragged"])
    q, k, v = _qkv(seg, 2, 2)
    plan = split_plan(seg)
    plan.allowed = torch.ones_like(plan.allowed)
    got, _ = split_sdpa_forward(_Module(1), q, k, v, None, prefzoo_split=plan)
    want = _masked(q, k, v, seg)
    is_l = (seg == 3)[:, None, :, None]
    assert not torch.allclose(got.transpose(1, 2) * is_l, want * is_l, atol=1e-6)


def test_without_a_plan_or_with_a_window_it_is_transformers_own_sdpa():
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    seg = _segments(LAYOUTS["ragged"])
    q, k, v = _qkv(seg, 2, 2)
    mask = torch.zeros(seg.shape[0], 1, seg.shape[1], seg.shape[1], dtype=q.dtype)
    mask = mask.masked_fill(~shared_prompt_mask(seg), float("-inf"))
    want, _ = sdpa_attention_forward(_Module(1), q, k, v, mask)
    plan = split_plan(seg)
    for kw in ({}, {"prefzoo_split": plan, "sliding_window": 4}):
        got, _ = split_sdpa_forward(_Module(1), q, k, v, mask, **kw)
        assert torch.equal(got, want)
    assert plan.calls == 0


def _model(attn: str = "sdpa"):
    from tests.support.tiny import build_model, build_tokenizer

    m = build_model(build_tokenizer(), seed=4)
    m.config._attn_implementation = attn
    return m


EXAMPLES = [
    {"id": "a", "prompt_ids": [5, 6, 7], "chosen_ids": [8, 9, 2], "rejected_ids": [10, 2]},
    {"id": "b", "prompt_ids": [5], "chosen_ids": [11, 12, 13, 14, 2], "rejected_ids": [2]},
    {"id": "c", "prompt_ids": [9, 9, 9, 9, 20, 21], "chosen_ids": [2], "rejected_ids": [15, 16, 17, 18, 19, 2]},
]


def _shared_logps_and_grads(m, split: bool) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    b = PreferenceCollator(0, share_prompt=True)(EXAMPLES)
    m.zero_grad()
    backbone = m.get_decoder()
    _, (h_sel, *_rest) = fastpath_prompt.shared_prompt_select(
        backbone, m.config, b["input_ids"], b["completion_mask"], split=split
    )
    h_sel.square().sum().backward()
    return h_sel.detach(), {n: p.grad.clone() for n, p in m.named_parameters() if p.grad is not None}


def test_a_decoder_under_sdpa_takes_the_split_in_every_layer_and_matches_the_masked_forward(monkeypatch):
    m = _model().double()  # float64: a wrong key shows far above the rounding of two softmax orders
    layers: list[int] = []

    def spy(module, *a, **k):
        if k.get("prefzoo_split") is not None:
            layers.append(module.layer_idx)
        return split_sdpa_forward(module, *a, **k)  # the module's function, imported before the patch

    monkeypatch.setattr(fastpath_split, "split_sdpa_forward", spy)  # what split_attention registers
    h_masked, g_masked = _shared_logps_and_grads(m, split=False)
    assert layers == []
    h_split, g_split = _shared_logps_and_grads(m, split=True)
    assert layers == list(range(m.config.num_hidden_layers))
    assert m.config._attn_implementation == "sdpa"  # restored after the forward
    torch.testing.assert_close(h_split, h_masked, atol=1e-10, rtol=1e-10)
    assert g_split.keys() == g_masked.keys()
    for name in g_masked:
        torch.testing.assert_close(g_split[name], g_masked[name], atol=1e-10, rtol=1e-9, msg=name)


def test_the_implementation_is_restored_when_the_forward_fails():
    m = _model()
    with pytest.raises(RuntimeError, match="inside"), split_attention(m.config):
        assert m.config._attn_implementation == IMPLEMENTATION
        raise RuntimeError("inside")
    assert m.config._attn_implementation == "sdpa"


def test_the_split_is_refused_with_its_reason_where_it_cannot_reproduce_the_attention():
    m = _model("eager")
    assert split_refusal(m.get_decoder(), m.config) == "attention implementation 'eager', not 'sdpa'"
    m = _model()
    assert split_refusal(m.get_decoder(), m.config) is None
    m.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    assert "gradient checkpointing" in str(split_refusal(m.get_decoder(), m.config))
    m = _model()
    m.config.sliding_window, m.config.layer_types = 4, ["sliding_attention"] * m.config.num_hidden_layers
    assert split_refusal(m.get_decoder(), m.config) == "sliding-window layers"


def test_a_decoder_that_drops_the_keyword_gets_the_mask_and_the_masked_result(monkeypatch):
    """A decoder that passes no keywords down to its attention (StableLM's, in transformers 5.24) reaches the
    function without a plan: it gets transformers' SDPA with the boolean mask, the same numbers as the float one."""
    m = _model().double()
    h_masked, g_masked = _shared_logps_and_grads(m, split=False)

    def drops(module, *a, **k):
        k.pop("prefzoo_split")
        return split_sdpa_forward(module, *a, **k)

    monkeypatch.setattr(fastpath_split, "split_sdpa_forward", drops)
    h, g = _shared_logps_and_grads(m, split=True)
    assert torch.equal(h, h_masked)
    assert g.keys() == g_masked.keys() and all(torch.equal(g[n], g_masked[n]) for n in g)


def test_a_window_the_config_switches_off_is_no_refusal():
    """Qwen2-style configs carry a sliding_window with use_sliding_window=False: every layer is full attention."""
    m = _model()
    m.config.sliding_window, m.config.use_sliding_window = 4096, False
    assert split_refusal(m.get_decoder(), m.config) is None


# ---- one padding-free row (packing under SDPA): the split gathered from the flat row --------------------------------


def _flat(seg: torch.Tensor, reverse: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """(B, T) collated segment ids → (flat_of (B, T), N): the rows' real tokens end to end, pair after pair (the last
    row first with ``reverse``, as first-fit-decreasing packing may order them)."""
    valid = seg != 0
    flat_of = torch.zeros(seg.shape, dtype=torch.long)
    start = 0
    for r in reversed(range(seg.shape[0])) if reverse else range(seg.shape[0]):
        n_r = int(valid[r].sum())
        flat_of[r, :n_r] = torch.arange(start, start + n_r)
        start += n_r
    return flat_of, start


@pytest.mark.parametrize("layout", [*sorted(LAYOUTS), "plain"])
@pytest.mark.parametrize(("heads", "kv_heads"), [(2, 2), (4, 2)])
@pytest.mark.parametrize("path", ["row-by-row", "row-by-row, rows reversed", "gathered"])
def test_the_split_on_one_flat_row_equals_the_masked_attention_of_the_collated_rows(
    layout, heads, kv_heads, path, monkeypatch
):
    """q, k, v laid out as one row of the real tokens only: the outputs and gradients of every real token equal
    the masked attention over the collated rows (plain rows [x, y]: causal within each row, part 1 only), whether the
    split runs row by row on slices (CPU; rows in any order) or gathered into padded collated rows (other devices)."""
    rows = [(4, 0, 0), (1, 0, 0), (7, 0, 0), (2, 0, 0)] if layout == "plain" else LAYOUTS[layout]
    seg = _segments(rows)
    q, k, v = _qkv(seg, heads, kv_heads)
    real = seg != 0
    g = torch.Generator().manual_seed(1)
    g_out = torch.randn(q.shape, generator=g, dtype=torch.float64) * real[:, None, :, None]
    want = _masked(q, k, v, seg)
    want_grads = torch.autograd.grad(want, (q, k, v), g_out)

    flat_of, n = _flat(seg, reverse="reversed" in path)
    order = flat_of[:, 0].argsort()

    def to_flat(x: torch.Tensor) -> torch.Tensor:  # (B, H, T, D) → (1, H, N, D) in flat order
        return x[order].transpose(1, 2)[real[order]].transpose(0, 1)[None]

    taken = []
    for name in ("_rows_split", "_flat_split"):
        sound = getattr(fastpath_split, name)
        monkeypatch.setattr(fastpath_split, name, lambda *a, _f=sound, _n=name: taken.append(_n) or _f(*a))
    if path == "gathered":
        monkeypatch.setattr(fastpath_split, "ROW_BY_ROW_DEVICES", ())
    qf, kf, vf = (to_flat(x).detach().requires_grad_() for x in (q, k, v))
    plan = split_plan(seg)
    plan.flat = fastpath_split.flat_layout(plan, seg, flat_of, n)
    assert plan.has_l == (layout != "plain")
    got, _ = split_sdpa_forward(_Module(heads // kv_heads), qf, kf, vf, None, prefzoo_split=plan)  # (1, N, H, D)
    got_grads = torch.autograd.grad(got, (qf, kf, vf), to_flat(g_out).transpose(1, 2))

    assert taken == ["_flat_split" if path == "gathered" else "_rows_split"]
    assert plan.calls == 1 and got.shape == (1, n, heads, 8)
    torch.testing.assert_close(got[0], to_flat(want)[0].transpose(0, 1), atol=1e-12, rtol=1e-12)
    for name, a, b in zip("qkv", got_grads, want_grads, strict=True):
        torch.testing.assert_close(a, to_flat(b), atol=1e-12, rtol=1e-12, msg=f"grad {name}")


@pytest.mark.parametrize("share", [True, False], ids=["shared", "plain"])
def test_packed_rows_take_the_split_in_every_layer_and_equal_the_padded_forward(monkeypatch, share):
    """``packing=True`` under SDPA: one padding-free row, every layer through the flat split, and the log-probs and
    every weight gradient equal the unpacked forward's (float64)."""
    from prefzoo.model.logps import sequence_logps

    m = _model().double()
    layers: list[int] = []

    def spy(module, *a, **k):
        plan = k.get("prefzoo_split")
        if plan is not None and plan.flat is not None and a[0].shape[0] == 1:
            layers.append(module.layer_idx)
        return split_sdpa_forward(module, *a, **k)

    monkeypatch.setattr(fastpath_split, "split_sdpa_forward", spy)
    b = PreferenceCollator(0, share_prompt=share)(EXAMPLES)
    args = (b["input_ids"], b["attention_mask"], b["completion_mask"])

    def run(packing: bool) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        m.zero_grad()
        out = sequence_logps(m, *args, packing=packing, token_logps=True)
        (out.logps.sum() + out.token_logps.square().sum()).backward()
        return out.token_logps.detach(), {n: p.grad.clone() for n, p in m.named_parameters() if p.grad is not None}

    want, want_g = run(False)
    assert layers == []
    got, got_g = run(True)
    assert layers == list(range(m.config.num_hidden_layers))
    torch.testing.assert_close(got, want, atol=1e-10, rtol=1e-10)
    assert got_g.keys() == want_g.keys()
    for name in want_g:
        torch.testing.assert_close(got_g[name], want_g[name], atol=1e-10, rtol=1e-9, msg=name)


def test_a_wrong_flat_slot_is_caught(monkeypatch):
    """The equality above has teeth: one output slot off by one changes the log-probs."""
    from prefzoo.model.fast import packing
    from prefzoo.model.logps import sequence_logps
    from tests.support.patching import patch_result, roll_flat_slots

    m = _model().double()
    b = PreferenceCollator(0, share_prompt=True)(EXAMPLES)
    args = (b["input_ids"], b["attention_mask"], b["completion_mask"])
    with torch.no_grad():
        want = sequence_logps(m, *args, packing=True).logps
        patch_result(monkeypatch, packing, "flat_layout", roll_flat_slots)
        got = sequence_logps(m, *args, packing=True).logps
    assert not torch.allclose(got, want, atol=1e-6)


@pytest.mark.parametrize("share", [True, False], ids=["shared", "plain"])
def test_a_decoder_that_drops_the_keyword_gets_the_one_row_block_mask(monkeypatch, share):
    """Packed into one row, a layer without the plan falls back to transformers' SDPA with the block mask
    (packing.one_row_mask): the same log-probs as the split, so the result never depends on the split being taken."""
    from prefzoo.model.logps import sequence_logps

    m = _model().double()
    b = PreferenceCollator(0, share_prompt=share)(EXAMPLES)
    args = (b["input_ids"], b["attention_mask"], b["completion_mask"])
    with torch.no_grad():
        split = sequence_logps(m, *args, packing=True).logps

        def drops(module, *a, **k):
            k.pop("prefzoo_split")
            return split_sdpa_forward(module, *a, **k)

        monkeypatch.setattr(fastpath_split, "split_sdpa_forward", drops)
        masked = sequence_logps(m, *args, packing=True).logps
    torch.testing.assert_close(masked, split, atol=1e-10, rtol=1e-10)


def test_a_non_finite_sequence_in_the_flat_row_stays_in_its_own_pair():
    """A NaN in one packed sequence (evaluation skips such a pair) leaves every other pair's log-probs as they were,
    under SDPA's math kernel too, which computes masked blocks (a NaN key read into another row's slots would poison
    that row's softmax): the causal part's padding slots lie past every real query, the second part's read the
    row's own first token."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    from prefzoo.model.fast.packing import pack_rows
    from prefzoo.model.logps import sequence_logps

    m = _model().double()
    b = PreferenceCollator(0, share_prompt=True)(EXAMPLES)
    args = (b["input_ids"], b["attention_mask"], b["completion_mask"])
    first = int(pack_rows(*args, shared=True, one_row=True).doc[0, 0]) - 1  # the pair holding flat token 0

    def poison(module, inputs, output):
        if output.shape[0] == 1:  # the flat row
            output = output.clone()
            output[0, 0] = float("nan")
        return output

    with torch.no_grad(), sdpa_kernel(SDPBackend.MATH):
        clean = sequence_logps(m, *args, packing=True).logps
        hook = m.get_input_embeddings().register_forward_hook(poison)
        try:
            got = sequence_logps(m, *args, packing=True).logps
        finally:
            hook.remove()
    pairs = len(EXAMPLES)
    hit = torch.zeros(2 * pairs, dtype=torch.bool)
    hit[[first, pairs + first]] = True  # its chosen and rejected rows
    assert bool(got[hit].isnan().all())
    torch.testing.assert_close(got[~hit], clean[~hit], atol=1e-12, rtol=1e-12)


def test_row_blocks_are_taken_only_when_they_tile_the_flat_row():
    """The row-by-row split reads each row as one slice of the flat row; a layout whose rows leave a gap, or whose row
    is not one block in its collated order, gets no row blocks (the gathered split handles any layout)."""
    seg = _segments(LAYOUTS[sorted(LAYOUTS)[0]])
    flat_of, n = _flat(seg)
    plan = split_plan(seg)
    rows = fastpath_split.flat_layout(plan, seg, flat_of, n).rows
    assert rows is not None and [r[0] for r in rows] == flat_of[:, 0].tolist()
    assert [(l1, p, c) for _, l1, p, c in rows] == [
        (int(((s == PROMPT) | (s == CHOSEN)).sum()), int((s == PROMPT).sum()), int((s == REJECTED).sum())) for s in seg
    ]
    assert fastpath_split.flat_layout(plan, seg, flat_of, n + 1).rows is None  # a gap at the end
    gap = flat_of.clone()
    gap[1:][seg[1:] != 0] += 1  # a gap between rows 0 and 1
    assert fastpath_split.flat_layout(plan, seg, gap, n + 1).rows is None
    swapped = flat_of.clone()
    swapped[0, 1:3] = swapped[0, 1:3].flip(0)  # row 0's second and third tokens swapped: it still tiles
    assert fastpath_split.flat_layout(plan, seg, swapped, n).rows is None
