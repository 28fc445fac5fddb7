"""Gated-SiLU MLPs (SwiGLU) that keep two intermediate-width activations fewer for backward, bit for bit the same.

transformers' gated MLPs (Llama, Mistral, Qwen2/3, OLMo, Granite, ...) compute ``down(act(gate(x)) * up(x))``.  With
SiLU as ``act``, autograd keeps gate(x) for SiLU's backward, silu(gate(x)) and up(x) for the product's, and down_proj
keeps the product: four tensors of the intermediate width per layer, usually a decoder layer's largest activations.
:class:`SiluMul` keeps gate(x) and up(x) only and recomputes silu(gate(x)) in backward with the kernels autograd runs
(``silu``, ``mul``, ``silu_backward``), so values and gradients are the same bits (tested).  down_proj's copy of the
product is replaced, through saved-tensor hooks, by a recipe: its backward gets silu(g) · u recomputed from the g and
u already kept, with SiluMul's own kernels, so the same bits again.  Two of the four are kept.  An 8B Llama
(intermediate 14,336) at 2 × 4 rows of 2,048 tokens in bf16 keeps ~940 MB less per layer.  Where other saved-tensor
hooks are active (gradient checkpointing, offloading) the module adds none: they decide what is kept.

:func:`fuse_gated_mlps` switches a model's MLP modules to it: only modules whose class, probed once on a few random
tokens, gives exactly the fused result (a class that adds, scales or drops anything keeps its own forward) and only
SiLU activations (``gelu_pytorch_tanh`` gated MLPs such as Gemma's keep theirs).  The switch changes each module's
class to a subclass with the fused ``forward``: parameters, state-dict keys, peft targets and ``isinstance`` checks are
unchanged.
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch import Tensor, nn

from prefzoo._thirdparty import saved_tensor_hooks_active

__all__ = ["SiluMul", "fuse_gated_mlps", "silu_mul"]


class SiluMul(torch.autograd.Function):
    """silu(g) * u, keeping g and u (not silu(g)) for backward."""

    @staticmethod
    def forward(ctx: Any, g: Tensor, u: Tensor) -> Tensor:  # type: ignore[override]
        ctx.save_for_backward(g, u)
        return _silu_product(g, u)

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor | None, Tensor | None]:  # type: ignore[override]
        g, u = ctx.saved_tensors
        grad_g = torch.ops.aten.silu_backward(grad * u, g) if ctx.needs_input_grad[0] else None  # mul's, then silu's
        grad_u = grad * torch.nn.functional.silu(g) if ctx.needs_input_grad[1] else None
        return grad_g, grad_u


def silu_mul(g: Tensor, u: Tensor) -> Tensor:
    """silu(g) * u; through :class:`SiluMul` when autograd would keep anything, else plainly."""
    if torch.is_grad_enabled() and (g.requires_grad or u.requires_grad):
        return SiluMul.apply(g, u)  # type: ignore[no-any-return]
    return _silu_product(g, u)


def _fused_forward(self: Any, x: Tensor) -> Tensor:
    g, u = self.gate_proj(x), self.up_proj(x)
    product = silu_mul(g, u)
    with recomputed_when_saved(product, _silu_product, g, u):  # down_proj's input: recomputed from g and u
        return self.down_proj(product)  # type: ignore[no-any-return]


def _silu_product(g: Tensor, u: Tensor) -> Tensor:
    return torch.nn.functional.silu(g) * u  # SiluMul.forward's, and the recipe's: the bits down_proj was given


def _other_saved_tensor_hooks() -> bool:
    """Saved-tensor hooks already active (checkpointing, offloading): they decide what is kept, not this module."""
    return saved_tensor_hooks_active()


class _Recipe:
    """What autograd keeps instead of a tensor it could recompute: the function, its inputs (tensors autograd keeps
    anyway) and the size, stride and offset of the view that was saved."""

    __slots__ = ("args", "fn", "offset", "size", "stride")

    def __init__(self, fn: Callable[..., Tensor], args: tuple[Any, ...], saved: Tensor) -> None:
        self.fn, self.args = fn, args
        self.size, self.stride, self.offset = saved.size(), saved.stride(), saved.storage_offset()

    def recompute(self) -> Tensor:
        with torch.no_grad():
            return self.fn(*self.args).as_strided(self.size, self.stride, self.offset)


@contextlib.contextmanager
def recomputed_when_saved(target: Tensor, fn: Callable[..., Tensor], *args: Any) -> Iterator[None]:
    """Inside, autograd keeps ``fn(*args)``'s recipe wherever it would keep ``target`` (or a view of it) for
    backward; the backward gets it recomputed, the same bits when ``fn`` runs the kernels that made ``target``.

    Nothing changes where ``target`` needs no gradient or other saved-tensor hooks are active (checkpointing,
    offloading: they decide).  The hooks outlive the forward with the saved tensors, so they hold ``target``'s
    address and dtype, never ``target`` itself (which would keep it alive)."""
    if not target.requires_grad or _other_saved_tensor_hooks():
        yield
        return
    storage, dtype, device = target.untyped_storage().data_ptr(), target.dtype, target.device

    def pack(t: Tensor) -> Any:
        same = type(t) is Tensor and t.dtype == dtype and t.device == device
        return _Recipe(fn, args, t) if same and t.untyped_storage().data_ptr() == storage else t

    def unpack(saved: Any) -> Tensor:
        return saved.recompute() if isinstance(saved, _Recipe) else saved  # type: ignore[no-any-return]

    with torch.autograd.graph.saved_tensors_hooks(pack, unpack):
        yield


_SWITCHED: dict[tuple[type, str], type] = {}  # (original class, prefix) -> its switched subclass


def _is_silu(act: Any) -> bool:
    return isinstance(act, nn.SiLU) or type(act).__name__ == "SiLUActivation"


def _gated(module: nn.Module) -> bool:
    parts = ("gate_proj", "up_proj", "down_proj")
    return all(isinstance(getattr(module, p, None), nn.Module) for p in parts) and _is_silu(
        getattr(module, "act_fn", None)
    )


def _rms_norm(module: nn.Module) -> bool:
    w = getattr(module, "weight", None)
    eps = getattr(module, "variance_epsilon", None)
    return isinstance(w, nn.Parameter) and w.dim() == 1 and isinstance(eps, float) and len(list(module.children())) == 0


def _lean_norm_forward(self: Any, hidden_states: Tensor) -> Tensor:
    """Llama's RMSNorm, op for op, with the normalised tensor the weight's gradient needs recomputed from the input
    and 1/rms (kept anyway) instead of kept: one hidden-width activation fewer per norm, same bits."""
    input_dtype = hidden_states.dtype
    h = hidden_states.to(torch.float32)
    r = torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.variance_epsilon)
    normed = _normalised(h, r, input_dtype)  # the recipe below runs this same function: the same bits
    with recomputed_when_saved(normed, _normalised, h, r, input_dtype):
        return self.weight * normed  # type: ignore[no-any-return]


def _normalised(h: Tensor, r: Tensor, dtype: torch.dtype) -> Tensor:
    return (h * r).to(dtype)


def _probe(module: nn.Module, forward: Callable[[Any, Tensor], Tensor], width: int, w: Tensor) -> bool:
    """The class's own forward and ``forward`` agree exactly on three random tokens (no gradient, eval mode: a
    LoRA adapter's dropout would make two calls differ)."""
    modes = [(m, m.training) for m in module.modules()]
    module.eval()
    try:
        dtype = w.dtype if w.is_floating_point() else torch.float32  # quantised weights: the compute dtype
        gen = torch.Generator(device="cpu").manual_seed(0)
        x = torch.randn(1, 3, width, generator=gen).to(device=w.device, dtype=dtype)
        with torch.no_grad():
            return bool(torch.equal(type(module).forward(module, x), forward(module, x)))
    except Exception:  # a partitioned (sharded) or unusual module: leave it as it is
        return False
    finally:
        for m, training in modes:
            m.training = training


def _switched_class(cls: type, prefix: str, forward: Callable[..., Tensor]) -> type:
    if (cls, prefix) not in _SWITCHED:
        name = f"{prefix}{cls.__name__}"
        switched = type(name, (cls,), {"forward": forward, "__module__": __name__, "__qualname__": name})
        setattr(sys.modules[__name__], name, switched)  # findable by pickle
        _SWITCHED[(cls, prefix)] = switched
    return _SWITCHED[(cls, prefix)]


def _switch(
    model: nn.Module,
    pick: Callable[[nn.Module], bool],
    probe: Callable[[nn.Module], bool],
    prefix: str,
    forward: Callable[..., Tensor],
) -> dict[str, int]:
    done: dict[str, int] = {}
    passed: dict[type, bool] = {}  # probed once per class, in this model
    for module in model.modules():
        cls = type(module)
        if cls in _SWITCHED.values() or not pick(module):
            continue
        if cls not in passed:
            passed[cls] = probe(module)
        if not passed[cls]:
            continue
        module.__class__ = _switched_class(cls, prefix, forward)
        done[cls.__name__] = done.get(cls.__name__, 0) + 1
    return done


def fuse_gated_mlps(model: nn.Module) -> dict[str, int]:
    """Switch every gated-SiLU MLP of ``model`` whose class passes the probe to :class:`SiluMul`; returns
    {original class name: modules switched}."""

    def probe(m: Any) -> bool:
        return _probe(m, _fused_forward, int(m.gate_proj.in_features), m.gate_proj.weight)

    return _switch(model, _gated, probe, "SiluMulFused", _fused_forward)


def lean_rms_norms(model: nn.Module) -> dict[str, int]:
    """Switch every RMSNorm of ``model`` whose own forward is Llama's, op for op (probed: Gemma's 1 + w, OLMo's order
    and the like keep theirs), to one that keeps no normalised copy for backward; {class name: modules switched}."""

    def probe(m: Any) -> bool:
        return _probe(m, _lean_norm_forward, int(m.weight.shape[0]), m.weight)

    return _switch(model, _rms_norm, probe, "Lean", _lean_norm_forward)
