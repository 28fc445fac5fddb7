"""The LM head and any registered prefzoo loss as one ``torch.nn.Module``, called as Liger's fused losses are.

``FusedLinearPreferenceLoss("dpo", beta=0.1)(lin_weight, _input, target, ref_input=..., ref_weight=...)`` scores
the positions of ``target`` that are not ``ignore_index`` with the trainer's fused LM head (float32 log-softmax in
chunks, nothing of size positions × vocabulary kept for backward), builds the batch the loss declares it takes
(:mod:`prefzoo.nn.layout`) with the inputs it declares it needs (``LossSpec.needs``), and returns
(mean per-example loss, :class:`FusedLossAux`), the mean the trainer backpropagates.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

import torch
from torch import Tensor, nn

from prefzoo.model import HeadOptions, LogitTransform
from prefzoo.nn.layout import RowFields, build_batch, choose_shape
from prefzoo.nn.rows import FusedInputError, Positions, check_head, check_rows, positions
from prefzoo.nn.scoring import at_least_float32, given_reference, policy_scores, reference_scores
from prefzoo.registry import get_loss
from prefzoo.spec import Loss
from prefzoo.types import LossOutput, Need, Shape

__all__ = ["FusedLinearPreferenceLoss", "FusedLossAux", "fused_sequence_logps"]

_TOKEN_NEEDS = frozenset({Need.TOKEN_LOGPS, Need.TOKEN_ENTROPIES, Need.REF_TOKEN_LOGPS, Need.TOKEN_SQUARED_PROBS})


class FusedLossAux(NamedTuple):
    """What a fused call returns after the loss (a tuple, as Liger's auxiliary outputs, with names)."""

    policy_logps: Tensor  # (R,) detached log π(y|x) of every row, in _input's row order
    chosen_rewards: Tensor  # (B,) / (G,) / (N,) the loss's detached scores (LossOutput.chosen_rewards)
    rejected_rewards: Tensor  # (B,) / (G,) / (N,)
    metrics: dict[str, Tensor]  # the loss's own metrics (LossOutput.metrics)
    output: LossOutput  # the whole output: per-example losses (differentiable), rewards, state


def _transform(logit_scale: float, softcap: float | None) -> LogitTransform:
    if softcap is not None and not softcap > 0:
        raise FusedInputError(f"softcap must be > 0 (or None for no soft-capping), got {softcap}")
    return LogitTransform(scale=float(logit_scale), softcap=None if softcap is None else float(softcap))


class FusedLinearPreferenceLoss(nn.Module):
    """LM head + any registered loss (pairs, lists, unpaired; plugins, combinations and modifiers included).

    ``loss``: a registered name (``"dpo"``), a weighted sum (``"0.9*dpo + 0.1*sft"``) or a bound
    :class:`prefzoo.Loss`; ``loss_params``: its hyperparameters, validated here.  ``logit_scale`` and ``softcap``
    are the model's logit transform z = softcap · tanh(logit_scale · h·Wᵀ / softcap) (Gemma's
    ``final_logit_softcapping``; :func:`prefzoo.model.logit_transform` reads both from a config).
    ``gather``: the all-gather a batch-coupled loss uses across processes (default: this process's rows only).
    ``keep_bytes``: the most the head keeps for backward instead of recomputing its logits there (default 0: always
    recompute, the least memory, and still faster than Liger's chunked loss; None: the trainer's 512 MiB, faster
    while it fits).
    """

    def __init__(
        self,
        loss: str | Loss = "dpo",
        *,
        modifiers: Sequence[Any] = (),
        ignore_index: int = -100,
        logit_scale: float = 1.0,
        softcap: float | None = None,
        chunk_size: int = 1024,
        gather: Callable[[Tensor], Tensor] | None = None,
        keep_bytes: int | None = 0,
        **loss_params: Any,
    ) -> None:
        super().__init__()
        if isinstance(loss, Loss):
            if loss_params or modifiers:
                raise FusedInputError("loss is a bound prefzoo.Loss: give its params and modifiers when building it")
            self.loss_fn = loss
        else:
            self.loss_fn = get_loss(loss, modifiers, **loss_params)
        if chunk_size < 1:
            raise FusedInputError(f"chunk_size must be >= 1 positions, got {chunk_size}")
        if keep_bytes is not None and keep_bytes < 0:
            raise FusedInputError(f"keep_bytes must be >= 0 (or None for the trainer's default), got {keep_bytes}")
        self.ignore_index, self.gather = ignore_index, gather
        self.head_options = HeadOptions(chunk_size, _transform(logit_scale, softcap), keep_bytes)

    @property
    def needs(self) -> frozenset[Need]:
        """The inputs the loss declares it needs (``Need.REFERENCE``: ``ref_input`` or ``ref_logps``)."""
        return self.loss_fn.needs

    def extra_repr(self) -> str:
        transform = self.head_options.transform.describe()
        return f"loss={self.loss_fn!r}, ignore_index={self.ignore_index}, logit_transform={transform}"

    def get_extra_state(self) -> Any:  # a stateful loss's state travels in the module's state_dict
        return self.loss_fn.state_dict()

    def set_extra_state(self, state: Any) -> None:
        self.loss_fn.load_state_dict(state)

    def forward(
        self,
        lin_weight: Tensor,
        _input: Tensor,
        target: Tensor,
        bias: Tensor | None = None,
        ref_input: Tensor | None = None,
        ref_weight: Tensor | None = None,
        ref_bias: Tensor | None = None,
        *,
        ref_logps: Tensor | None = None,
        labels: Tensor | None = None,
        scores: Tensor | None = None,
        group_size: int | None = None,
        kl_policy_logps: Tensor | None = None,
        kl_ref_logps: Tensor | None = None,
    ) -> tuple[Tensor, FusedLossAux]:
        """(loss (), :class:`FusedLossAux`) of R completions: ``_input`` (R, T, H) last hidden states, ``target``
        (R, T) the token each position predicts (``ignore_index`` where none is scored), ``lin_weight`` (V, H).

        Rows are stacked as :mod:`prefzoo.nn.layout` says (pairs: chosen rows over rejected rows).  The reference:
        ``ref_input`` (R, T, H) under ``ref_weight`` (default ``lin_weight``) and ``ref_bias``, or ``ref_logps``
        precomputed, (R,) per row or (R, T) per position.  ``labels`` (R,) bool: unpaired rows (True =
        desirable); ``scores`` (R,): each row's score (ranking of list rows; pairs' scores for a loss that needs
        them); ``group_size``: K of list rows (default 2); ``kl_policy_logps`` / ``kl_ref_logps`` (R,): log-probs of
        mismatched prompt/completion pairs, for a loss that needs them (KTO's reference point).
        """
        check_head(lin_weight, bias)
        check_rows(lin_weight, _input, target)
        shape, k = choose_shape(self.loss_fn.spec, _input.shape[0], labels, group_size)
        pos = self.scored_positions(target, lin_weight.shape[0], shape)
        extras = {"labels": labels, "scores": scores, "kl_policy_logps": kl_policy_logps, "kl_ref_logps": kl_ref_logps}
        fields = self.row_fields(lin_weight, _input, pos, bias, (ref_input, ref_weight, ref_bias, ref_logps), extras)
        out = self.loss_fn(build_batch(shape, k, fields), gather=self.gather)
        aux = FusedLossAux(fields["policy_logps"].detach(), out.chosen_rewards, out.rejected_rewards, out.metrics, out)
        return out.losses.mean(), aux

    def scored_positions(self, target: Tensor, vocab: int, shape: Shape) -> Positions:
        """The positions of ``target`` that are scored; a pair or unpaired row without one is a one-line error."""
        pos = positions(target, self.ignore_index, vocab)
        if shape is not Shape.LIST and bool((pos.lengths == 0).any()):
            r = int(torch.nonzero(pos.lengths == 0)[0, 0])
            raise FusedInputError(f"target row {r} has no token other than ignore_index ({self.ignore_index})")
        return pos

    def row_fields(
        self,
        lin_weight: Tensor,
        _input: Tensor,
        pos: Positions,
        bias: Tensor | None = None,
        ref: tuple[Tensor | None, Tensor | None, Tensor | None, Tensor | None] = (None, None, None, None),
        extras: dict[str, Tensor | None] | None = None,
    ) -> RowFields:
        """The per-row fields of a call, before the batch is built: ``policy_logps`` (R,) summed and differentiable,
        ``lengths``, what the loss needs per token, the reference from ``ref`` = (ref_input, ref_weight, ref_bias,
        ref_logps) and ``extras`` (labels, scores, kl_policy_logps, kl_ref_logps), as :meth:`forward` builds them."""
        fields = self._policy_fields(lin_weight, bias, _input, pos)
        fields.update(self._reference_fields(pos, lin_weight, bias, *ref))
        e = extras or {}
        fields.update(self._row_extras(pos.n_rows, e.get("labels"), e.get("scores"), e.get("kl_policy_logps"),
                                       e.get("kl_ref_logps")))  # fmt: skip
        return fields

    def _policy_fields(self, lin_weight: Tensor, bias: Tensor | None, _input: Tensor, pos: Positions) -> RowFields:
        s = policy_scores(lin_weight, bias, _input, pos, self.head_options, self.needs)
        fields: RowFields = {"policy_logps": s.logps, "lengths": pos.lengths}
        if self.needs & _TOKEN_NEEDS:
            fields["token_mask"] = pos.mask()  # (R, T_c)
        for name, tok in (("policy_token_logps", s.token_logps), ("token_entropies", s.token_entropies),
                          ("token_log_sq_probs", s.token_log_sq_probs)):  # fmt: skip
            if tok is not None:
                fields[name] = pos.grid(tok)  # (R, T_c)
        return fields

    def _reference_fields(
        self,
        pos: Positions,
        lin_weight: Tensor,
        bias: Tensor | None,
        ref_input: Tensor | None,
        ref_weight: Tensor | None,
        ref_bias: Tensor | None,
        ref_logps: Tensor | None,
    ) -> RowFields:
        if Need.REFERENCE not in self.needs:
            return {}
        name = self.loss_fn.name
        if ref_logps is None and ref_input is None:
            raise FusedInputError(f"loss {name!r} needs the reference: pass ref_input (and ref_weight) or ref_logps")
        if ref_logps is not None and ref_input is not None:
            raise FusedInputError("pass the reference once: ref_input (hidden states) or ref_logps, not both")
        if ref_input is not None:
            if ref_weight is None:
                ref_weight, ref_bias = lin_weight, (bias if ref_bias is None else ref_bias)
            check_head(ref_weight, ref_bias, "ref_weight", "ref_bias")
            check_rows(ref_weight, ref_input, torch.empty(pos.n_rows, pos.seq_len, dtype=torch.long), "ref_input",
                       "ref_weight")  # fmt: skip
            rows, tok = reference_scores(pos, self.head_options, ref_input, ref_weight, ref_bias)
        else:
            assert ref_logps is not None  # one of the two, checked above
            rows, tok = given_reference(pos, ref_logps)
        fields: RowFields = {"ref_logps": rows}
        if Need.REF_TOKEN_LOGPS in self.needs:
            if tok is None:
                raise FusedInputError(
                    f"loss {name!r} needs per-token reference log-probs: pass ref_input, or ref_logps of shape (R, T)"
                )
            fields["ref_token_logps"] = pos.grid(tok)  # (R, T_c)
        return fields

    def _row_extras(
        self,
        n_rows: int,
        labels: Tensor | None,
        scores: Tensor | None,
        kl_policy_logps: Tensor | None,
        kl_ref_logps: Tensor | None,
    ) -> RowFields:
        """labels, scores and the KL rows' log-probs, each (R,), checked for shape; constants."""
        fields: RowFields = {}
        for arg, value in (("labels", labels), ("scores", scores), ("kl_policy_logps", kl_policy_logps),
                           ("kl_ref_logps", kl_ref_logps)):  # fmt: skip
            if value is None:
                continue
            if not isinstance(value, Tensor) or tuple(value.shape) != (n_rows,):
                got = tuple(value.shape) if isinstance(value, Tensor) else type(value).__name__
                raise FusedInputError(f"{arg} must have shape (R,) = ({n_rows},), one per row of _input, got {got}")
            fields[arg] = value.bool() if arg == "labels" else at_least_float32(value.detach())
        if Need.SCORES in self.needs and scores is None:
            raise FusedInputError(f"loss {self.loss_fn.name!r} needs each row's score: pass scores (R,)")
        if Need.KL_REFERENCE in self.needs and (kl_policy_logps is None or kl_ref_logps is None):
            raise FusedInputError(
                f"loss {self.loss_fn.name!r} needs the log-probs of mismatched pairs: pass kl_policy_logps and "
                "kl_ref_logps (R,)"
            )
        return fields


def fused_sequence_logps(
    lin_weight: Tensor,
    _input: Tensor,
    target: Tensor,
    bias: Tensor | None = None,
    *,
    ignore_index: int = -100,
    logit_scale: float = 1.0,
    softcap: float | None = None,
    chunk_size: int = 1024,
) -> Tensor:
    """(R,) Σ_t log π(target_t) of each row through the fused head: a reference's (under ``torch.no_grad()``), or
    the log-probs of mismatched pairs for ``kl_policy_logps`` / ``kl_ref_logps``.  Differentiable under autograd."""
    check_head(lin_weight, bias)
    check_rows(lin_weight, _input, target)
    pos = positions(target, ignore_index, lin_weight.shape[0])
    return policy_scores(lin_weight, bias, _input, pos, HeadOptions(chunk_size, _transform(logit_scale, softcap))).logps
