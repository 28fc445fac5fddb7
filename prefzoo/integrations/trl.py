"""Any prefzoo loss inside TRL's ``DPOTrainer``, with one changed import.

    from trl import DPOConfig
    from prefzoo.integrations.trl import DPOTrainer      # was: from trl import DPOTrainer
    trainer = DPOTrainer(model, args=DPOConfig(...), train_dataset=ds, processing_class=tok, loss="mmpo")

Everything but the loss stays TRL's: dataset preparation, collator, reference handling (``ref_model``,
``precompute_ref_log_probs``, the PEFT adapter-disabled reference), metric names, callbacks, saving.  TRL 1.16
computes forward, loss and metrics in one method (``_compute_loss``), so that one method is replaced: the policy
forward is TRL's (its fused LM head), the reference log-probs come from TRL's ``compute_ref_log_probs`` or the
precomputed columns, the loss is prefzoo's, and TRL's metrics are logged under their names with the loss's own
rewards and its extra metrics beside them.  What the batch holds follows the loss's declared needs, never its name.
TRL's internals change between releases, so the supported range is checked at import (:data:`TRL_RANGE`).
"""

from __future__ import annotations

import dataclasses
import inspect
from collections.abc import Callable, Mapping
from typing import Any

import torch
from torch import Tensor

from prefzoo.losses.combine import CombinedLoss, is_combination, parse_terms
from prefzoo.registry import get_loss, loss_spec
from prefzoo.spec import Loss, LossParamError
from prefzoo.train.engines import make_gather
from prefzoo.types import LossOutput, Need, PreferenceBatch, Shape

__all__ = [
    "CONFIG_PARAMS",
    "TRL_RANGE",
    "DPOTrainer",
    "PolicyDivergedError",
    "TRLVersionError",
    "check_trl_version",
    "resolve_loss",
]

TRL_RANGE = ">=1.16,<1.17"  # the `trl` extra of pyproject.toml pins the same range (a test compares them)


class TRLVersionError(ImportError):
    """The installed TRL is outside :data:`TRL_RANGE`: its ``DPOTrainer`` internals may differ."""


class PolicyDivergedError(FloatingPointError):
    """The policy's log-probs are not finite: training diverged (typically float16 at a high learning rate).

    TRL's own loop goes on with NaN weights; the adapter stops at the first non-finite log-prob, in one line.
    """


def check_policy_finite(logps: Tensor, step: int, dtype: torch.dtype) -> None:
    """Raise :class:`PolicyDivergedError` (one line: the step, the dtype, what to try) if ``logps`` has a NaN/inf."""
    bad = ~torch.isfinite(logps.detach())
    if bool(bad.any()):
        value = logps.detach()[bad][0].item()
        dtype_name = str(dtype).removeprefix("torch.")
        hint = "a lower learning_rate, or bf16=True (float16's narrow range overflows)" if dtype == torch.float16 else (
            "a lower learning_rate, or gradient clipping (max_grad_norm)"
        )
        raise PolicyDivergedError(
            f"the policy diverged at step {step} in {dtype_name}: its sequence log-probs are {value} "
            f"({int(bad.sum())} of {bad.numel()} sequences); the weights are no longer finite: stop, and try {hint}"
        )


def check_trl_version(version: str) -> None:
    """Raise :class:`TRLVersionError` (one line naming the range) when TRL ``version`` is outside :data:`TRL_RANGE`."""
    from packaging.specifiers import SpecifierSet
    from packaging.version import InvalidVersion, Version

    try:
        ok = Version(version) in SpecifierSet(TRL_RANGE)
    except InvalidVersion:
        ok = False
    if not ok:
        raise TRLVersionError(
            f"prefzoo.integrations.trl supports trl{TRL_RANGE}, found trl {version}: "
            f"pip install 'prefzoo[trl]' (or 'trl{TRL_RANGE}')"
        )


try:
    import trl
except ImportError:
    raise ImportError("prefzoo.integrations.trl needs TRL: pip install 'prefzoo[trl]'") from None
check_trl_version(trl.__version__)
# TRL's trainer as imported: a script that applies the drop-in everywhere (``trl.DPOTrainer = DPOTrainer``) must not
# make the adapter read its own signature where it means TRL's
_TRL_DPO_INIT = inspect.signature(next(c for c in trl.DPOTrainer.__mro__ if c.__module__.startswith("trl.")))

# DPOConfig fields that mean the same as a prefzoo loss parameter: DPOConfig field -> parameter name
CONFIG_PARAMS: dict[str, str] = {
    "beta": "beta",
    "label_smoothing": "label_smoothing",
    "f_divergence_type": "f_divergence",
    "f_alpha_divergence_coef": "alpha_divergence_coef",
    "discopop_tau": "tau",
}
# DPOConfig fields that shape TRL's own loss: with a prefzoo loss they must stay at their defaults (what to do instead)
_TRL_LOSS_OPTIONS: dict[str, str] = {
    "loss_type": "loss= chooses the loss",
    "loss_weights": "write the weights into loss=, e.g. loss='0.8*dpo + 0.2*sft'",
    "use_weighting": "WPO weighting is part of TRL's own losses only",
    "ld_alpha": "LD-DPO's length-desensitized log-probs are part of TRL's own losses only",
}
_NON_MODEL_KEYS = {"completion_mask", "ref_chosen_logps", "ref_rejected_logps"}  # as TRL's _compute_loss


def _config_defaults() -> dict[str, Any]:
    out = {}
    for f in dataclasses.fields(trl.DPOConfig):
        if f.default is not dataclasses.MISSING:
            out[f.name] = f.default
        elif f.default_factory is not dataclasses.MISSING:
            out[f.name] = f.default_factory()
    return out


def _is_default(name: str, value: Any, defaults: Mapping[str, Any]) -> bool:
    default = defaults.get(name)
    if name == "loss_type":  # DPOConfig turns "sigmoid" into ["sigmoid"]
        value = [value] if isinstance(value, str) else list(value or [])
        default = [default] if isinstance(default, str) else list(default or [])
    return bool(value == default)


def _term_params(loss: str | Loss) -> list[set[str]]:
    """The parameter names of each term of ``loss`` (one set for a single loss)."""
    if isinstance(loss, CombinedLoss):
        return [set(type(t.params).__dataclass_fields__) for _, t in loss.terms]
    if isinstance(loss, Loss):
        return [set(type(loss.params).__dataclass_fields__)]
    names = [n for _, n in parse_terms(loss)] if is_combination(loss) else [loss]
    return [set(loss_spec(n).params_cls.__dataclass_fields__) for n in names]


def _bound_values(loss: Loss, pname: str) -> list[Any]:
    terms = [t for _, t in loss.terms] if isinstance(loss, CombinedLoss) else [loss]
    return [getattr(t.params, pname) for t in terms if hasattr(t.params, pname)]


def _check_shapes(loss: Loss) -> None:
    """Refuse a loss (or a term) that cannot take pairs: TRL's batch holds (chosen, rejected) pairs only.

    A list loss takes pairs as groups of K = 2 (``LossSpec.accepts``); an unpaired one (``kto``, ``bco``) does not.
    """
    terms = [t for _, t in loss.terms] if isinstance(loss, CombinedLoss) else [loss]
    for term in terms:
        if not term.spec.accepts(Shape.PAIR):
            shapes = ", ".join(sorted(s.value for s in term.spec.shapes))
            raise LossParamError(
                f"loss {term.name!r} takes {shapes} batches, but TRL's DPOTrainer gives (chosen, rejected) pairs "
                "only: train it with `prefzoo train`"
            )


def resolve_loss(loss: str | Loss, loss_params: Mapping[str, Any] | None, config: Any = None) -> Loss:
    """The bound prefzoo loss for ``loss=`` and ``loss_params=``, with the DPOConfig fields of the same meaning.

    A :data:`CONFIG_PARAMS` field of ``config`` goes to every term that has the parameter, unless ``loss_params``
    sets it; a field set away from its default that ``loss_params`` sets differently, or that no term has, is a
    one-line :class:`LossParamError`, as is a TRL loss option (``loss_type``, ``loss_weights``, ...) left non-default.
    """
    defaults = _config_defaults()
    values = {f: getattr(config, f, defaults.get(f)) for f in [*CONFIG_PARAMS, *_TRL_LOSS_OPTIONS]}
    for field, instead in _TRL_LOSS_OPTIONS.items():
        if not _is_default(field, values[field], defaults):
            raise LossParamError(f"DPOConfig.{field}={values[field]!r} does not apply with loss={loss!r}: {instead}")
    params = dict(loss_params or {})
    if isinstance(loss, Loss):
        if params:
            raise LossParamError(
                f"loss_params={params!r} with a Loss object: bind them into it (prefzoo.get_loss(name, **params))"
            )
    elif not isinstance(loss, str):
        raise TypeError(f"loss= takes a registered name, a weighted sum or a prefzoo.Loss, got {type(loss).__name__}")
    have = set().union(*_term_params(loss))
    for field, pname in CONFIG_PARAMS.items():
        value, set_by_user = values[field], not _is_default(field, values[field], defaults)
        given = {k: v for k, v in params.items() if k.rpartition(".")[2] == pname}
        if set_by_user and pname not in have:
            raise LossParamError(
                f"DPOConfig.{field}={value!r} has no meaning for loss {getattr(loss, 'name', loss)!r} "
                f"(no parameter {pname!r}): leave it at its default {defaults[field]!r}"
            )
        if set_by_user and any(v != value for v in given.values()):
            k, v = next((k, v) for k, v in given.items() if v != value)
            raise LossParamError(f"DPOConfig.{field}={value!r} and loss_params[{k!r}]={v!r} disagree: set it once")
        if isinstance(loss, Loss):
            bound = _bound_values(loss, pname)
            if set_by_user and any(v != value for v in bound):
                raise LossParamError(
                    f"DPOConfig.{field}={value!r} but the Loss object {loss.name!r} has {pname}={bound[0]!r}: "
                    "set it once"
                )
        elif pname in have and not given:
            params[pname] = value
    bound_loss = loss if isinstance(loss, Loss) else get_loss(loss, **params)
    _check_shapes(bound_loss)
    return bound_loss


class DPOTrainer(trl.DPOTrainer):
    """TRL's ``DPOTrainer`` with one more argument: ``loss=`` (a registered name, a weighted sum, a ``prefzoo.Loss``).

    ``loss_params={...}`` sets the loss's parameters; DPOConfig's ``beta``, ``label_smoothing``,
    ``f_divergence_type``, ``f_alpha_divergence_coef`` and ``discopop_tau`` are used where the loss has a parameter of
    that meaning (:func:`resolve_loss`).  Without ``loss=`` this is TRL's trainer unchanged.  A batch-coupled loss
    (``mmpo``) gathers over TRL's processes; the loss's extra metrics are logged beside TRL's (``mmpo/...``).
    """

    def __init__(
        self, *args: Any, loss: str | Loss | None = None, loss_params: Mapping[str, Any] | None = None, **kwargs: Any
    ) -> None:
        config = _TRL_DPO_INIT.bind(*args, **kwargs).arguments.get("args")
        if loss is None and loss_params:
            raise LossParamError("loss_params= needs loss=: name the prefzoo loss they belong to")
        # resolved before TRL loads anything, so a bad name or parameter fails in a second
        self.prefzoo_loss: Loss | None = None if loss is None else resolve_loss(loss, loss_params, config)
        super().__init__(*args, **kwargs)
        self._prefzoo_gather: Callable[[Tensor], Tensor] = make_gather(self.accelerator)

    def _compute_loss(self, model: Any, inputs: dict[str, Any], return_outputs: bool) -> Any:
        """TRL's forward and metrics around prefzoo's loss (TRL's own ``_compute_loss`` without ``loss=``)."""
        if self.prefzoo_loss is None:
            return super()._compute_loss(model, inputs, return_outputs)
        mode = "train" if model.training else "eval"
        model_kwargs = {k: v for k, v in inputs.items() if k not in _NON_MODEL_KEYS}
        model_kwargs["use_cache"] = False
        if self.aux_loss_enabled:
            model_kwargs["output_router_logits"] = True
        completion_mask = inputs["completion_mask"]
        mask = completion_mask[..., 1:]  # (2B, T−1): position t scores token t+1
        labels = inputs["input_ids"].masked_fill(completion_mask == 0, -100)
        outputs = model(**model_kwargs, labels=labels, fused_lm_head=True)
        check_policy_finite(outputs.log_probs[:, -mask.size(1) :].sum(dim=1), self.state.global_step + 1,
                            next(model.parameters()).dtype)  # fmt: skip
        batch = self._preference_batch(inputs, outputs, mask)
        out = self.prefzoo_loss(batch, gather=self._prefzoo_gather)
        loss = out.losses.mean()
        if self.aux_loss_enabled:
            loss = loss + self.router_aux_loss_coef * outputs.aux_loss
            self._metrics[mode]["aux_loss"].append(self.accelerator.gather_for_metrics(outputs.aux_loss).mean().item())
        self._log_trl_metrics(mode, inputs, outputs, mask, batch, out)
        self._log_loss_metrics(mode, out)
        if return_outputs:  # TRL's deprecated path: compute_metrics wants logits
            with torch.no_grad():
                outputs = model(**model_kwargs)
            return loss, outputs
        return loss

    def _preference_batch(self, inputs: dict[str, Any], outputs: Any, mask: Tensor) -> PreferenceBatch:
        """The loss's inputs from TRL's forward: what its declared needs ask for, nothing more."""
        assert self.prefzoo_loss is not None
        needs = self.prefzoo_loss.needs
        seq_len = mask.size(1)
        token_logps = outputs.log_probs[:, -seq_len:]  # (2B, T−1), 0 off the completion; PEFT prompts cut
        chosen, rejected = token_logps.sum(dim=1).chunk(2, dim=0)  # (B,), (B,): the batch is [chosen; rejected]
        fields: dict[str, Tensor | None] = {"policy_chosen_logps": chosen, "policy_rejected_logps": rejected}
        chosen_mask, rejected_mask = mask.bool().chunk(2, dim=0)  # (B, T−1) each
        if Need.LENGTHS in needs:
            fields["chosen_lengths"], fields["rejected_lengths"] = mask.sum(dim=1).long().chunk(2, dim=0)
        if Need.REFERENCE in needs:
            if self.precompute_ref_logps:
                ref = inputs["ref_chosen_logps"], inputs["ref_rejected_logps"]
            else:
                ref = self.compute_ref_log_probs(self.ref_model or self.model, inputs)
            fields["ref_chosen_logps"], fields["ref_rejected_logps"] = (r.to(chosen.dtype).detach() for r in ref)
        if Need.TOKEN_LOGPS in needs:
            fields["policy_chosen_token_logps"], fields["policy_rejected_token_logps"] = token_logps.chunk(2, dim=0)
        if Need.TOKEN_ENTROPIES in needs:
            entropies = outputs.entropy[:, -seq_len:]
            fields["chosen_token_entropies"], fields["rejected_token_entropies"] = entropies.chunk(2, dim=0)
        if Need.TOKEN_LOGPS in needs or Need.TOKEN_ENTROPIES in needs:
            fields["chosen_mask"], fields["rejected_mask"] = chosen_mask, rejected_mask
        return PreferenceBatch(**fields)  # type: ignore[arg-type]

    def _log_trl_metrics(
        self, mode: str, inputs: dict[str, Any], outputs: Any, mask: Tensor, batch: PreferenceBatch, out: LossOutput
    ) -> None:
        """TRL 1.16's metrics under TRL's names; the rewards are the loss's own scores (``LossOutput``)."""
        acc, metrics = self.accelerator, self._metrics[mode]
        seq_len = mask.size(1)
        tokens = acc.gather_for_metrics(mask.sum()).sum()
        entropy = acc.gather_for_metrics((outputs.entropy[:, -seq_len:].detach() * mask).sum()).sum()
        metrics["entropy"].append((entropy / tokens).item() if tokens > 0 else 0.0)
        if mode == "train":
            self._total_train_tokens += (
                acc.gather_for_metrics(inputs["attention_mask"].sum()).sum().item() // self._tp_size
            )
        metrics["num_tokens"] = [self._total_train_tokens]
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

    def _log_loss_metrics(self, mode: str, out: LossOutput) -> None:
        """The loss's extra metrics (``mmpo/weight_chosen``, ...), averaged over processes; TRL adds ``eval_``."""
        assert self.prefzoo_loss is not None
        for key, value in sorted(out.metrics.items()):
            name = key if "/" in key else f"{self.prefzoo_loss.name}/{key}"
            v = torch.as_tensor(value).detach().float().reshape(-1)  # a scalar or (B,)
            self._metrics[mode][name].append(self._prefzoo_gather(v).mean().item())
