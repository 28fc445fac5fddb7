"""Gated-SiLU MLPs through SiluMul: the same bits forward and backward, two intermediate-width tensors fewer kept."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

from prefzoo.model.fast.fused_mlp import SiluMul, fuse_gated_mlps
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


def _kept_bytes(out: torch.Tensor, recomputed: set[int]) -> int:
    """Bytes of the distinct storages autograd keeps for ``out``'s backward, found by walking its graph (not through
    saved-tensor hooks, which the fused MLP stands aside for), leaving out storages made by a recomputation."""
    seen: dict[int, int] = {}
    stack, visited = [out.grad_fn], set()
    while stack:
        node = stack.pop()
        if node is None or id(node) in visited:
            continue
        visited.add(id(node))
        names = [a for a in dir(node) if a.startswith("_saved_")] + (
            ["saved_tensors"] if hasattr(node, "saved_tensors") else []
        )
        for attr in names:  # built-in nodes' _saved_* fields; a custom Function's (SiluMul's) saved_tensors
            value = getattr(node, attr)
            for t in value if isinstance(value, tuple) else (value,):
                if isinstance(t, torch.Tensor) and t.untyped_storage().data_ptr() not in recomputed:
                    seen.setdefault(t.untyped_storage().data_ptr(), t.untyped_storage().nbytes())
        stack.extend(fn for fn, _ in node.next_functions)
    return sum(seen.values())


def _kept_against_plain(plain: nn.Module, leaner: nn.Module, monkeypatch) -> tuple[int, int]:
    """(bytes autograd keeps for ``plain`` minus for ``leaner``, recomputations the leaner one's graph holds)."""
    from prefzoo.model.fast import fused_mlp

    recomputed: set[int] = set()
    alive: list[torch.Tensor] = []  # held, so that no two recomputations share an address
    real = fused_mlp._Recipe.recompute

    def recording(self):
        t = real(self)
        recomputed.add(t.untyped_storage().data_ptr())
        alive.append(t)
        return t

    monkeypatch.setattr(fused_mlp._Recipe, "recompute", recording)
    kept_plain = _kept_bytes(plain(input_ids=IDS, attention_mask=ATTN).logits.sum(), set())
    kept = _kept_bytes(leaner(input_ids=IDS, attention_mask=ATTN).logits.sum(), recomputed)
    return kept_plain - kept, len(recomputed)


def test_two_intermediate_width_tensors_fewer_are_kept_per_layer(monkeypatch):
    """Of the four (tokens × intermediate) tensors a gated MLP keeps, the fused one keeps gate(x) and up(x) only:
    SiluMul recomputes silu(gate(x)), and down_proj's input silu(gate(x)) · up(x) is recomputed from them when its
    backward asks for it (saved-tensor hooks), so gradients are the same bits (tested above)."""

    plain = build_model(build_tokenizer(), seed=3)
    fused = copy.deepcopy(plain)
    fuse_gated_mlps(fused)
    fewer, recomputed = _kept_against_plain(plain, fused, monkeypatch)
    assert recomputed == plain.config.num_hidden_layers  # down_proj's input, once per layer
    assert fewer == 2 * plain.config.num_hidden_layers * IDS.numel() * plain.config.intermediate_size * 4


def test_nothing_keeps_the_product_alive_after_the_forward(monkeypatch):
    """Once the forward is done, no reference to silu(gate(x)) · up(x) is left (the graph keeps a recipe, and the
    hooks that autograd keeps with it hold the product's address only): its memory is free for the rest of the step.
    With down_proj saving it, as the plain graph does, autograd keeps it alive."""
    import gc
    import weakref

    from prefzoo.model.fast import fused_mlp

    fused = build_model(build_tokenizer(), seed=3)
    fuse_gated_mlps(fused)
    products: list[weakref.ref] = []
    real = fused_mlp.silu_mul

    def recording(g, u):
        t = real(g, u)
        products.append(weakref.ref(t))
        return t

    monkeypatch.setattr(fused_mlp, "silu_mul", recording)
    logits = fused(input_ids=IDS, attention_mask=ATTN).logits
    gc.collect()
    assert len(products) == fused.config.num_hidden_layers and all(p() is None for p in products)
    monkeypatch.setattr(fused_mlp, "_other_saved_tensor_hooks", lambda: True)  # as under checkpointing
    products.clear()
    logits = fused(input_ids=IDS, attention_mask=ATTN).logits
    gc.collect()
    assert products and all(p() is not None for p in products)  # the measure can tell: here down_proj keeps it
    del logits


def test_under_checkpointing_or_other_saved_tensor_hooks_the_product_is_left_to_them():
    """Gradient checkpointing (and any offloading hook) decides what is kept: the fused MLP adds no hook of its own
    inside theirs, where it would keep gate(x) and up(x) alive that checkpointing means to drop."""
    from prefzoo.model.fast import fused_mlp

    fused = build_model(build_tokenizer(), seed=3)
    fuse_gated_mlps(fused)
    made: list[object] = []
    monkeypatch = pytest.MonkeyPatch()
    real_init = fused_mlp._Recipe.__init__
    monkeypatch.setattr(fused_mlp._Recipe, "__init__", lambda self, *a: (made.append(self), real_init(self, *a))[1])
    try:
        fused(input_ids=IDS, attention_mask=ATTN).logits.sum().backward()
        assert len(made) == fused.config.num_hidden_layers
        made.clear()
        with torch.autograd.graph.saved_tensors_hooks(lambda t: t, lambda t: t):
            fused(input_ids=IDS, attention_mask=ATTN).logits.sum().backward()
        fused.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        fused.train()
        fused(input_ids=IDS, attention_mask=ATTN, use_cache=False).logits.sum().backward()
        assert made == []
    finally:
        monkeypatch.undo()


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
    ("switch", "model_type", "switched"),
    [("mlp", "mistral", {"MistralMLP": 2}), ("mlp", "qwen2", {"Qwen2MLP": 2}), ("mlp", "qwen3", {"Qwen3MLP": 2}),
     ("mlp", "olmo2", {"Olmo2MLP": 2}), ("mlp", "granite", {"GraniteMLP": 2}), ("mlp", "cohere", {"CohereMLP": 2}),
     ("mlp", "gemma2", {}), ("mlp", "phi3", {}), ("mlp", "qwen3_moe", {}),  # GELU gate, fused gate_up, experts
     ("norm", "mistral", {"MistralRMSNorm": 5}), ("norm", "qwen3", {"Qwen3RMSNorm": 9}),
     ("norm", "olmo2", {"Olmo2RMSNorm": 9}), ("norm", "phi3", {"Phi3RMSNorm": 5}),
     ("norm", "qwen3_moe", {"Qwen3MoeRMSNorm": 9}),  # Qwen 3's per-head q/k norms, OLMo 2's off the residual stream
     ("norm", "gemma2", {}), ("norm", "cohere", {}), ("norm", "olmo", {})],  # (1 + w), LayerNorm, weightless
)  # fmt: skip
def test_other_architectures_give_the_same_bits_or_are_left_alone(switch, model_type, switched):
    from prefzoo.model.fast.fused_mlp import lean_rms_norms
    from prefzoo.testing.architectures import build_tiny

    plain = build_tiny(model_type).train()
    leaner = copy.deepcopy(plain)
    assert {"mlp": fuse_gated_mlps, "norm": lean_rms_norms}[switch](leaner) == switched
    _same(plain, leaner)


# --- RMSNorms that keep no normalised copy -------------------------------------------------------------------------


def test_lean_norms_give_the_same_bits_and_keep_one_hidden_width_tensor_fewer_per_norm(monkeypatch):
    from prefzoo.model.fast.fused_mlp import lean_rms_norms

    plain = build_model(build_tokenizer(), seed=3)
    lean = copy.deepcopy(plain)
    norms = 2 * plain.config.num_hidden_layers + 1  # two per layer and the final one
    assert lean_rms_norms(lean) == {"LlamaRMSNorm": norms}
    assert lean.state_dict().keys() == plain.state_dict().keys()
    _same(plain, lean)
    fewer, recomputed = _kept_against_plain(plain, lean, monkeypatch)
    assert recomputed == norms
    assert fewer == norms * IDS.numel() * plain.config.hidden_size * 4


class _OnePlusNorm(nn.Module):
    """Gemma's RMSNorm scales by (1 + w): not Llama's op for op, so the probe must leave it alone."""

    def __init__(self) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.randn(6) * 0.1)
        self.variance_epsilon = 1e-6

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = x.float()
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.variance_epsilon)
        return (h * (1.0 + self.weight.float())).to(x.dtype)


def test_a_norm_that_is_not_llamas_keeps_its_own_forward():
    from prefzoo.model.fast.fused_mlp import lean_rms_norms

    model = nn.Sequential(_OnePlusNorm(), nn.Linear(6, 6))
    assert lean_rms_norms(model) == {} and type(model[0]) is _OnePlusNorm
