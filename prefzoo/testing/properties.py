"""The generic properties every loss must satisfy, as plain functions ``check(loss, batch)`` that raise on failure.

Each function raises :class:`PropertyFailure` (an AssertionError) with a message
naming the example, the values and the tolerance.  They are used by the
conformance kit (:mod:`prefzoo.testing.conformance`), by prefzoo's own property
tests, and by the mutation check that shows each one can fail.

Tolerances are stated per dtype: losses compute bfloat16/float16 inputs in
float32 (``Loss`` upcasts), so both low-precision comparisons use the float32
unit roundoff u = 2⁻²⁴ against a float64 evaluation on the *same* rounded
inputs, scaled by the loss's measured conditioning (see :func:`check_low_precision`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from prefzoo.spec import Loss, LossOutputError, LossParamError, LossSpec, param_infos
from prefzoo.testing.sharding import map_fields, run_sharded, shard_batch, split_sizes
from prefzoo.types import CONSTANT_FIELDS, FLOAT_FIELDS, LossOutput, Need, PreferenceBatch, Shape, present_fields

__all__ = [
    "GENERIC_PROPERTIES",
    "Property",
    "PropertyFailure",
    "cast_batch",
    "check_batch_decoupled",
    "check_detached_rewards",
    "check_finite",
    "check_low_precision",
    "check_matches_reference",
    "check_monotone",
    "check_permutation",
    "check_reference_free",
    "check_shape",
    "check_sharded_gather",
    "check_shift_invariance",
    "grads",
]

U32 = 2.0**-24  # float32 unit roundoff
U64 = 2.0**-53
_GRAD_FIELDS = tuple(f for f in FLOAT_FIELDS if f not in CONSTANT_FIELDS)


class PropertyFailure(AssertionError):
    """A property does not hold on a given batch; the message says where and by how much."""


def _fail(msg: str) -> None:
    raise PropertyFailure(msg)


def _float_and_grad_fields(batch: Any) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """(the float fields, the differentiable ones among them) of a batch of any shape."""
    if isinstance(batch, PreferenceBatch):
        return FLOAT_FIELDS, _GRAD_FIELDS
    return type(batch).FLOAT_FIELDS, type(batch).GRAD_FIELDS


def _fresh_leaves(batch: Any, dtype: torch.dtype | None, requires_grad: bool) -> Any:
    """A copy of a batch of any shape whose float fields are fresh leaves (of ``dtype`` if given)."""
    float_fields, grad_fields = _float_and_grad_fields(batch)
    ch: dict[str, Any] = {}
    for name, t in present_fields(batch, float_fields):
        t = t.detach().to(dtype) if dtype is not None else t.detach().clone()
        ch[name] = t.requires_grad_(requires_grad and name in grad_fields)
    return batch.replace(**ch)


def _grads_of(loss: Callable[..., LossOutput], batch: Any, **kw: Any) -> tuple[LossOutput, dict[str, Tensor]]:
    """The loss and the gradients of Σ L with respect to every differentiable field of a batch of any shape."""
    out = loss(batch, **kw)
    leaves = {n: t for n, t in present_fields(batch, _float_and_grad_fields(batch)[1]) if t.requires_grad}
    if not leaves or not out.losses.requires_grad:
        return out, {}
    g = torch.autograd.grad(out.losses.sum(), list(leaves.values()), allow_unused=True)
    pairs = zip(leaves.items(), g, strict=True)
    return out, {n: (gi if gi is not None else torch.zeros_like(t)) for (n, t), gi in pairs}


def cast_batch(batch: PreferenceBatch, dtype: torch.dtype | None = None, requires_grad: bool = True) -> PreferenceBatch:
    """A copy whose float fields are fresh leaves (of ``dtype`` if given); differentiable fields require grad."""
    return _fresh_leaves(batch, dtype, requires_grad)  # type: ignore[no-any-return]


def _take(batch: Any, idx: Tensor, dim: int = 0) -> Any:
    """A copy of a batch of any shape holding the entries ``idx`` along ``dim`` (example ids follow along dim 0)."""
    return batch.replace(**map_fields(
        batch, lambda t: t.detach().index_select(dim, idx).clone().requires_grad_(t.requires_grad),
        lambda ids: tuple(ids[i] for i in idx.tolist()) if dim == 0 else ids))


def grads(loss: Callable[..., LossOutput], batch: PreferenceBatch, **kw: Any) -> tuple[LossOutput, dict[str, Tensor]]:
    """Evaluate the loss and the gradients of Σ_i L_i with respect to every differentiable batch field."""
    return _grads_of(loss, batch, **kw)


def _where(t: Tensor, bad: Tensor) -> str:
    idx = torch.nonzero(bad)[0].tolist()
    return f"[{', '.join(map(str, idx))}] = {t.detach()[tuple(idx)].item()!r}"


def _example(batch: PreferenceBatch, i: int) -> str:
    parts = []
    for n in ("policy_chosen_logps", "policy_rejected_logps", "ref_chosen_logps", "ref_rejected_logps",
              "chosen_lengths", "rejected_lengths"):
        t = getattr(batch, n)
        if t is not None:
            parts.append(f"{n}={t.detach()[i].item()!r}")
    return "example " + str(i) + " (" + ", ".join(parts) + ")"


def _close(name: str, got: Tensor, want: Tensor, tol: Tensor | float, batch: PreferenceBatch | None, what: str) -> None:
    got64, want64 = got.detach().to(torch.float64), want.detach().to(torch.float64)
    err = (got64 - want64).abs()
    tol_t = torch.as_tensor(tol, dtype=torch.float64).expand_as(err)
    bad = ~(err <= tol_t) | (torch.isfinite(got64) != torch.isfinite(want64))
    if bool(bad.any()):
        i = int(torch.nonzero(bad.flatten())[0])
        ex = f" at {_example(batch, i)}" if batch is not None and got.ndim == 1 else f" at index {i}"
        _fail(
            f"{name}: {what}{ex}: got {got64.flatten()[i].item()!r}, expected {want64.flatten()[i].item()!r} "
            f"(|error| {err.flatten()[i].item():.3g} > tolerance {tol_t.flatten()[i].item():.3g})"
        )


# --- the generic properties -------------------------------------------------------------------


def check_finite(loss: Loss, batch: PreferenceBatch) -> None:
    """Losses, scores and the gradients of Σ L with respect to every policy input are finite."""
    b = cast_batch(batch)
    out, g = grads(loss, b)
    for field_name in ("losses", "chosen_rewards", "rejected_rewards"):
        t = getattr(out, field_name).detach()
        if not bool(torch.isfinite(t).all()):
            bad = ~torch.isfinite(t)
            i = int(torch.nonzero(bad)[0])
            _fail(f"{loss.name}: {field_name}{_where(t, bad)} is not finite at {_example(b, i)} (dtype {t.dtype})")
    for n, gi in g.items():
        if not bool(torch.isfinite(gi).all()):
            bad = ~torch.isfinite(gi)
            i = int(torch.nonzero(bad)[0, 0])
            _fail(f"{loss.name}: ∂ΣL/∂{n}{_where(gi, bad)} is not finite at {_example(b, i)}")


def check_shape(loss: Loss, batch: PreferenceBatch) -> None:
    """One loss per pair: losses, chosen_rewards and rejected_rewards have shape (B,); losses are differentiable."""
    b = cast_batch(batch)
    try:
        out = loss(b)
    except LossOutputError as e:  # Loss.__call__ enforces the shapes first: a wrong shape is this property failing
        _fail(str(e))
    n = b.batch_size
    for field_name in ("losses", "chosen_rewards", "rejected_rewards"):
        t = getattr(out, field_name)
        if tuple(t.shape) != (n,) or not t.is_floating_point():
            _fail(f"{loss.name}: {field_name} has shape {tuple(t.shape)} and dtype {t.dtype}; expected ({n},) float")
    if not out.losses.requires_grad:
        _fail(f"{loss.name}: losses do not require grad although policy log-probs do: the graph was cut")


def check_detached_rewards(loss: Loss, batch: PreferenceBatch) -> None:
    """Scores and metrics are detached, so logging them cannot keep the graph alive or leak gradient."""
    out = loss(cast_batch(batch))
    for field_name in ("chosen_rewards", "rejected_rewards"):
        if getattr(out, field_name).requires_grad:
            _fail(f"{loss.name}: {field_name} requires grad; return it .detach()ed")
    for k, v in out.metrics.items():
        if isinstance(v, Tensor) and v.requires_grad:
            _fail(f"{loss.name}: metrics[{k!r}] requires grad; return it .detach()ed")


def seeded_permutation(n: int) -> Tensor:
    """A permutation of ``n`` seeded by ``n``, never the identity for n > 1 (the seeded draw for 2 is: reversed)."""
    perm = torch.randperm(n, generator=torch.Generator().manual_seed(n))
    return torch.flip(perm, (0,)) if n > 1 and bool((perm == torch.arange(n)).all()) else perm


def check_permutation(loss: Loss, batch: PreferenceBatch) -> None:
    """Permuting the pairs permutes the per-example losses (batch-coupled too: min, max and sort are symmetric)."""
    b = cast_batch(batch, torch.float64)
    perm, base, permuted = _permuted_losses(loss, b)
    tol = 1e-9 * (1 + base.abs().max())
    _close(loss.name, permuted, base[perm], tol, _take(b, perm), f"losses after permutation {perm.tolist()}")


def _permuted_losses(loss: Loss, b: Any) -> tuple[Tensor, Tensor, Tensor]:
    """(the seeded permutation of the examples, the losses, the losses of the permuted batch), detached."""
    perm = seeded_permutation(b.batch_size)
    base = loss(b).losses.detach()
    return perm, base, loss(_take(b, perm)).losses.detach()


def _perturbed_params(loss: Loss, s: float) -> Any:
    p = loss.params
    if not dataclasses.is_dataclass(p):
        return p
    ch = {}
    for info in param_infos(type(p)):
        v = getattr(p, info.name)
        if isinstance(v, float):
            ch[info.name] = v * (1 + s)
    try:
        return loss.spec.params(**{**{i.name: getattr(p, i.name) for i in param_infos(type(p))}, **ch})
    except (LossParamError, TypeError):
        return p


def _sensitivity(loss: Loss, b64: Any, u: float, draws: int = 8, directional: bool = True) -> tuple[Tensor, Tensor]:
    """(float64 losses, max change under relative ±u perturbations of every float input and parameter).

    With ``directional`` (pairs), the first two patterns move the chosen and the rejected inputs in opposite
    directions (+/− then −/+), so the margin's sensitivity is always measured (random signs alone leave it
    unmeasured whenever they happen to agree); the rest are random sign patterns.  A batch of any shape."""
    base = loss(b64).losses.detach()
    gen = torch.Generator().manual_seed(b64.batch_size)
    worst = torch.zeros_like(base)
    for k in range(draws):
        ch = {}
        for name, t in present_fields(b64, _float_and_grad_fields(b64)[0]):
            if name == "scores":  # a list's scores only rank: perturbing them would reorder ties
                continue
            if directional and k < 2:
                sign = torch.full_like(t, 1.0 if ("chosen" in name) != (k == 1) else -1.0)
            else:
                sign = torch.randint(0, 2, t.shape, generator=gen, dtype=torch.int64).to(t.dtype) * 2 - 1
            ch[name] = t.detach() * (1 + u * sign)
        pert = Loss(loss.spec, _perturbed_params(loss, u if k % 2 else -u))
        worst = torch.maximum(worst, (pert(b64.replace(**ch)).losses.detach() - base).abs())
    return base, worst


def check_low_precision(loss: Loss, batch: PreferenceBatch, dtypes: tuple[torch.dtype, ...] = (
        torch.bfloat16, torch.float32)) -> None:
    """bf16 and fp32 inputs give losses within the stated tolerance of float64 on the same (rounded) inputs.

    Tolerance, per example:  16·Δ_u + 16·u·(1 + |L₆₄|), where u = 2⁻²⁴ (the
    computation runs in float32) and Δ_u is the largest change of the float64
    loss when every float input and parameter is perturbed by a relative ±u
    (8 random sign patterns).  A backward-stable implementation stays well
    inside it; a naive log(exp(a) + exp(b)) or an unguarded 0/0 does not.
    Batch-coupled losses are compared through the batch mean: AOT's per-example
    split of sorted slots jumps where float32 rounding creates or breaks a tie.
    """
    for dt in dtypes:
        low = cast_batch(batch, dt, requires_grad=False)
        b64 = cast_batch(low, torch.float64, requires_grad=False)
        base, worst = _sensitivity(loss, b64, U32)
        where: PreferenceBatch | None = b64
        got = loss(low).losses.detach()
        tol = 16 * worst + 16 * U32 * (1 + base.abs())
        if loss.batch_coupled:  # a per-example split of a batch quantity may jump at ties (AOT): compare means
            got, base, tol = got.mean().reshape(1), base.mean().reshape(1), tol.mean().reshape(1)
            where = None
        _close(loss.name, got, base, tol, where, f"{dt} loss vs float64 on the same inputs")


def check_reference_free(loss: Loss, batch: PreferenceBatch) -> None:
    """A loss that does not need the reference gives identical results with any reference, or none."""
    b = cast_batch(batch, requires_grad=False)
    without = b.replace(ref_chosen_logps=None, ref_rejected_logps=None)
    gen = torch.Generator().manual_seed(1)
    fake = (-1e4 * torch.rand(b.batch_size, generator=gen, dtype=torch.float64)).to(b.policy_chosen_logps.dtype)
    with_ref = b.replace(ref_chosen_logps=fake, ref_rejected_logps=fake.flip(0))
    o1, o2 = loss(without), loss(with_ref)
    for field_name in ("losses", "chosen_rewards", "rejected_rewards"):
        _close(loss.name, getattr(o2, field_name), getattr(o1, field_name), 0.0, b,
               f"{field_name} changed when reference log-probs were supplied")


def check_monotone(loss: Loss, batch: PreferenceBatch) -> None:
    """Declared monotonicity: ∂L/∂log π(y_w) ≤ 0 and ∂L/∂log π(y_l) ≥ 0 for every pair (up to rounding)."""
    if not loss.spec.is_monotone(loss.params):
        return
    b = cast_batch(batch)
    u = U64 if b.policy_chosen_logps.dtype == torch.float64 else U32
    _, g = grads(loss, b)
    gw, gl = g["policy_chosen_logps"].detach().double(), g["policy_rejected_logps"].detach().double()
    # cancelling terms (e.g. mmpo's σ(s_l − s_w) − σ(s_l − s_w)) leave rounding of order u·|inputs|·|g|
    mag = max(float(getattr(b, n).detach().abs().max()) for n in ("policy_chosen_logps", "policy_rejected_logps"))
    scale = 64 * u * (1 + torch.maximum(gw.abs().max(), gl.abs().max())) * (1 + mag)
    if bool((gw > scale).any()):
        i = int(torch.nonzero(gw > scale)[0])
        _fail(f"{loss.name}: ∂L/∂log π(y_w) = {gw[i].item():.6g} > 0 at {_example(b, i)} with {loss.params}: "
              "raising the chosen likelihood increases the loss, but the spec declares monotone=True")
    if bool((gl < -scale).any()):
        i = int(torch.nonzero(gl < -scale)[0])
        _fail(f"{loss.name}: ∂L/∂log π(y_l) = {gl[i].item():.6g} < 0 at {_example(b, i)} with {loss.params}: "
              "raising the rejected likelihood decreases the loss, but the spec declares monotone=True")


def _shift(t: Tensor | None, c: Tensor) -> Tensor | None:
    return None if t is None else t + c


def check_shift_invariance(loss: Loss, batch: PreferenceBatch) -> None:
    """Declared shift invariance: adding c to log π(y) and log π_ref(y) of the same response leaves L unchanged.

    Pair k = 1..B gets c_w = 100·sin k on its chosen response and c_l = −50·cos k on its rejected one (float64):
    shifts that differ per pair and per side, of either sign and up to 100.

    Tolerance 1e-9·(1 + |L|) + 100·Δ, Δ the larger change of L under the two margin perturbations of relative size
    1e-12 (:func:`_sensitivity`'s first two patterns): room for the rounding of x + c, not for a dependence on c."""
    b = cast_batch(batch, torch.float64, requires_grad=False)
    n = b.batch_size
    k = torch.arange(1, n + 1, dtype=torch.float64)
    c_w, c_l = 100 * torch.sin(k), -50 * torch.cos(k)  # (B,) one shift per response
    shifted = b.replace(
        policy_chosen_logps=b.policy_chosen_logps + c_w, ref_chosen_logps=_shift(b.ref_chosen_logps, c_w),
        policy_rejected_logps=b.policy_rejected_logps + c_l, ref_rejected_logps=_shift(b.ref_rejected_logps, c_l),
    )
    base, worst = _sensitivity(loss, b, 1e-12, draws=2)
    got, tol = loss(shifted).losses.detach(), 1e-9 * (1 + base.abs()) + 100 * worst
    where: PreferenceBatch | None = b
    if loss.batch_coupled:  # rounding of x + c can create or break a tie, moving AOT's per-example split
        got, base, tol, where = got.mean().reshape(1), base.mean().reshape(1), tol.mean().reshape(1), None
    _close(loss.name, got, base, tol, where,
           "loss changed when c was added to policy and reference log-probs of one response")


def check_sharded_gather(loss: Loss, batch: PreferenceBatch, shards: int = 4) -> None:
    """Split across ranks (uneven, one rank holding a single pair) with the gather hook: per-example losses,
    scores and gradients equal one process on the full batch (float64)."""
    b = cast_batch(batch, torch.float64)
    sizes = split_sizes(b.batch_size, shards)
    full, g_full = grads(loss, b)
    parts = shard_batch(b, sizes)
    outs = run_sharded(lambda sb, gather: grads(loss, sb, gather=gather), _fresh(parts))
    got = torch.cat([o.losses.detach() for o, _ in outs])
    tol = 1e-9 * (1 + full.losses.detach().abs())
    _close(loss.name, got, full.losses, tol, b, f"per-example loss sharded as {sizes} with the gather hook")
    for field_name in ("chosen_rewards", "rejected_rewards"):
        got_r = torch.cat([getattr(o, field_name) for o, _ in outs])
        ref_r = getattr(full, field_name)
        _close(loss.name, got_r, ref_r, 1e-9 * (1 + ref_r.abs()), b, f"{field_name} sharded as {sizes}")
    for n, gf in g_full.items():
        got_g = torch.cat([g[n] for _, g in outs])
        _close(loss.name, got_g.flatten(), gf.flatten(), 1e-9 * (1 + gf.abs().flatten()), None,
               f"∂ΣL/∂{n} sharded as {sizes}")


def _fresh(parts: list[PreferenceBatch]) -> list[PreferenceBatch]:
    return [cast_batch(p, torch.float64) for p in parts]


def check_batch_decoupled(loss: Loss, batch: PreferenceBatch) -> None:
    """For losses not declared batch-coupled: each pair's loss is the same in any micro-batch, so the mean over a
    batch equals the mean of equal micro-batch means (gradient accumulation is exact)."""
    if loss.batch_coupled:
        return
    b = cast_batch(batch, torch.float64, requires_grad=False)
    sizes, full, got = _micro_batch_losses(loss, b)
    _close(loss.name, got, full, 1e-12 * (1 + full.abs()), b,
           f"per-example loss in micro-batches {sizes} differs from the full batch, but the spec says "
           "batch_coupled=False")


def _micro_batch_losses(loss: Loss, b: Any) -> tuple[list[int], Tensor, Tensor]:
    """(two micro-batch sizes, the full batch's losses, the losses of the micro-batches concatenated), detached."""
    n = b.batch_size
    half = (n + 1) // 2
    sizes = [half, n - half] if n > 1 else [1]
    full = loss(b).losses.detach()
    return sizes, full, torch.cat([loss(p).losses.detach() for p in shard_batch(b, sizes)])


def check_matches_reference(loss: Loss, batch: PreferenceBatch, reference: Callable[[PreferenceBatch, Any], Any],
                            mean_only: bool = False) -> None:
    """Per-example losses (or their mean) equal a float64 reference formula ``reference(batch, params)``."""
    b = cast_batch(batch, torch.float64, requires_grad=False)
    want = torch.as_tensor(reference(b, loss.params), dtype=torch.float64)
    got = loss(b).losses.detach()
    if mean_only:
        got, want = got.mean().reshape(1), want.mean().reshape(1)
    _close(loss.name, got, want, 1e-9 * (1 + want.abs()), None if mean_only else b, "loss vs float64 reference formula")


@dataclass(frozen=True)
class Property:
    """A generic property: which losses it applies to, what it guarantees, and the check."""

    name: str
    guarantee: str
    check: Callable[[Loss, Any], None]  # (loss, a batch of ``shape``)
    applies: Callable[[LossSpec], bool] = lambda spec: True
    params_filter: Callable[[LossSpec, Any], bool] | None = None
    shape: Shape = Shape.PAIR  # the batches it is checked on; it applies only to losses that accept them

    def applies_to(self, spec: LossSpec) -> bool:
        """Whether the property is checked on ``spec``: the loss accepts the shape and ``applies`` says yes."""
        return spec.accepts(self.shape) and self.applies(spec)


def _monotone_possible(spec: LossSpec) -> bool:
    return spec.monotone is True or callable(spec.monotone)


GENERIC_PROPERTIES: tuple[Property, ...] = (
    Property("finite", "losses, scores and gradients are finite over the whole strategy domain (all dtypes)",
             check_finite),
    Property("shape", "losses and scores have shape (B,); losses are differentiable", check_shape),
    Property("detached-rewards", "scores and metrics are detached", check_detached_rewards),
    Property("permutation", "permuting pairs permutes per-example losses", check_permutation,
             params_filter=lambda s, p: s.is_permutation_equivariant(p)),
    Property("low-precision", "bf16/fp32 inputs match float64 within 16·(perturbation spread) + 16·u·(1 + |L|)",
             check_low_precision),
    Property("reference-free", "results do not depend on reference log-probs",
             check_reference_free, applies=lambda s: Need.REFERENCE not in s.needs),
    Property("monotone", "∂L/∂log π(y_w) ≤ 0 and ∂L/∂log π(y_l) ≥ 0 where declared", check_monotone,
             applies=_monotone_possible, params_filter=lambda s, p: s.is_monotone(p)),
    Property("shift-invariant", "adding c to policy and reference log-prob of one response leaves L unchanged",
             check_shift_invariance, applies=lambda s: s.shift_invariant),
    Property("sharded-gather", "sharding across ranks with the gather hook changes no loss, score or gradient",
             check_sharded_gather),
    Property("batch-decoupled", "a pair's loss does not depend on its micro-batch (unless declared batch_coupled)",
             check_batch_decoupled, applies=lambda s: s.batch_coupled is not True,
             params_filter=lambda s, p: not s.is_batch_coupled(p)),
)


def unit_roundoff(dtype: torch.dtype) -> float:
    """u of the dtype a loss computes in for inputs of ``dtype`` (half precision is upcast to float32)."""
    return U64 if dtype == torch.float64 else U32
