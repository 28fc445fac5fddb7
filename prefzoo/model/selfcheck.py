"""The run-start log-prob self-check: the fast path against the model's own ``forward(...).logits`` on a few rows.

prefzoo computes log-probs itself (:func:`prefzoo.model.logps.sequence_logps`), reproducing what each architecture
does after its decoder (:mod:`prefzoo.model.arch`).  An architecture nobody tested could do something else; so on the
first batch of every run a few pairs go through both paths in float32 arithmetic, without dropout.  A disagreement
stops the run with one line naming the architecture and the fix, or, with ``logps_fallback``, switches the policy
and the reference to the model's own forward with a warning.  The router loss of a mixture-of-experts model is
compared the same way.

The model's side keeps its memory bounded at any length: its decoder runs once over the full rows (a sliding-window
or position bug far into a long completion is still compared), and its own head and logit transform run through
``forward(..., logits_to_keep=positions)`` on chunks of positions, at most ``LOGITS_BYTES`` of float32 logits at a
time, instead of one (rows × T × V) tensor and its log-softmax (1.7 GB each at 4k-token completions of a 49k
vocabulary).  A model whose forward takes no ``logits_to_keep`` falls back to the whole logits.
"""

from __future__ import annotations

import contextlib
import inspect
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from prefzoo._attrs import temporarily
from prefzoo.errors import ConfigError
from prefzoo.model.arch import router_loss
from prefzoo.model.fast.prompt import SharedPromptError, unshare_rows
from prefzoo.model.logps import (
    PolicyLogps,
    _router_aux,
    is_shared_layout,
    sequence_logps,
    unwrap,
)

__all__ = [
    "LogpsSelfCheckError",
    "SelfCheck",
    "check_logps",
    "first_pairs",
    "own_forward_logps",
    "run_self_check",
    "use_model_forward",
]

TOKEN_TOL = {torch.float32: 1e-4, torch.float64: 1e-8}  # nats per completion token; 16-bit weights: 2e-2
ROWS = 2  # pairs of the first batch that go through both paths
LOGITS_BYTES = 64 << 20  # the model's own float32 logits per chunk of positions (a 49k vocabulary, 4 rows: 85)


class LogpsSelfCheckError(ConfigError):
    """prefzoo's log-probs differ from the model's own forward for this architecture (message: which and the fix)."""


@dataclass
class SelfCheck:
    """What the self-check measured: max |Δ| nats per sequence against its tolerance, and the router loss."""

    architecture: str
    max_error: float
    tolerance: float
    aux_error: float = 0.0
    failure: str | None = None  # why the fast path could not run at all

    @property
    def ok(self) -> bool:
        return self.failure is None and self.max_error <= self.tolerance and self.aux_error <= self.tolerance


def _first_rows(batch: dict[str, Any], k: int) -> tuple[Tensor, Tensor, Tensor]:
    ids, attn, cm = batch["input_ids"], batch["attention_mask"], batch["completion_mask"]
    if is_shared_layout(cm):  # one row per pair
        return ids[:k], attn[:k], cm[:k]
    b = ids.shape[0] // 2
    k = min(k, b)
    pick = torch.cat([torch.arange(k), torch.arange(b, b + k)]).to(ids.device)  # chosen rows first
    return ids[pick], attn[pick], cm[pick]


def _architecture(lm: Any) -> str:
    causal = unwrap(lm, "base")
    return f"{getattr(causal.config, 'model_type', '?')} ({type(causal).__name__})"


@contextlib.contextmanager
def _decoder_runs_once(decoder: Any) -> Iterator[None]:
    """Within the block, the decoder's first output is returned again by every later call (same inputs)."""
    real = decoder.forward
    memo: list[Any] = []

    def forward(*args: Any, **kwargs: Any) -> Any:
        if not memo:
            memo.append(real(*args, **kwargs))
        return memo[0]

    with temporarily(decoder, "forward", forward):
        yield


def own_forward_logps(
    lm: Any, ids: Tensor, attn: Tensor, cm: Tensor, router: bool, logits_bytes: int = LOGITS_BYTES
) -> tuple[Tensor, Tensor | None]:
    """(Σ_t log π(y_t | x, y_<t) (N,), router aux term or None) from the model's own ``forward``, its logits computed
    for chunks of at most ``logits_bytes`` (float32) of completion positions over one decoder pass of full rows."""
    causal: Any = unwrap(lm, "base")
    router = router and router_loss(causal.config)
    decoder = causal.get_decoder()
    if "logits_to_keep" in inspect.signature(causal.forward).parameters and decoder is not causal:
        with _decoder_runs_once(decoder):
            chunked = _chunked_own_logps(causal, ids, attn, cm, router, logits_bytes)
        if chunked is not None:
            return chunked
    ref = sequence_logps(lm, ids, attn, cm, path="model", router_aux=router)  # the whole (N, T, V) logits
    return ref.logps, ref.aux_loss


def _chunked_own_logps(
    causal: Any, ids: Tensor, attn: Tensor, cm: Tensor, router: bool, logits_bytes: int
) -> tuple[Tensor, Tensor | None] | None:
    """:func:`own_forward_logps` through ``logits_to_keep``; None when the model's logits do not come back as
    (N, positions kept, V) (a forward that slices otherwise, or a decoder that is not what the forward calls)."""
    if is_shared_layout(cm):
        ids, attn, cm = unshare_rows(ids, cm)
    predict = cm[:, 1:].bool()  # (N, T-1): position t predicts completion token t+1
    cols = predict.any(0).nonzero().squeeze(-1)  # (P,) positions some row needs
    kw = {"output_router_logits": True} if router else {}
    logps = torch.zeros(ids.shape[0], dtype=torch.float32, device=ids.device)  # (N,)
    aux: Tensor | None = None
    n_cols, start, width = max(cols.numel(), 1), 0, 1  # the first call (width 1) tells the vocabulary size
    while start < n_cols:
        keep = cols[start : start + width] if cols.numel() else torch.zeros(1, dtype=torch.long, device=ids.device)
        out = causal(input_ids=ids, attention_mask=attn, use_cache=False, logits_to_keep=keep, **kw)
        z = out.logits  # (N, c, V) the model's own logits at positions ``keep``
        if z.dim() != 3 or tuple(z.shape[:2]) != (ids.shape[0], keep.numel()):
            return None
        z = z.to(torch.promote_types(z.dtype, torch.float32))
        if start == 0 and router:
            aux = _router_aux(causal, out, attn)
        if cols.numel():
            lp = torch.log_softmax(z, dim=-1).gather(-1, ids[:, keep + 1].unsqueeze(-1)).squeeze(-1)  # (N, c)
            logps = logps.to(lp.dtype) + torch.where(predict[:, keep], lp, 0).sum(1)
        start += width
        width = max(1, logits_bytes // (z.shape[0] * z.shape[-1] * z.element_size()))
    return logps, aux


def check_logps(
    policy: PolicyLogps, batch: dict[str, Any], rows: int = ROWS, logits_bytes: int = LOGITS_BYTES
) -> SelfCheck:
    """Compare ``policy``'s fast path with the model's own forward on the first ``rows`` pairs of ``batch``
    (the model's logits at most ``logits_bytes`` at a time: :func:`own_forward_logps`)."""
    lm = policy.lm
    arch = _architecture(lm)
    ids, attn, cm = _first_rows(batch, rows)
    dtype = next(lm.parameters()).dtype
    lengths = (cm[:, 1:].bool() if not is_shared_layout(cm) else (cm > 1)).sum(1)
    tol = TOKEN_TOL.get(dtype, 2e-2) * max(int(lengths.max()), 1) + 1e-5
    was_training = lm.training
    lm.eval()
    no_autocast = torch.autocast(device_type=ids.device.type, enabled=False)
    try:
        with torch.no_grad(), no_autocast:
            ref_logps, ref_aux = own_forward_logps(lm, ids, attn, cm, router=True, logits_bytes=logits_bytes)
            try:
                packing = getattr(policy, "packing", False)
                fast = sequence_logps(
                    lm, ids, attn, cm, chunk_size=policy.chunk_size, fused_head=policy.fused_head, router_aux=True,
                    packing=packing,
                )  # fmt: skip
            except SharedPromptError as e:  # prompt sharing or packing refused for this architecture: its own one line
                raise LogpsSelfCheckError(str(e)) from None
            except Exception as e:  # whatever stops the fast path on this architecture is reported, not raised
                return SelfCheck(arch, float("inf"), tol, failure=f"{type(e).__name__}: {str(e).splitlines()[0]}")
    finally:
        lm.train(was_training)
    err = float((fast.logps - ref_logps).abs().max()) if fast.logps.numel() else 0.0
    if not torch.isfinite(fast.logps).all():
        err = float("inf")
    aux_err = 0.0
    if ref_aux is not None or fast.aux_loss is not None:
        if ref_aux is None or fast.aux_loss is None:
            aux_err = float("inf")
        else:
            aux_err = float((fast.aux_loss - ref_aux).abs())
    return SelfCheck(arch, err, tol, aux_err)


def run_self_check(policy: Any, reference: Any, batch: dict[str, Any], fallback: bool, say: Any = print) -> SelfCheck:
    """The run-start check (called by the loop on the first batch); raises or switches both to the model's forward.

    ``policy`` is the (possibly accelerate-wrapped) :class:`PolicyLogps`; ``reference`` a
    :class:`prefzoo.scoring.Reference` or None; ``say`` prints one line on the main process.
    """
    inner = unwrap(policy, "policy")
    result = check_logps(inner, batch)
    if result.ok:
        say(
            f"prefzoo train: log-prob self-check passed for {result.architecture}: fast path within "
            f"{result.max_error:.2g} nats/sequence of the model's own forward (tolerance {result.tolerance:.2g})"
        )
        return result
    what = (
        f"the fast path failed ({result.failure})"
        if result.failure
        else f"the fast path differs from the model's own forward by {result.max_error:.3g} nats/sequence "
        f"(tolerance {result.tolerance:.2g})"
        + (f", router aux loss by {result.aux_error:.3g}" if result.aux_error > result.tolerance else "")
    )
    if not fallback:
        raise LogpsSelfCheckError(
            f"log-prob self-check failed for {result.architecture}: {what}. Rerun with --logps-fallback "
            "(logps_fallback: true) to use the model's own forward (slower, correct), and report the architecture"
        )
    say(
        f"prefzoo train: WARNING: log-prob self-check failed for {result.architecture}: {what}; logps_fallback is "
        "set, so the policy and the reference use the model's own forward (slower)"
    )
    use_model_forward(policy, reference)
    return result


def use_model_forward(policy: Any, reference: Any) -> None:
    """Switch the policy (and a reference that computes log-probs) to the model's own forward."""
    unwrap(policy, "policy").path = "model"
    module = getattr(reference, "module", None)
    with contextlib.suppress(AttributeError):
        if module is not None:
            unwrap(module, "policy").path = "model"


def first_pairs(tokenized: Any, collate: Any, device: Any, k: int = ROWS) -> dict[str, Any]:
    """A collated batch of the first ``k`` pairs of a tokenized split, on ``device`` (the loader is not touched)."""
    batch = collate([tokenized[i] for i in range(min(k, len(tokenized)))])
    return {key: (v.to(device) if torch.is_tensor(v) else v) for key, v in batch.items()}
