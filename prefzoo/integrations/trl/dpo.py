"""Any prefzoo loss inside TRL's ``DPOTrainer``: one changed import, one replaced method.

    from trl import DPOConfig
    from prefzoo.integrations.trl import DPOTrainer      # was: from trl import DPOTrainer
    trainer = DPOTrainer(model, args=DPOConfig(...), train_dataset=ds, processing_class=tok, loss="mmpo")

Everything but the loss stays TRL's: dataset preparation, collator, reference handling (``ref_model``,
``precompute_ref_log_probs``, the PEFT adapter-disabled reference), metric names, callbacks, saving.  TRL 1.16
computes forward, loss and metrics in one method (``_compute_loss``), so that one method is replaced: the policy
forward is TRL's (its fused LM head), the reference log-probs come from TRL's ``compute_ref_log_probs`` or the
precomputed columns, the loss is prefzoo's, and TRL's metrics are logged under their names with the loss's own
rewards and its extra metrics beside them.  What the batch holds follows the loss's declared needs, never its name.
TRL's own loss options that prefzoo has as modifiers (WPO, LD-DPO, TR-DPO) become those modifiers
(:data:`CONFIG_MODIFIERS`), so they apply to any loss the modifier declares it can modify.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Mapping
from typing import Any

import torch
import trl
from torch import Tensor
from trl.trainer import dpo_trainer as _trl_dpo

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
from prefzoo.losses.combine import CombinedLoss
from prefzoo.modifiers.compose import ModifiedLoss
from prefzoo.registry import combine, modifier_spec, modify
from prefzoo.scoring import make_gather
from prefzoo.spec import Loss, LossParamError, ModifierError
from prefzoo.types import LossOutput, Need, PreferenceBatch, Shape

__all__ = ["CONFIG_MODIFIERS", "CONFIG_PARAMS", "DPOTrainer", "resolve_loss"]

_TRL_DPO_INIT = trl_init_signature(trl.DPOTrainer)

# DPOConfig fields that mean the same as a prefzoo loss parameter: DPOConfig field -> parameter name
CONFIG_PARAMS: dict[str, str] = {
    "beta": "beta",
    "label_smoothing": "label_smoothing",
    "f_divergence_type": "f_divergence",
    "f_alpha_divergence_coef": "alpha_divergence_coef",
    "discopop_tau": "tau",
}
# DPOConfig switches that prefzoo has as a modifier: field -> (modifier, {modifier parameter: DPOConfig field}).
# The modifier applies when the field is set away from its default (use_weighting=True, ld_alpha=0.5, ...)
CONFIG_MODIFIERS: dict[str, tuple[str, dict[str, str]]] = {
    "ld_alpha": ("ld-dpo", {"alpha": "ld_alpha"}),
    "use_weighting": ("wpo", {}),
    # TRL's own SyncRefModelCallback moves the reference (TRL installs it); the modifier checks the loss has one
    "sync_ref_model": ("tr-dpo", {"mixup_alpha": "ref_model_mixup_alpha", "sync_steps": "ref_model_sync_steps"}),
}
# DPOConfig fields that shape TRL's own loss: with a prefzoo loss they must stay at their defaults (what to do instead)
_TRL_LOSS_OPTIONS: dict[str, str] = {
    "loss_type": "loss= chooses the loss",
    "loss_weights": "write the weights into loss=, e.g. loss='0.8*dpo + 0.2*sft'",
}
_NON_MODEL_KEYS = {"completion_mask", "ref_chosen_logps", "ref_rejected_logps"}  # as TRL's _compute_loss


def _check_shapes(loss: Loss) -> None:
    """Refuse a loss (or a term) that cannot take pairs: TRL's batch holds (chosen, rejected) pairs only.

    A list loss takes pairs as groups of K = 2 (``LossSpec.accepts``); an unpaired one (``kto``, ``bco``) does not.
    """
    for term in terms(loss):
        if not term.spec.accepts(Shape.PAIR):
            shapes = ", ".join(sorted(s.value for s in term.spec.shapes))
            hint = "use prefzoo.integrations.trl.KTOTrainer" if Shape.UNPAIRED in term.spec.shapes else (
                "train it with `prefzoo train`"
            )
            raise LossParamError(
                f"loss {term.name!r} takes {shapes} batches, but TRL's DPOTrainer gives (chosen, rejected) pairs "
                f"only: {hint}"
            )


def _active_modifiers(config: Any) -> list[tuple[str, str, dict[str, Any]]]:
    """(DPOConfig field as set, modifier name, modifier params) for each :data:`CONFIG_MODIFIERS` field set."""
    defaults = {f.name: f.default for f in trl.DPOConfig.__dataclass_fields__.values()}
    out = []
    for field, (name, params) in CONFIG_MODIFIERS.items():
        value = getattr(config, field, defaults[field])
        if value != defaults[field]:
            values = {p: getattr(config, f, defaults[f]) for p, f in params.items()}
            out.append((f"DPOConfig.{field}={value!r}", name, values))
    return out


def _modify_term(term: Loss, setting: str, name: str, values: Mapping[str, Any]) -> Loss:
    """``term`` under modifier ``name``; one line naming the DPOConfig setting, the modifier and the loss if not."""
    if isinstance(term, ModifiedLoss) and any(m.name == name for m in term.modifiers):
        raise LossParamError(f"{setting} and the Loss object {term.name!r} both apply modifier {name!r}: set it once")
    try:
        modifier_spec(name).params(**values)
    except LossParamError as e:
        raise LossParamError(f"{setting} is out of range for prefzoo modifier {name!r}: {e}") from None
    try:
        return modify(term, (name, values))
    except ModifierError as e:
        why = str(e).partition(": ")[2] or str(e)
        raise LossParamError(
            f"{setting} (prefzoo modifier {name!r}) does not apply to loss {term.name!r}: {why}"
        ) from None


def apply_config_modifiers(loss: Loss, config: Any) -> Loss:
    """``loss`` under the modifiers its DPOConfig switches on (:data:`CONFIG_MODIFIERS`), each term of a weighted sum.

    A modifier that moves the reference (``ModifierSpec.updates_reference``: TR-DPO) acts on the run, not on a
    term's value: it modifies the terms it applies to and is refused only if it applies to none.
    """
    for setting, name, values in _active_modifiers(config):
        parts = [(w, t) for w, t in loss.terms] if isinstance(loss, CombinedLoss) else [(1.0, loss)]
        run_level = modifier_spec(name).updates_reference
        new, applied = [], 0
        for w, term in parts:
            if run_level and modifier_spec(name).why_not(term.spec, term.params) is not None and len(parts) > 1:
                new.append((w, term))
                continue
            new.append((w, _modify_term(term, setting, name, values)))
            applied += 1
        if run_level and not applied:  # no term takes it: the refusal names the first
            _modify_term(parts[0][1], setting, name, values)
        loss = combine(new) if isinstance(loss, CombinedLoss) else new[0][1]
    return loss


def resolve_loss(loss: str | Loss, loss_params: Mapping[str, Any] | None, config: Any = None) -> Loss:
    """The bound prefzoo loss for ``loss=`` and ``loss_params=``, with the DPOConfig fields of the same meaning.

    A :data:`CONFIG_PARAMS` field of ``config`` goes to every term that has the parameter, unless ``loss_params``
    sets it; a field set away from its default that ``loss_params`` sets differently, or that no term has, is a
    one-line :class:`LossParamError`, as is a TRL loss option (``loss_type``, ``loss_weights``) left non-default.
    A :data:`CONFIG_MODIFIERS` switch puts the loss under that prefzoo modifier.
    """
    bound = bind_loss(loss, loss_params, config, trl.DPOConfig, CONFIG_PARAMS, _TRL_LOSS_OPTIONS)
    bound = apply_config_modifiers(bound, config)
    _check_shapes(bound)
    if Need.TOKEN_SQUARED_PROBS in bound.needs and not getattr(config, "use_weighting", False):
        raise LossParamError(
            f"loss {bound.name!r} needs the policy's per-token log Σ_v π(v)², which TRL's fused LM head computes only "
            "with DPOConfig(use_weighting=True): apply WPO with that option rather than a Loss object's modifier"
        )
    if Need.REF_TOKEN_LOGPS in bound.needs and getattr(config, "precompute_ref_log_probs", False):
        raise LossParamError(
            f"loss {bound.name!r} needs the reference's per-token log-probs, which precomputed reference columns do "
            "not hold: set DPOConfig.precompute_ref_log_probs=False"
        )
    return bound


class DPOTrainer(trl.DPOTrainer):
    """TRL's ``DPOTrainer`` with one more argument: ``loss=`` (a registered name, a weighted sum, a ``prefzoo.Loss``).

    ``loss_params={...}`` sets the loss's parameters; DPOConfig's ``beta``, ``label_smoothing``,
    ``f_divergence_type``, ``f_alpha_divergence_coef`` and ``discopop_tau`` are used where the loss has a parameter of
    that meaning, ``use_weighting``, ``ld_alpha`` and ``sync_ref_model`` become prefzoo's ``wpo``, ``ld-dpo`` and
    ``tr-dpo`` modifiers (:func:`resolve_loss`).  Without ``loss=`` this is TRL's trainer unchanged.  A
    batch-coupled loss (``mmpo``) gathers over TRL's processes; the loss's extra metrics are logged beside TRL's.
    """

    def __init__(
        self, *args: Any, loss: str | Loss | None = None, loss_params: Mapping[str, Any] | None = None, **kwargs: Any
    ) -> None:
        self.prefzoo_loss = resolve_at_init(_TRL_DPO_INIT, args, kwargs, loss, loss_params, resolve_loss)
        super().__init__(*args, **kwargs)
        self._prefzoo_gather: Callable[[Tensor], Tensor] = make_gather(self.accelerator)

    def _compute_loss(self, model: Any, inputs: dict[str, Any], return_outputs: bool) -> Any:
        """TRL's forward and metrics around prefzoo's loss (TRL's own ``_compute_loss`` without ``loss=``)."""
        if self.prefzoo_loss is None:
            return super()._compute_loss(model, inputs, return_outputs)
        mode = "train" if model.training else "eval"
        model_kwargs = forward_kwargs(self, inputs, _NON_MODEL_KEYS)
        completion_mask = inputs["completion_mask"]
        mask = completion_mask[..., 1:]  # (2B, T−1): position t scores token t+1
        labels = inputs["input_ids"].masked_fill(completion_mask == 0, -100)
        outputs = model(**model_kwargs, labels=labels, fused_lm_head=True)
        check_policy_finite(outputs.log_probs[:, -mask.size(1) :].sum(dim=1), self.state.global_step + 1,
                            next(model.parameters()).dtype)  # fmt: skip
        batch = self._preference_batch(inputs, outputs, mask)
        out = self.prefzoo_loss(batch, gather=self._prefzoo_gather)
        loss = out.losses.mean()
        self._log_trl_metrics(mode, inputs, outputs, mask, batch, out)
        log_loss_metrics(self._metrics[mode], self.prefzoo_loss, out, self._prefzoo_gather)
        return finish_loss(self, mode, loss, outputs, model, model_kwargs, return_outputs)

    def _ref_token_logps(self, inputs: dict[str, Any], seq_len: int) -> Tensor:
        """The reference's per-token log-probs (2B, T−1), from the forward TRL's ``compute_ref_log_probs`` runs."""
        model: Any = self.ref_model or self.model
        policy: Any = self.model
        gc_kwargs: Any = self.args.gradient_checkpointing_kwargs
        adapter: Any = contextlib.nullcontext()
        if self.ref_model is None and _trl_dpo.is_peft_model(policy):  # the base model with the adapter disabled
            unwrapped = self.accelerator.unwrap_model(policy)
            adapter = _trl_dpo.use_adapter(unwrapped, adapter_name="ref" if "ref" in unwrapped.peft_config else None)
        model_kwargs = {k: v for k, v in inputs.items() if k not in _NON_MODEL_KEYS}
        labels = inputs["input_ids"].masked_fill(inputs["completion_mask"] == 0, -100)
        with (
            torch.no_grad(),
            _trl_dpo.disable_gradient_checkpointing(policy, gc_kwargs),
            adapter,
            self.accelerator.autocast(),
        ):
            out = model(**model_kwargs, use_cache=False, labels=labels, fused_lm_head=True).log_probs
        return out[:, -seq_len:]

    def _reference_fields(self, inputs: dict[str, Any], seq_len: int, dtype: torch.dtype) -> dict[str, Tensor]:
        """ref_chosen_logps, ref_rejected_logps and, for ``Need.REF_TOKEN_LOGPS`` (LD-DPO), the per-token ones."""
        assert self.prefzoo_loss is not None
        fields: dict[str, Tensor] = {}
        if Need.REF_TOKEN_LOGPS in self.prefzoo_loss.needs:  # never precomputed (resolve_loss refuses it)
            tokens = self._ref_token_logps(inputs, seq_len).to(dtype)  # (2B, T−1)
            fields["ref_chosen_token_logps"], fields["ref_rejected_token_logps"] = tokens.chunk(2, dim=0)
            ref: tuple[Tensor, Tensor] = tokens.sum(dim=1).chunk(2, dim=0)  # type: ignore[assignment]
        elif self.precompute_ref_logps:
            ref = inputs["ref_chosen_logps"], inputs["ref_rejected_logps"]
        else:
            ref = self.compute_ref_log_probs(self.ref_model or self.model, inputs)
        fields["ref_chosen_logps"], fields["ref_rejected_logps"] = (r.to(dtype).detach() for r in ref)
        return fields

    def _preference_batch(self, inputs: dict[str, Any], outputs: Any, mask: Tensor) -> PreferenceBatch:
        """The loss's inputs from TRL's forward: what its declared needs ask for, nothing more."""
        assert self.prefzoo_loss is not None
        needs = self.prefzoo_loss.needs
        seq_len = mask.size(1)
        token_logps = outputs.log_probs[:, -seq_len:]  # (2B, T−1), 0 off the completion; PEFT prompts cut
        chosen, rejected = token_logps.sum(dim=1).chunk(2, dim=0)  # (B,), (B,): the batch is [chosen; rejected]
        fields: dict[str, Tensor | None] = {"policy_chosen_logps": chosen, "policy_rejected_logps": rejected}
        if Need.LENGTHS in needs:
            fields["chosen_lengths"], fields["rejected_lengths"] = mask.sum(dim=1).long().chunk(2, dim=0)
        if Need.REFERENCE in needs:
            fields.update(self._reference_fields(inputs, seq_len, chosen.dtype))
        if Need.TOKEN_LOGPS in needs:
            fields["policy_chosen_token_logps"], fields["policy_rejected_token_logps"] = token_logps.chunk(2, dim=0)
        if Need.TOKEN_ENTROPIES in needs:
            entropies = outputs.entropy[:, -seq_len:]
            fields["chosen_token_entropies"], fields["rejected_token_entropies"] = entropies.chunk(2, dim=0)
        if Need.TOKEN_SQUARED_PROBS in needs:  # TRL's fused head adds log_sum_sq_probs with use_weighting=True
            sq = outputs.log_sum_sq_probs[:, -seq_len:].detach()  # (2B, T−1) log Σ_v π(v|prefix)², a constant
            fields["chosen_token_log_sq_probs"], fields["rejected_token_log_sq_probs"] = sq.chunk(2, dim=0)
        if needs & {Need.TOKEN_LOGPS, Need.TOKEN_ENTROPIES, Need.TOKEN_SQUARED_PROBS, Need.REF_TOKEN_LOGPS}:
            fields["chosen_mask"], fields["rejected_mask"] = mask.bool().chunk(2, dim=0)
        return PreferenceBatch(**fields)  # type: ignore[arg-type]

    def _log_trl_metrics(
        self, mode: str, inputs: dict[str, Any], outputs: Any, mask: Tensor, batch: PreferenceBatch, out: LossOutput
    ) -> None:
        """TRL 1.16's metrics under TRL's names; the rewards are the loss's own scores (``LossOutput``)."""
        acc, metrics = self.accelerator, self._metrics[mode]
        seq_len = mask.size(1)
        log_token_metrics(self, mode, outputs.entropy[:, -seq_len:], mask, inputs["attention_mask"])
        chosen_mask, rejected_mask = mask.bool().chunk(2, dim=0)
        chosen_logits, rejected_logits = outputs.mean_logits[:, -seq_len:].chunk(2, dim=0)
        for key, logits, m in (
            ("logits/chosen", chosen_logits, chosen_mask),
            ("logits/rejected", rejected_logits, rejected_mask),
        ):
            total, count = (acc.gather_for_metrics(x).sum().item() for x in (logits[m].sum(), m.sum()))
            metrics[key].append(total / count if count > 0 else 0.0)
        chosen_top1 = outputs.is_top1[:, -seq_len:].chunk(2, dim=0)[0] & chosen_mask
        correct, count = (acc.gather_for_metrics(x).sum() for x in (chosen_top1.sum(), chosen_mask.sum()))
        metrics["mean_token_accuracy"].append((correct / count).item() if count > 0 else 0.0)
        rw, rl = out.chosen_rewards.detach(), out.rejected_rewards.detach()  # (B,): the loss's scores
        metrics["rewards/chosen"].append(acc.gather(rw).mean().item())
        metrics["rewards/rejected"].append(acc.gather(rl).mean().item())
        metrics["rewards/accuracies"].append(acc.gather((rw > rl).float()).mean().item())
        metrics["rewards/margins"].append(acc.gather(rw - rl).mean().item())
        metrics["logps/chosen"].append(acc.gather(batch.policy_chosen_logps.detach()).mean().item())
        metrics["logps/rejected"].append(acc.gather(batch.policy_rejected_logps.detach()).mean().item())
