"""What the DPO and KTO adapters share: a TRL config's fields bound to a prefzoo loss, divergence, the forward's
arguments, TRL's token metrics and the loss's own."""

from __future__ import annotations

import inspect
from collections.abc import Callable, Collection, Mapping
from typing import Any

import torch
from torch import Tensor

from prefzoo._attrs import field_defaults
from prefzoo.losses.combine import CombinedLoss, is_combination, parse_terms
from prefzoo.modifiers.compose import ModifiedLoss
from prefzoo.registry import get_loss, loss_spec
from prefzoo.spec import Loss, LossParamError

__all__ = [
    "PolicyDivergedError",
    "bind_loss",
    "check_policy_finite",
    "config_defaults",
    "finish_loss",
    "forward_kwargs",
    "is_default",
    "log_loss_metrics",
    "log_token_metrics",
    "resolve_at_init",
    "terms",
    "trl_init_signature",
]


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


def config_defaults(config_cls: type) -> dict[str, Any]:
    """Every field of a TRL config class with its default value."""
    return field_defaults(config_cls)


def is_default(name: str, value: Any, defaults: Mapping[str, Any]) -> bool:
    default = defaults.get(name)
    if name == "loss_type" and not isinstance(default, str):  # DPOConfig turns "sigmoid" into ["sigmoid"]
        value = [value] if isinstance(value, str) else list(value or [])
        default = list(default or [])
    return bool(value == default)


def terms(loss: Loss) -> list[Loss]:
    """The registered losses a bound loss is made of: the terms of a weighted sum, else the loss itself."""
    return [t for _, t in loss.terms] if isinstance(loss, CombinedLoss) else [loss]


def base_name(loss: Loss) -> str:
    """The name a loss's metrics are logged under: a modified loss's are its base loss's (``mmpo/...``)."""
    return loss.base.name if isinstance(loss, ModifiedLoss) else loss.name


def _term_params(loss: str | Loss) -> set[str]:
    """The parameter names of every term of ``loss``."""
    if isinstance(loss, Loss):
        return set().union(*(type(t.params).__dataclass_fields__ for t in terms(loss)))
    names = [n for _, n in parse_terms(loss)] if is_combination(loss) else [loss]
    return set().union(*(loss_spec(n).params_cls.__dataclass_fields__ for n in names))


def _check_loss_arg(loss: Any, params: Mapping[str, Any]) -> None:
    if isinstance(loss, Loss):
        if params:
            raise LossParamError(
                f"loss_params={dict(params)!r} with a Loss object: bind them into it (prefzoo.get_loss(name, **params))"
            )
    elif not isinstance(loss, str):
        raise TypeError(f"loss= takes a registered name, a weighted sum or a prefzoo.Loss, got {type(loss).__name__}")


def bind_loss(loss: str | Loss, loss_params: Mapping[str, Any] | None, config: Any, config_cls: type,
              same_meaning: Mapping[str, str], options: Mapping[str, str]) -> Loss:  # fmt: skip
    """The bound loss for ``loss=`` and ``loss_params=``, with the ``config`` fields of the same meaning.

    ``same_meaning``: config field -> loss parameter; the field's value goes to every term that has the parameter,
    unless ``loss_params`` sets it.  ``options``: TRL loss options that must stay at their defaults (-> what to do
    instead).  A conflict, a field set for a loss without the parameter, or a set option is one LossParamError line.
    """
    kind, defaults = config_cls.__name__, config_defaults(config_cls)
    values = {f: getattr(config, f, defaults.get(f)) for f in [*same_meaning, *options]}
    for field, instead in options.items():
        if not is_default(field, values[field], defaults):
            raise LossParamError(f"{kind}.{field}={values[field]!r} does not apply with loss={loss!r}: {instead}")
    params = dict(loss_params or {})
    _check_loss_arg(loss, params)
    have = _term_params(loss)
    for field, pname in same_meaning.items():
        value, set_by_user = values[field], not is_default(field, values[field], defaults)
        given = {k: v for k, v in params.items() if k.rpartition(".")[2] == pname}
        if set_by_user and pname not in have:
            raise LossParamError(
                f"{kind}.{field}={value!r} has no meaning for loss {getattr(loss, 'name', loss)!r} "
                f"(no parameter {pname!r}): leave it at its default {defaults[field]!r}"
            )
        if set_by_user and any(v != value for v in given.values()):
            k, v = next((k, v) for k, v in given.items() if v != value)
            raise LossParamError(f"{kind}.{field}={value!r} and loss_params[{k!r}]={v!r} disagree: set it once")
        if isinstance(loss, Loss):
            bound = [getattr(t.params, pname) for t in terms(loss) if hasattr(t.params, pname)]
            if set_by_user and any(v != value for v in bound):
                raise LossParamError(
                    f"{kind}.{field}={value!r} but the Loss object {loss.name!r} has {pname}={bound[0]!r}: set it once"
                )
        elif pname in have and not given:
            params[pname] = value
    return loss if isinstance(loss, Loss) else get_loss(loss, **params)


def trl_init_signature(trainer_cls: type) -> inspect.Signature:
    """The signature of TRL's own ``__init__`` behind ``trainer_cls``: a script that applies the drop-in everywhere
    (``trl.DPOTrainer = DPOTrainer``) must not make the adapter read its own signature where it means TRL's."""
    return inspect.signature(next(c for c in trainer_cls.__mro__ if c.__module__.startswith("trl.")))


def resolve_at_init(
    trl_init: inspect.Signature,
    args: tuple[Any, ...],
    kwargs: Mapping[str, Any],
    loss: str | Loss | None,
    loss_params: Mapping[str, Any] | None,
    resolve: Callable[[str | Loss, Mapping[str, Any] | None, Any], Loss],
) -> Loss | None:
    """The start of both adapters' ``__init__``: the bound loss (``resolve(loss, loss_params, config)`` with the TRL
    config the call passes as ``args``), or None without ``loss=``; ``loss_params=`` without ``loss=`` is an error.

    It runs before TRL loads anything, so a bad name or parameter fails in a second.
    """
    config = trl_init.bind(*args, **kwargs).arguments.get("args")
    if loss is None and loss_params:
        raise LossParamError("loss_params= needs loss=: name the prefzoo loss they belong to")
    return None if loss is None else resolve(loss, loss_params, config)


def forward_kwargs(trainer: Any, inputs: Mapping[str, Any], non_model_keys: Collection[str]) -> dict[str, Any]:
    """The policy forward's keyword arguments as TRL's ``_compute_loss`` builds them: the batch less
    ``non_model_keys``, no KV cache, and the MoE router logits when TRL adds their auxiliary loss."""
    kwargs = {k: v for k, v in inputs.items() if k not in non_model_keys}
    kwargs["use_cache"] = False
    if trainer.aux_loss_enabled:
        kwargs["output_router_logits"] = True
    return kwargs


def log_token_metrics(trainer: Any, mode: str, entropy: Tensor, mask: Tensor, attention_mask: Tensor) -> None:
    """TRL's ``entropy`` (the mean over every process's completion tokens) and ``num_tokens`` (tokens trained on so
    far) metrics; ``entropy`` and ``mask`` are (N, T−1), position t scoring token t+1."""
    acc, metrics = trainer.accelerator, trainer._metrics[mode]
    tokens = acc.gather_for_metrics(mask.sum()).sum()
    total = acc.gather_for_metrics((entropy.detach() * mask).sum()).sum()
    metrics["entropy"].append((total / tokens).item() if tokens > 0 else 0.0)
    if mode == "train":
        trainer._total_train_tokens += acc.gather_for_metrics(attention_mask.sum()).sum().item() // trainer._tp_size
    metrics["num_tokens"] = [trainer._total_train_tokens]


def log_loss_metrics(metrics: Any, loss: Loss, out: Any, gather: Any) -> None:
    """The loss's extra metrics (``mmpo/weight_chosen``, ``wpo/weight``, ...) averaged over processes, into TRL's
    ``self._metrics[mode]`` (``metrics``); TRL adds ``eval_`` in evaluation."""
    for key, value in sorted(out.metrics.items()):
        name = key if "/" in key else f"{base_name(loss)}/{key}"
        v = torch.as_tensor(value).detach().float().reshape(-1)  # a scalar or (B,)
        metrics[name].append(gather(v).mean().item())


def finish_loss(trainer: Any, mode: str, loss: Tensor, outputs: Any, model: Any, model_kwargs: Any,
                return_outputs: bool) -> Any:
    """The end of both adapters' ``compute_loss``: TRL's MoE router term (logged as ``aux_loss``), then the loss, or
    (loss, outputs) on TRL's deprecated path where compute_metrics wants the logits."""
    if trainer.aux_loss_enabled:
        loss = loss + trainer.router_aux_loss_coef * outputs.aux_loss
        aux = trainer.accelerator.gather_for_metrics(outputs.aux_loss).mean().item()
        trainer._metrics[mode]["aux_loss"].append(aux)
    if not return_outputs:
        return loss
    with torch.no_grad():
        return loss, model(**model_kwargs)
