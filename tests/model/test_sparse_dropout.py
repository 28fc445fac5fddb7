"""Sparse dropout: each element dropped independently with probability p, kept ones the bits torch's dropout gives."""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

from prefzoo.model.fast import sparse_dropout as sd
from prefzoo.model.fast.sparse_dropout import SparseDropout, drop_positions, sparse_dropout, sparsify_dropout


def _within(count: float, n: int, p: float, sds: float = 5.0) -> bool:
    """``count`` successes of ``n`` Bernoulli(p) trials lies within ``sds`` standard deviations of n·p."""
    return abs(count - n * p) <= sds * math.sqrt(n * p * (1 - p))


@pytest.mark.parametrize("p", [0.01, 0.1, 0.25])
def test_each_position_is_dropped_independently_with_probability_p(p):
    """Many draws over a short tensor: every position's own rate, and every neighbouring pair's joint rate, is p and
    p²; so an off-by-one at either end, a wrong rate or gaps that are not geometric all show."""
    n, draws = 6, 6000
    gen = torch.Generator().manual_seed(7)
    hits = torch.zeros(draws, n, dtype=torch.bool)
    for i in range(draws):
        pos = drop_positions(n, p, generator=gen)
        assert bool((pos[1:] > pos[:-1]).all()) and (pos.numel() == 0 or 0 <= int(pos[0]) <= int(pos[-1]) < n)
        hits[i, pos] = True
    for j in range(n):
        assert _within(int(hits[:, j].sum()), draws, p), (j, int(hits[:, j].sum()))
    for j in range(n - 1):
        assert _within(int((hits[:, j] & hits[:, j + 1]).sum()), draws, p * p), j


@pytest.mark.parametrize("p", [0.01, 0.2])
def test_a_long_tensor_gets_binomial_counts_and_geometric_gaps(p):
    n = 400_000
    pos = drop_positions(n, p, generator=torch.Generator().manual_seed(3))
    assert _within(pos.numel(), n, p)
    for quarter in range(4):  # spread over the whole tensor, the end included
        inside = ((pos >= quarter * n // 4) & (pos < (quarter + 1) * n // 4)).sum()
        assert _within(int(inside), n // 4, p)
    gaps = torch.diff(pos).double()
    assert gaps.mean().item() == pytest.approx(1 / p, rel=0.03)
    assert gaps.var().item() == pytest.approx((1 - p) / p**2, rel=0.1)  # geometric, not evenly spaced


def test_short_first_draws_go_on_to_the_end(monkeypatch):
    """With the first draw forced short, the positions still cover [0, n) at rate p (the extension loop)."""
    n, p = 20_000, 0.1
    monkeypatch.setattr(sd, "SLACK_SD", -30.0)  # 2,000 + (−30 × 42.4) + 16 ≈ 743 gaps a draw: three draws or more
    pos = drop_positions(n, p, generator=torch.Generator().manual_seed(5))
    assert _within(pos.numel(), n, p)
    assert _within(int((pos >= 3 * n // 4).sum()), n // 4, p)
    assert int(pos[-1]) < n


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float64])
@pytest.mark.parametrize("p", [0.01, 0.15, sd.SPARSE_MAX_P])
def test_kept_values_and_gradients_are_torchs_dropout_bits(dtype, p):
    """Where both keep an element, the output and the input gradient are the bits torch's own CPU dropout gives (its
    scale is rounded in the input's dtype: 1/(1 − 0.15) in float32 and every bf16 scale here differ from a rounded
    x · (1 / (1 − p)))."""
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(70, 50, 90, generator=gen).to(dtype).transpose(0, 2).requires_grad_()  # not contiguous
    g = torch.randn(90, 50, 70, generator=gen).to(dtype)
    out = sparse_dropout(x, p)
    ref = torch.nn.functional.dropout(x, p)
    both = (out != 0) & (ref != 0)
    assert out.shape == x.shape and _within(int((out == 0).sum()), x.numel(), p)
    assert torch.equal(out[both], ref[both])
    (grad,) = torch.autograd.grad(out, x, g)
    (ref_grad,) = torch.autograd.grad(ref, x, g)
    assert torch.equal(grad[both], ref_grad[both]) and bool((grad[out == 0] == 0).all())


def test_the_drops_follow_torchs_generator_and_are_reproducible():
    x = torch.randn(64, 64)
    torch.manual_seed(11)
    a = sparse_dropout(x, 0.05)
    torch.manual_seed(11)
    b = sparse_dropout(x, 0.05)
    c = sparse_dropout(x, 0.05)
    assert torch.equal(a, b) and not torch.equal(b, c)


def test_it_keeps_only_the_dropped_positions_for_backward():
    x = torch.randn(512, 256, requires_grad=True)
    kept: list[torch.Tensor] = []
    with torch.autograd.graph.saved_tensors_hooks(lambda t: kept.append(t) or t, lambda t: t):
        sparse_dropout(x, 0.01)
    assert sorted(t.numel() for t in kept)[0] == 1  # the scale
    positions = max(kept, key=torch.numel)
    assert positions.dtype == torch.int32 and positions.numel() < 0.02 * x.numel()


def test_torchs_dropout_runs_where_drawing_gaps_does_not_pay():
    x = torch.randn(40, 40)
    assert sparse_dropout(x, 0.1, training=False) is x and sparse_dropout(x, 0.0) is x
    torch.manual_seed(2)
    at_limit = sparse_dropout(x, sd.SPARSE_MAX_P)  # the largest rate that still draws gaps
    torch.manual_seed(2)
    assert not torch.equal(at_limit, torch.nn.functional.dropout(x, sd.SPARSE_MAX_P))
    for p in (sd.SPARSE_MAX_P + 0.01, 0.5):  # larger rates: torch's dropout, the same numbers for the same seed
        torch.manual_seed(2)
        got = sparse_dropout(x, p)
        torch.manual_seed(2)
        assert torch.equal(got, torch.nn.functional.dropout(x, p))
    torch.manual_seed(2)
    got = sparse_dropout(x.clone(), 0.1, inplace=True)
    torch.manual_seed(2)
    assert torch.equal(got, torch.nn.functional.dropout(x.clone(), 0.1, inplace=True))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device: its dropout is one fused kernel")
def test_an_accelerator_tensor_takes_torchs_dropout():
    x = torch.randn(40, 40, device="cuda")
    torch.manual_seed(2)
    got = sparse_dropout(x, 0.1)
    torch.manual_seed(2)
    assert torch.equal(got, torch.nn.functional.dropout(x, 0.1))


def test_sparsify_switches_plain_dropout_modules_at_small_rates_only():
    class Custom(nn.Dropout):
        pass

    model = nn.Sequential(nn.Dropout(0.1), nn.Dropout(0.5), nn.Dropout(0.0), Custom(0.1), nn.Dropout(0.1))
    assert sparsify_dropout(model) == {0.1: 2}
    assert [type(m).__name__ for m in model] == ["SparseDropout", "Dropout", "Dropout", "Custom", "SparseDropout"]
    assert isinstance(model[0], SparseDropout) and isinstance(model[0], nn.Dropout) and model[0].p == 0.1
    model.eval()
    x = torch.randn(3, 4)
    assert torch.equal(model(x), x)  # eval mode: nothing dropped, as nn.Dropout


def test_a_lora_model_trains_through_sparse_dropout_with_the_same_state_dict():
    from prefzoo.model.loading import apply_lora
    from tests.support.tiny import build_model, build_tokenizer

    lm = apply_lora(build_model(build_tokenizer(), seed=3), 4, 8, 0.05, ["q_proj", "v_proj"])
    keys = list(lm.state_dict())
    assert sparsify_dropout(lm) == {0.05: 4}  # 2 layers × (q_proj, v_proj)
    assert list(lm.state_dict()) == keys
    with torch.no_grad():
        for n, p in lm.named_parameters():
            if "lora_B" in n:
                p.normal_(0, 0.5)  # lora_B starts at zero: without this no gradient reaches lora_A through the dropout
    lm.train()
    ids = torch.randint(0, lm.config.vocab_size, (2, 12))
    lm(input_ids=ids).logits.sum().backward()
    grads = [p.grad for n, p in lm.named_parameters() if "lora_A" in n]
    assert grads and all(g is not None and bool(g.abs().sum() > 0) for g in grads)


@pytest.mark.parametrize("on", [True, False])
def test_the_trainer_switches_lora_dropout_and_says_so_unless_told_not_to(on, tiny_dir, pairs_file, tmp_path, capsys):
    from tests.train.helpers import base_config, run_inprocess

    cfg = base_config(
        tiny_dir, pairs_file, tmp_path, max_steps=1, lora=True, lora_r=4, lora_alpha=4, lora_dropout=0.05,
        lora_target_modules=["q_proj", "v_proj"], sparse_dropout=on,
    )  # fmt: skip
    result = run_inprocess(cfg)
    kinds = {type(m).__name__ for n, m in result.model.named_modules() if n.endswith("lora_dropout.default")}
    assert kinds == ({"SparseDropout"} if on else {"Dropout"})
    said = "dropout draws only the dropped positions on CPU" in capsys.readouterr().out
    assert said == on


def test_gradient_checkpointing_recomputes_the_same_drops():
    """Checkpointing reruns each layer's forward in backward with torch's RNG state restored: the recomputed dropout
    draws the same positions, so the gradients equal the ones without checkpointing exactly."""
    from prefzoo.model.loading import apply_lora
    from tests.support.tiny import build_model, build_tokenizer

    def grads(checkpointing: bool) -> dict[str, torch.Tensor]:
        lm = apply_lora(build_model(build_tokenizer(), seed=3), 4, 8, 0.1, ["q_proj", "v_proj", "up_proj"])
        with torch.no_grad():
            for n, p in lm.named_parameters():
                if "lora_B" in n:
                    p.normal_(0, 0.5)
        assert sparsify_dropout(lm) == {0.1: 6}
        if checkpointing:
            lm.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        lm.train()
        torch.manual_seed(5)
        ids = torch.randint(0, lm.config.vocab_size, (2, 12))
        lm(input_ids=ids, use_cache=False).logits.pow(2).sum().backward()
        return {n: p.grad for n, p in lm.named_parameters() if p.grad is not None}

    plain, checkpointed = grads(False), grads(True)
    assert plain.keys() == checkpointed.keys() and len(plain) == 12
    assert all(torch.equal(plain[k], checkpointed[k]) for k in plain)
