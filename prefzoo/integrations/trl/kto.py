"""Any prefzoo loss on unpaired feedback inside TRL's ``KTOTrainer``: one changed import, one replaced method.

    from trl import KTOConfig
    from prefzoo.integrations.trl import KTOTrainer      # was: from trl import KTOTrainer
    trainer = KTOTrainer(model, args=KTOConfig(...), train_dataset=ds, processing_class=tok, loss="bco")

TRL keeps the data (unpairing, tokenization, the mismatched KL completions and their sequential sampling), the
reference (``ref_model``, ``precompute_ref_log_probs``, PEFT), metrics, callbacks and saving.  TRL 1.16 computes
forward, KL estimate, loss and metrics in one method (``_compute_loss``); that method is replaced: the forwards are
TRL's, the loss is prefzoo's on an :class:`~prefzoo.types.UnpairedBatch` holding what the loss declares it needs,
and TRL's metrics are logged under TRL's names.  Every loss that declares ``Shape.UNPAIRED`` is taken.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Mapping
from typing import Any

import torch
import trl
from torch import Tensor
from trl.trainer import kto_trainer as _trl_kto

from prefzoo.integrations.trl._common import (
    bind_loss,
    check_policy_finite,
    finish_loss,
    forward_kwargs,
    log_loss_metrics,
    log_token_metrics,
    resolve_at_init,
    terms,
    trl_init_signature,
)
from prefzoo.scoring import make_gather
from prefzoo.spec import Loss, LossParamError
from prefzoo.types import LossOutput, Need, Shape, UnpairedBatch

__all__ = ["KTO_CONFIG_PARAMS", "KTOTrainer", "resolve_unpaired_loss"]

_TRL_KTO_INIT = trl_init_signature(trl.KTOTrainer)

# KTOConfig fields that mean the same as a prefzoo loss parameter: KTOConfig field -> parameter name
KTO_CONFIG_PARAMS: dict[str, str] = {
    "beta": "beta",
    "desirable_weight": "desirable_weight",
    "undesirable_weight": "undesirable_weight",
}
_TRL_LOSS_OPTIONS: dict[str, str] = {"loss_type": "loss= chooses the loss"}
# TRL's loss type that builds no KL completions: used when the prefzoo loss does not need Need.KL_REFERENCE
_NO_KL_LOSS_TYPE = "apo_zero_unpaired"
_NON_MODEL_KEYS = {"completion_mask", "KL_input_ids", "KL_attention_mask", "KL_completion_mask", "KL_token_type_ids",
                   "KL_mm_token_type_ids", "label", "ref_logps", "ref_KL_logps"}  # as TRL's _compute_loss  # fmt: skip


def resolve_unpaired_loss(loss: str | Loss, loss_params: Mapping[str, Any] | None, config: Any = None) -> Loss:
    """The bound prefzoo loss for ``loss=`` and ``loss_params=``, with KTOConfig's fields of the same meaning.

    As :func:`prefzoo.integrations.trl.resolve_loss`, for :data:`KTO_CONFIG_PARAMS`; every term must declare the
    unpaired shape (``LossSpec.shapes``), else one line naming it.
    """
    bound = bind_loss(loss, loss_params, config, trl.KTOConfig, KTO_CONFIG_PARAMS, _TRL_LOSS_OPTIONS)
    for term in terms(bound):
        if Shape.UNPAIRED not in term.spec.shapes:
            shapes = ", ".join(sorted(s.value for s in term.spec.shapes))
            raise LossParamError(
                f"loss {term.name!r} takes {shapes} batches, but TRL's KTOTrainer gives unpaired (completion, label) "
                "examples only: use prefzoo.integrations.trl.DPOTrainer for pairs, `prefzoo train` for lists"
            )
    return bound


def _trl_args(args: tuple[Any, ...], kwargs: dict[str, Any], loss: Loss) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """TRL's arguments, with KTOConfig's ``loss_type`` chosen from the loss's needs: KTO's (KL completions built,
    sequential batches) when it declares ``Need.KL_REFERENCE``, APO-zero-unpaired's (none) when it does not."""
    bound = _TRL_KTO_INIT.bind(*args, **kwargs)
    config = bound.arguments.get("args")
    if config is None or Need.KL_REFERENCE in loss.needs:
        return args, kwargs
    config = copy.copy(config)  # the caller's config is left as it was
    config.loss_type = _NO_KL_LOSS_TYPE
    bound.arguments["args"] = config
    return bound.args, bound.kwargs


class KTOTrainer(trl.KTOTrainer):
    """TRL's ``KTOTrainer`` with one more argument: ``loss=`` (a registered unpaired loss, a weighted sum of them, a
    ``prefzoo.Loss``).

    ``loss_params={...}`` sets the loss's parameters; KTOConfig's ``beta``, ``desirable_weight`` and
    ``undesirable_weight`` are used where the loss has a parameter of that meaning (:func:`resolve_unpaired_loss`).
    Without ``loss=`` this is TRL's trainer unchanged.  A stateful loss (``bco``'s running reward mean) advances on
    training calls only; a batch-coupled one (``kto``'s z₀, ``bco``'s mean) gathers over TRL's processes.
    """

    def __init__(
        self, *args: Any, loss: str | Loss | None = None, loss_params: Mapping[str, Any] | None = None, **kwargs: Any
    ) -> None:
        self.prefzoo_loss = resolve_at_init(_TRL_KTO_INIT, args, kwargs, loss, loss_params, resolve_unpaired_loss)
        if self.prefzoo_loss is not None:
            args, kwargs = _trl_args(args, kwargs, self.prefzoo_loss)
        super().__init__(*args, **kwargs)
        self._prefzoo_gather: Callable[[Tensor], Tensor] = make_gather(self.accelerator)

    def _compute_loss(self, model: Any, inputs: dict[str, Any], return_outputs: bool) -> Any:
        """TRL's forwards and metrics around prefzoo's loss (TRL's own ``_compute_loss`` without ``loss=``)."""
        if self.prefzoo_loss is None:
            return super()._compute_loss(model, inputs, return_outputs)
        mode = "train" if model.training else "eval"
        device = self.accelerator.device
        batch = {k: (v.to(device) if isinstance(v, Tensor) else v) for k, v in inputs.items()}
        kl = self.calculate_KL and Need.KL_REFERENCE in self.prefzoo_loss.needs
        kl_logps = self._compute_kl_logps(model, batch) if kl else None  # (N,) no grad, before the forward as TRL
        model_kwargs = forward_kwargs(self, batch, _NON_MODEL_KEYS)
        labels = batch["input_ids"].masked_fill(batch["completion_mask"] == 0, -100)
        outputs = model(**model_kwargs, labels=labels, fused_lm_head=True)
        seq_len = batch["input_ids"].size(1) - 1
        token_logps = outputs.log_probs[:, -seq_len:]  # (N, T−1), 0 off the completion; PEFT prompts cut
        check_policy_finite(token_logps.sum(-1), self.state.global_step + 1, next(model.parameters()).dtype)
        ub = self._unpaired_batch(batch, model_kwargs, labels, outputs, seq_len, kl_logps)
        out = self.prefzoo_loss(ub, gather=self._prefzoo_gather)
        loss = out.losses.nanmean()  # as TRL
        self._log_trl_metrics(mode, batch, outputs, seq_len, ub, out)
        log_loss_metrics(self._metrics[mode], self.prefzoo_loss, out, self._prefzoo_gather)
        return finish_loss(self, mode, loss, outputs, model, model_kwargs, return_outputs)

    def _reference(
        self, batch: dict[str, Any], model_kwargs: dict[str, Any], labels: Tensor, seq_len: int, kl: bool
    ) -> tuple[Tensor, Tensor | None]:
        """(log π_ref(y|x) (N,), log π_ref(y'|x) of the KL completions (N,) or None), as TRL's ``_compute_loss``."""
        if self.precompute_ref_logps:
            return batch["ref_logps"], (batch["ref_KL_logps"] if kl else None)
        kwargs = {k: v for k, v in model_kwargs.items() if k != "output_router_logits"}
        policy: Any = self.model
        ref: Any = self.ref_model
        gc_kwargs: Any = self.args.gradient_checkpointing_kwargs
        with torch.no_grad(), _trl_kto.disable_gradient_checkpointing(policy, gc_kwargs):
            if _trl_kto.is_peft_model(policy) and ref is None:  # the base model with the adapter disabled
                unwrapped = self.accelerator.unwrap_model(policy)
                with _trl_kto.use_adapter(unwrapped, adapter_name="ref" if "ref" in unwrapped.peft_config else None):
                    ref_kl = self._compute_kl_logps(policy, batch) if kl else None
                    out = policy(**kwargs, labels=labels, fused_lm_head=True)
            else:
                ref_kl = self._compute_kl_logps(ref, batch) if kl else None
                out = ref(**kwargs, labels=labels, fused_lm_head=True)
        return out.log_probs[:, -seq_len:].sum(-1), ref_kl

    def _unpaired_batch(self, batch: dict[str, Any], model_kwargs: dict[str, Any], labels: Tensor, outputs: Any,
                        seq_len: int, kl_logps: Tensor | None) -> UnpairedBatch:  # fmt: skip
        """The loss's inputs from TRL's forwards: what its declared needs ask for, nothing more."""
        assert self.prefzoo_loss is not None
        needs = self.prefzoo_loss.needs
        token_logps = outputs.log_probs[:, -seq_len:]  # (N, T−1)
        mask = batch["completion_mask"][:, 1:]  # (N, T−1): position t scores token t+1
        logps = token_logps.sum(-1)  # (N,)
        labels_ = torch.as_tensor(batch["label"]).bool().to(logps.device)  # (N,) True = desirable
        fields: dict[str, Any] = {"policy_logps": logps, "labels": labels_}
        if Need.REFERENCE in needs:
            ref, ref_kl = self._reference(batch, model_kwargs, labels, seq_len, kl_logps is not None)
            fields["ref_logps"] = ref.to(logps.dtype).detach()
            if kl_logps is not None and ref_kl is not None:
                fields["kl_policy_logps"] = kl_logps.to(logps.dtype).detach()
                fields["kl_ref_logps"] = ref_kl.to(logps.dtype).detach()
        if Need.LENGTHS in needs:
            fields["lengths"] = mask.sum(-1).long()
        if Need.TOKEN_LOGPS in needs:
            fields["policy_token_logps"] = token_logps
        if Need.TOKEN_ENTROPIES in needs:
            fields["token_entropies"] = outputs.entropy[:, -seq_len:]
        if needs & {Need.TOKEN_LOGPS, Need.TOKEN_ENTROPIES}:
            fields["token_mask"] = mask.bool()
        return UnpairedBatch(**fields)

    def _log_trl_metrics(
        self, mode: str, batch: dict[str, Any], outputs: Any, seq_len: int, ub: UnpairedBatch, out: LossOutput
    ) -> None:
        """TRL 1.16's KTO metrics under TRL's names; the rewards are the loss's own scores (``LossOutput.rewards``)."""
        acc, metrics = self.accelerator, self._metrics[mode]
        kl = torch.zeros((), device=ub.policy_logps.device)
        if ub.kl_policy_logps is not None and ub.kl_ref_logps is not None:
            kl = acc.gather_for_metrics((ub.kl_policy_logps - ub.kl_ref_logps).mean().detach()).mean().clamp(min=0)
        metrics["kl"].append(kl.item())
        mask = batch["completion_mask"][:, 1:]
        log_token_metrics(self, mode, outputs.entropy[:, -seq_len:], mask, batch["attention_mask"])
        rewards = (out.rewards if out.rewards is not None else out.chosen_rewards).detach()  # (N,)
        logits, logps = outputs.mean_logits[:, -seq_len:], ub.policy_logps.detach()
        present = []  # the sides with an example on some process (a key is only touched when it gets a value)
        for side, rows in (("chosen", ub.labels), ("rejected", ~ub.labels)):
            m = mask.bool() & rows[:, None]
            total, count = (acc.gather_for_metrics(x).sum().item() for x in (logits[m].sum(), m.sum()))
            if count > 0:
                metrics[f"logits/{side}"].append(total / count)
            n = acc.gather_for_metrics(rows.sum()).sum().item()
            if n > 0:
                metrics[f"rewards/{side}"].append(acc.gather_for_metrics(rewards[rows].nansum()).nansum().item() / n)
                metrics[f"logps/{side}"].append(acc.gather_for_metrics(logps[rows].nansum()).nansum().item() / n)
                present.append(side)
        if len(present) == 2:
            metrics["rewards/margins"].append(metrics["rewards/chosen"][-1] - metrics["rewards/rejected"][-1])
