"""Gated-SiLU MLPs through SiluMul: the same bits forward and backward, one intermediate-width tensor fewer kept."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

from prefzoo.train.fused_mlp import SiluMul, fuse_gated_mlps
from tests.support.tiny import build_model, build_tokenizer

IDS = torch.tensor([[3, 7, 1, 9, 4, 4, 2, 8], [5, 1, 1, 6, 2, 0, 0, 0]])
ATTN = (IDS != 0).long()


def _loss_and_grads(model: nn.Module) -> tuple[torch.Tensor, torch.Tensor, dict[str, torch.Tensor]]:
    model.zero_grad()
    logits = model(input_ids=IDS, attention_mask=ATTN).logits
    loss = torch.log_softmax(logits.float(), -1)[..., 1:5].pow(2).mean()
    loss.backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    return logits.detach(), loss.detach(), grads


def _same(a: nn.Module, b: nn.Module) -> None:
    la, va, ga = _loss_and_grads(a)
    lb, vb, gb = _loss_and_grads(b)
    assert torch.equal(la, lb) and torch.equal(va, vb)
    assert ga.keys() == gb.keys() and len(ga) > 0
    for name in ga:
        assert torch.equal(ga[name], gb[name]), name


def test_fused_llama_gives_the_same_bits_forward_and_backward():
    plain = build_model(build_tokenizer(), seed=3)
    fused = copy.deepcopy(plain)
    assert fuse_gated_mlps(fused) == {"LlamaMLP": 2}
    pairs = zip(fused.model.layers, plain.model.layers, strict=True)
    assert all(type(f.mlp).forward is not type(p.mlp).forward for f, p in pairs)
    assert fused.state_dict().keys() == plain.state_dict().keys()
    _same(plain, fused)


def test_fused_under_lora_with_dropout_gives_the_same_bits():
    from peft import LoraConfig, get_peft_model

    cfg = LoraConfig(r=4, lora_alpha=8, lora_dropout=0.0, target_modules=["gate_proj", "up_proj", "down_proj"])
    plain = get_peft_model(build_model(build_tokenizer(), seed=3), cfg)
    for name, p in plain.named_parameters():  # non-zero adapters, so their gradients flow through the product
        if "lora_B" in name:
            torch.nn.init.normal_(p, std=0.1, generator=torch.Generator().manual_seed(len(name)))
    fused = copy.deepcopy(plain)
    assert fuse_gated_mlps(fused) == {"LlamaMLP": 2}
    _same(plain, fused)
    lora = LoraConfig(r=4, lora_dropout=0.5, target_modules=["gate_proj"], init_lora_weights=False)  # B ≠ 0
    drop = get_peft_model(build_model(build_tokenizer(), seed=3), lora)
    assert fuse_gated_mlps(drop.train()) == {"LlamaMLP": 2}  # the probe runs in eval mode: dropout does not refuse it
    assert drop.training and all(m.training for m in drop.modules())  # and the modes are restored


def test_one_intermediate_width_tensor_fewer_is_kept_per_layer():
    plain = build_model(build_tokenizer(), seed=3)
    fused = copy.deepcopy(plain)
    fuse_gated_mlps(fused)

    def kept_bytes(model: nn.Module) -> int:
        seen: dict[int, int] = {}

        def pack(t: torch.Tensor) -> torch.Tensor:
            seen.setdefault(t.untyped_storage().data_ptr(), t.untyped_storage().nbytes())
            return t

        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            model(input_ids=IDS, attention_mask=ATTN).logits.sum()
        return sum(seen.values())

    inter = plain.config.intermediate_size
    assert kept_bytes(plain) - kept_bytes(fused) == plain.config.num_hidden_layers * IDS.numel() * inter * 4


class _ScaledMLP(nn.Module):
    """A gated-SiLU MLP whose forward is not the plain pattern: the probe must refuse it."""

    def __init__(self) -> None:
        super().__init__()
        self.gate_proj, self.up_proj, self.down_proj = nn.Linear(4, 6), nn.Linear(4, 6), nn.Linear(6, 4)
        self.act_fn = nn.SiLU()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(self.act_fn(self.gate_proj(x)) * self.up_proj(x) * 0.5)


class _GeluMLP(_ScaledMLP):
    def __init__(self) -> None:
        super().__init__()
        self.act_fn = nn.GELU()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(self.act_fn(self.gate_proj(x)) * self.up_proj(x))


@pytest.mark.parametrize("cls", [_ScaledMLP, _GeluMLP])
def test_other_mlps_keep_their_own_forward(cls):
    model = nn.Sequential(cls())
    assert fuse_gated_mlps(model) == {}
    assert type(model[0]) is cls


def test_silu_mul_backward_is_autograds():
    g = torch.randn(5, 7, dtype=torch.float64, requires_grad=True)
    u = torch.randn(5, 7, dtype=torch.float64, requires_grad=True)
    torch.autograd.gradcheck(SiluMul.apply, (g, u))
    w = torch.randn(5, 7, dtype=torch.float64)
    mine = torch.autograd.grad((SiluMul.apply(g, u) * w).sum(), (g, u))
    theirs = torch.autograd.grad((torch.nn.functional.silu(g) * u * w).sum(), (g, u))
    assert all(torch.equal(a, b) for a, b in zip(mine, theirs, strict=True))


@pytest.mark.parametrize(
    ("model_type", "switched"),
    [("mistral", {"MistralMLP": 2}), ("qwen2", {"Qwen2MLP": 2}), ("qwen3", {"Qwen3MLP": 2}), ("olmo2", {"Olmo2MLP": 2}),
     ("granite", {"GraniteMLP": 2}), ("cohere", {"CohereMLP": 2}),
     ("gemma2", {}), ("phi3", {}), ("qwen3_moe", {})],  # GELU gate, fused gate_up_proj, grouped experts: left alone
)  # fmt: skip
def test_other_architectures_give_the_same_bits_or_are_left_alone(model_type, switched):
    from prefzoo.testing.architectures import build_tiny

    plain = build_tiny(model_type).train()
    fused = copy.deepcopy(plain)
    assert fuse_gated_mlps(fused) == switched
    _same(plain, fused)
