"""The generic properties for list (GroupBatch) and unpaired (UnpairedBatch) losses, as ``check(loss, batch)``.

The same guarantees as the pair properties of :mod:`prefzoo.testing.properties`, written over any batch type
through its dataclass fields (``FLOAT_FIELDS`` and ``GRAD_FIELDS`` of the batch class), plus what only lists
have: permuting a group's completions (scores moving with them) changes nothing, padding slots change
nothing, and a declared-monotone loss never pushes the best completion down or the worst one up.  Unpaired
losses declared monotone never push a desirable completion down or an undesirable one up.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from prefzoo.spec import Loss, LossOutputError
from prefzoo.testing.properties import (
    U32,
    U64,
    Property,
    _fail,
    _fresh_leaves,
    _grads_of,
    _micro_batch_losses,
    _permuted_losses,
    _sensitivity,
    _take,
    seeded_permutation,
)
from prefzoo.testing.sharding import run_sharded, shard_batch, split_sizes
from prefzoo.types import GroupBatch, LossOutput, Need, Shape, UnpairedBatch

__all__ = ["LIST_PROPERTIES", "UNPAIRED_PROPERTIES", "fresh", "shape_grads"]

Batch = GroupBatch | UnpairedBatch


def fresh(batch: Batch, dtype: torch.dtype | None = None, requires_grad: bool = True) -> Any:
    """A copy whose float fields are fresh leaves (of ``dtype`` if given); differentiable fields require grad."""
    return _fresh_leaves(batch, dtype, requires_grad)


def shape_grads(loss: Loss, batch: Batch, **kw: Any) -> tuple[LossOutput, dict[str, Tensor]]:
    """The loss and the gradients of Σ L with respect to every differentiable field of the batch."""
    return _grads_of(loss, batch, **kw)


def _close(loss: Loss, what: str, got: Tensor, want: Tensor, tol: Tensor | float) -> None:
    got64, want64 = got.detach().double().flatten(), want.detach().double().flatten()
    err = (got64 - want64).abs()
    tol_t = torch.as_tensor(tol, dtype=torch.float64).expand_as(got.detach()).flatten()
    bad = ~(err <= tol_t) | (torch.isfinite(got64) != torch.isfinite(want64))
    if bool(bad.any()):
        i = int(torch.nonzero(bad)[0])
        _fail(f"{loss.name}: {what} at index {i}: got {got64[i].item()!r}, expected {want64[i].item()!r} "
              f"(|error| {err[i].item():.3g} > tolerance {tol_t[i].item():.3g})")


def _kind(batch: Batch) -> str:
    return "group" if isinstance(batch, GroupBatch) else "completion"


# --- shared by both shapes ----------------------------------------------------------------------------------------


def check_shape_finite(loss: Loss, batch: Batch) -> None:
    """Losses, scores and the gradients of Σ L are finite."""
    out, g = shape_grads(loss, fresh(batch))
    named = {"losses": out.losses, "chosen_rewards": out.chosen_rewards, "rejected_rewards": out.rejected_rewards,
             **({"rewards": out.rewards} if out.rewards is not None else {}), **{f"∂ΣL/∂{n}": v for n, v in g.items()}}
    for what, t in named.items():
        bad = ~torch.isfinite(t.detach())
        if bool(bad.any()):
            idx = torch.nonzero(bad)[0].tolist()
            _fail(f"{loss.name}: {what}{idx} = {t.detach()[tuple(idx)].item()!r} is not finite (dtype {t.dtype})")


def check_shape_shape(loss: Loss, batch: Batch) -> None:
    """One loss per group / completion, differentiable; ``rewards`` (if given) has the policy log-probs' shape."""
    b = fresh(batch)
    try:
        out = loss(b)
    except LossOutputError as e:
        _fail(str(e))
    if not out.losses.requires_grad:
        _fail(f"{loss.name}: losses do not require grad although policy log-probs do: the graph was cut")


def check_shape_detached(loss: Loss, batch: Batch) -> None:
    """Scores, rewards and metrics are detached."""
    out = loss(fresh(batch))
    extra = {"rewards": out.rewards} if out.rewards is not None else {}
    for what, t in {"chosen_rewards": out.chosen_rewards, "rejected_rewards": out.rejected_rewards, **extra,
                    **{f"metrics[{k!r}]": v for k, v in out.metrics.items()}}.items():
        if isinstance(t, Tensor) and t.requires_grad:
            _fail(f"{loss.name}: {what} requires grad; return it .detach()ed")


def check_shape_permutation(loss: Loss, batch: Batch) -> None:
    """Permuting the groups (completions) permutes the per-example losses."""
    b = fresh(batch, torch.float64)
    perm, base, got = _permuted_losses(loss, b)
    _close(loss, f"losses after permuting the {_kind(b)}s by {perm.tolist()}", got, base[perm],
           1e-9 * (1 + base.abs().max()))


def check_shape_low_precision(loss: Loss, batch: Batch,
                              dtypes: tuple[torch.dtype, ...] = (torch.bfloat16, torch.float32)) -> None:
    """bf16 and fp32 inputs give losses within 16·Δ_u + 16·u·(1 + |L₆₄|) of float64 on the same rounded inputs
    (Δ_u: the largest change of the float64 loss under relative ±u perturbations), batch means for coupled losses."""
    for dt in dtypes:
        low = fresh(batch, dt, requires_grad=False)
        b64 = fresh(low, torch.float64, requires_grad=False)
        base, worst = _sensitivity(loss, b64, U32, directional=False)
        got = loss(low).losses.detach()
        tol = 16 * worst + 16 * U32 * (1 + base.abs())
        if loss.spec.batch_coupled:
            got, base, tol = got.mean().reshape(1), base.mean().reshape(1), tol.mean().reshape(1)
        _close(loss, f"{dt} loss vs float64 on the same inputs", got, base, tol)


def check_shape_reference_free(loss: Loss, batch: Batch) -> None:
    """A loss that does not need the reference gives identical results with any reference, or none."""
    b = fresh(batch, requires_grad=False)
    fake = (-1e4 * torch.rand(b.policy_logps.shape, generator=torch.Generator().manual_seed(1),
                              dtype=torch.float64)).to(b.policy_logps.dtype)
    o1, o2 = loss(b.replace(ref_logps=None)), loss(b.replace(ref_logps=fake))
    _close(loss, "losses changed when reference log-probs were supplied", o2.losses, o1.losses, 0.0)


def check_shape_sharded_gather(loss: Loss, batch: Batch, shards: int = 4) -> None:
    """Split across ranks (uneven, one rank holding a single group / completion) with the gather hook: losses,
    scores and gradients equal one process on the full batch (float64)."""
    b = fresh(batch, torch.float64)
    sizes = split_sizes(b.batch_size, shards)
    full, g_full = shape_grads(loss, b)
    parts = [fresh(p, torch.float64) for p in shard_batch(b, sizes)]
    outs = run_sharded(lambda sb, gather: shape_grads(loss, sb, gather=gather), parts)
    for what in ("losses", "chosen_rewards", "rejected_rewards"):
        got = torch.cat([getattr(o, what).detach() for o, _ in outs])
        want = getattr(full, what).detach()
        _close(loss, f"{what} sharded as {sizes} with the gather hook", got, want, 1e-9 * (1 + want.abs()))
    for n, gf in g_full.items():
        got_g = torch.cat([g[n] for _, g in outs])
        _close(loss, f"∂ΣL/∂{n} sharded as {sizes}", got_g, gf, 1e-9 * (1 + gf.abs()))


def check_shape_decoupled(loss: Loss, batch: Batch) -> None:
    """For losses not declared batch-coupled: an example's loss does not depend on its micro-batch."""
    if loss.spec.batch_coupled:
        return
    b = fresh(batch, torch.float64, requires_grad=False)
    sizes, full, got = _micro_batch_losses(loss, b)
    _close(loss, f"per-example loss in micro-batches {sizes} differs from the full batch (batch_coupled=False)",
           got, full, 1e-12 * (1 + full.abs()))


# --- lists only -----------------------------------------------------------------------------------------------------


def check_within_group_permutation(loss: Loss, batch: GroupBatch) -> None:
    """Permuting the completions inside every group, their scores moving with them, changes no loss.

    A batch without scores is ranked by column, so it is first given scores K − 1 − column (the same ranking).
    """
    b = fresh(batch, torch.float64)
    if b.scores is None:
        b = b.replace(scores=b.ranking_scores.clone())
    perm = seeded_permutation(b.group_size)
    base = loss(b).losses.detach()
    got = loss(_take(b, perm, dim=1)).losses.detach()
    _close(loss, f"losses after permuting every group's completions by {perm.tolist()}", got, base,
           1e-9 * (1 + base.abs()))


def check_padding_invariance(loss: Loss, batch: GroupBatch) -> None:
    """Appending a padding slot (mask False, any finite filler) to every group changes no loss or gradient."""
    b = fresh(batch, torch.float64)
    g, k = b.batch_size, b.group_size
    filler = {"policy_logps": -7.0, "ref_logps": -3.0, "scores": 1e3, "lengths": 5}  # deliberately not 0
    ch: dict[str, Any] = {"mask": torch.cat((b.valid, torch.zeros(g, 1, dtype=torch.bool)), dim=1)}
    for name, value in filler.items():
        t = getattr(b, name)
        if t is not None:
            ch[name] = torch.cat((t.detach(), torch.full((g, 1), value, dtype=t.dtype)), dim=1)
    for name in ("policy_token_logps", "token_entropies", "token_mask"):
        t = getattr(b, name)
        if t is not None:
            ch[name] = torch.cat((t.detach(), torch.zeros_like(t[:, :1])), dim=1)
    padded = fresh(b.replace(**ch), torch.float64)
    out, g_pad = shape_grads(loss, padded)
    base, g_base = shape_grads(loss, b)
    _close(loss, "losses after adding a padding slot to every group", out.losses, base.losses,
           1e-12 * (1 + base.losses.abs()))
    for n, gb in g_base.items():
        _close(loss, f"∂ΣL/∂{n} on the real slots after padding", g_pad[n][:, :k], gb, 1e-12 * (1 + gb.abs()))
        _close(loss, f"∂ΣL/∂{n} on the padding slot", g_pad[n][:, k:], torch.zeros_like(g_pad[n][:, k:]), 0.0)


def check_list_monotone(loss: Loss, batch: GroupBatch) -> None:
    """Declared monotone: ∂L/∂log π ≤ 0 for a group's unique best completion and ≥ 0 for its unique worst."""
    if not loss.spec.is_monotone(loss.params):
        return
    b = fresh(batch)
    u = U64 if b.policy_logps.dtype == torch.float64 else U32
    _, g = shape_grads(loss, b)
    gp = g["policy_logps"].detach().double()
    r = torch.where(b.valid, b.ranking_scores, torch.nan)
    hi, lo = r.nan_to_num(-torch.inf).amax(1, keepdim=True), r.nan_to_num(torch.inf).amin(1, keepdim=True)
    unique_best = (r == hi) & ((r == hi).sum(1, keepdim=True) == 1) & (hi > lo)
    unique_worst = (r == lo) & ((r == lo).sum(1, keepdim=True) == 1) & (hi > lo)
    mag = float(b.policy_logps.detach().abs().max())
    scale = 64 * u * (1 + float(gp.abs().max())) * (1 + mag)
    for mask, sign, who in ((unique_best, 1, "best"), (unique_worst, -1, "worst")):
        bad = mask & (sign * gp > scale)
        if bool(bad.any()):
            i, j = torch.nonzero(bad)[0].tolist()
            _fail(f"{loss.name}: ∂L/∂log π of group {i}'s {who} completion (slot {j}) is {gp[i, j].item():.6g} with "
                  f"{loss.params}, but the spec declares monotone=True")


# --- unpaired only ----------------------------------------------------------------------------------------------------


def check_unpaired_monotone(loss: Loss, batch: UnpairedBatch) -> None:
    """Declared monotone: ∂L/∂log π(y) ≤ 0 for desirable and ≥ 0 for undesirable completions."""
    if not loss.spec.is_monotone(loss.params):
        return
    b = fresh(batch)
    u = U64 if b.policy_logps.dtype == torch.float64 else U32
    _, g = shape_grads(loss, b)
    gp = g["policy_logps"].detach().double()
    scale = 64 * u * (1 + float(gp.abs().max())) * (1 + float(b.policy_logps.detach().abs().max()))
    bad = (b.labels & (gp > scale)) | (~b.labels & (gp < -scale))
    if bool(bad.any()):
        i = int(torch.nonzero(bad)[0])
        _fail(f"{loss.name}: ∂L/∂log π(y) = {gp[i].item():.6g} for a {'desirable' if b.labels[i] else 'undesirable'} "
              f"completion {i} with {loss.params}, but the spec declares monotone=True")


def _monotone_possible(spec: Any) -> bool:
    return spec.monotone is True or callable(spec.monotone)


def _shared(shape: Shape, prefix: str, what: str) -> tuple[Property, ...]:
    return (
        Property(f"{prefix}-finite", f"losses, scores and gradients are finite on {what} (all dtypes)",
                 check_shape_finite, shape=shape),
        Property(f"{prefix}-shape", f"one differentiable loss per {what[:-1]}; rewards shaped like the log-probs",
                 check_shape_shape, shape=shape),
        Property(f"{prefix}-detached-rewards", "scores, rewards and metrics are detached", check_shape_detached,
                 shape=shape),
        Property(f"{prefix}-permutation", f"permuting {what} permutes per-example losses", check_shape_permutation,
                 shape=shape),
        Property(f"{prefix}-low-precision", "bf16/fp32 inputs match float64 within 16·(perturbation spread) + "
                 "16·u·(1 + |L|)", check_shape_low_precision, shape=shape),
        Property(f"{prefix}-reference-free", "results do not depend on reference log-probs",
                 check_shape_reference_free, applies=lambda s: Need.REFERENCE not in s.needs, shape=shape),
        Property(f"{prefix}-sharded-gather", "sharding across ranks with the gather hook changes no loss, score or "
                 "gradient", check_shape_sharded_gather, shape=shape),
        Property(f"{prefix}-batch-decoupled", f"an example's loss does not depend on its micro-batch of {what} "
                 "(unless declared batch_coupled)", check_shape_decoupled, applies=lambda s: not s.batch_coupled,
                 shape=shape),
    )


LIST_PROPERTIES: tuple[Property, ...] = (
    *_shared(Shape.LIST, "list", "groups"),
    Property("list-within-group-permutation", "permuting a group's completions (scores with them) changes nothing",
             check_within_group_permutation, shape=Shape.LIST),
    Property("list-padding", "masked padding slots change no loss and get no gradient", check_padding_invariance,
             shape=Shape.LIST),
    Property("list-monotone", "∂L/∂log π ≤ 0 for a group's unique best and ≥ 0 for its unique worst, where declared",
             check_list_monotone, applies=_monotone_possible, params_filter=lambda s, p: s.is_monotone(p),
             shape=Shape.LIST),
)

UNPAIRED_PROPERTIES: tuple[Property, ...] = (
    *_shared(Shape.UNPAIRED, "unpaired", "completions"),
    Property("unpaired-monotone", "∂L/∂log π ≤ 0 for desirable and ≥ 0 for undesirable completions, where declared",
             check_unpaired_monotone, applies=_monotone_possible, params_filter=lambda s, p: s.is_monotone(p),
             shape=Shape.UNPAIRED),
)
