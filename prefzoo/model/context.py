"""The model's context length, and the prompt/completion token limits fitted into it (TRL's ``max_length``).

A row longer than the model's context crashes a model with learned position embeddings (``IndexError``, a device-side
assert on a GPU) and silently runs a rotary model past the positions it was trained on.  ``fit_to_context`` lowers
the default limits (1800 + 512 tokens) to the context, and refuses, in one line, an explicit limit that cannot fit.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from prefzoo.errors import ConfigError

__all__ = [
    "DEFAULT_MAX_COMPLETION_LENGTH",
    "DEFAULT_MAX_PROMPT_LENGTH",
    "ContextLengthError",
    "ContextLimits",
    "fit_to_context",
    "model_configs",
    "model_context",
]

DEFAULT_MAX_PROMPT_LENGTH = 1800  # prompt tokens kept (its END) when the user sets no limit and the context allows
DEFAULT_MAX_COMPLETION_LENGTH = 512  # completion tokens kept (its START, eos included), likewise
# config keys architectures use for the longest sequence they take (GPT-2 n_positions/n_ctx, MPT max_seq_len, ...)
_CONFIG_KEYS = ("max_position_embeddings", "n_positions", "max_sequence_length", "seq_length", "max_seq_len", "n_ctx")
_UNSET_TOKENIZER_LENGTH = 10**12  # tokenizers without a limit say int(1e30) (transformers' VERY_LARGE_INTEGER)


class ContextLengthError(ConfigError):
    """An explicit token limit does not fit in the model's context (the message names both numbers)."""


def _is_config(value: Any) -> bool:
    return hasattr(value, "to_dict") and hasattr(value, "model_type")


def model_configs(model: Any) -> Iterator[tuple[str, Any]]:
    """(dotted prefix, config) for each config of the model and its modules, nested ones too ("text_config.")."""
    modules = model.modules() if hasattr(model, "modules") else [model]
    todo = [("", m.config) for m in modules if _is_config(getattr(m, "config", None))]
    seen: set[int] = set()
    while todo:
        prefix, cfg = todo.pop(0)
        if id(cfg) in seen:
            continue
        seen.add(id(cfg))
        yield prefix, cfg
        todo += [(f"{prefix}{k}.", v) for k, v in list(vars(cfg).items()) if _is_config(v)]


def model_context(model: Any, tokenizer: Any = None) -> tuple[int | None, str]:
    """(tokens the model can attend over, where that number comes from); (None, reason) when nothing declares one.

    The smallest of the config's position limits (``max_position_embeddings``, ``n_positions``, ...) and the
    tokenizer's ``model_max_length`` when that is a real value rather than the "no limit" sentinel.
    """
    found: list[tuple[int, str]] = []
    for _, cfg in model_configs(model):
        for key in _CONFIG_KEYS:
            value = getattr(cfg, key, None)
            if isinstance(value, int) and not isinstance(value, bool) and value > 0:
                found.append((value, f"config {key}={value}"))
    limit = getattr(tokenizer, "model_max_length", None)
    if isinstance(limit, int) and 0 < limit < _UNSET_TOKENIZER_LENGTH:
        found.append((limit, f"tokenizer model_max_length={limit}"))
    if not found:
        return None, "neither the config nor the tokenizer declares a context length"
    return min(found)


@dataclass(frozen=True)
class ContextLimits:
    """The token limits a run uses, and why."""

    max_prompt_length: int  # prompt tokens kept, from the END of the prompt
    max_completion_length: int  # completion tokens kept, from the START (eos included)
    requested: tuple[int, int]  # (prompt, completion) before fitting: the user's values or the defaults
    context: int | None  # the model's context in tokens; None when it declares none
    source: str  # where ``context`` comes from, e.g. "config max_position_embeddings=128"

    @property
    def clipped(self) -> bool:
        return (self.max_prompt_length, self.max_completion_length) != self.requested

    def describe(self) -> str:
        """One log line: the effective limits and why."""
        p, c = self.max_prompt_length, self.max_completion_length
        where = f"the model's context of {self.context} tokens ({self.source})" if self.context else self.source
        if self.clipped:
            rp, rc = self.requested
            return (
                f"token limits: prompt {p} + completion {c} = {p + c}, clipped from {rp} + {rc} to fit {where} "
                "(prompts keep their end, completions their start; like TRL's max_length)"
            )
        return f"token limits: prompt {p} + completion {c} = {p + c}, within {where}"

    def as_dict(self) -> dict[str, Any]:
        return {
            "max_prompt_length": self.max_prompt_length,
            "max_completion_length": self.max_completion_length,
            "requested": list(self.requested),
            "context": self.context,
            "source": self.source,
            "clipped": self.clipped,
        }


def fit_to_context(
    max_prompt_length: int | None,
    max_completion_length: int | None,
    model: Any,
    tokenizer: Any = None,
    *,
    flags: tuple[str, str] = ("--max-prompt-length", "--max-completion-length"),
) -> ContextLimits:
    """Limits with prompt + completion <= the model's context; ``None`` means the default, clipped as needed.

    When the defaults do not fit, the completion keeps up to its 512 tokens but at most half the context and the
    prompt gets the rest (a 1024-token GPT-2: 512 + 512; a 2048-token model: 1536 + 512).  An explicit limit is never
    lowered: one that leaves no room for the other part, or two whose sum exceeds the context, raise
    :class:`ContextLengthError` naming the numbers (``flags`` names the options in the message).
    """
    p_req = DEFAULT_MAX_PROMPT_LENGTH if max_prompt_length is None else int(max_prompt_length)
    c_req = DEFAULT_MAX_COMPLETION_LENGTH if max_completion_length is None else int(max_completion_length)
    context, source = model_context(model, tokenizer)
    limits = ContextLimits(p_req, c_req, (p_req, c_req), context, source)
    if context is None or p_req + c_req <= context:
        return limits
    where = f"the model's context of {context} tokens ({source})"
    if context < 2:
        raise ContextLengthError(f"{where} has no room for a prompt token and a completion token")
    for flag, value in ((flags[0], max_prompt_length), (flags[1], max_completion_length)):
        if value is not None and value >= context:
            raise ContextLengthError(
                f"{flag} {value} does not fit in {where} with at least one token of the other part: "
                f"lower it below {context}, or leave it unset to fit it to the context"
            )
    if max_prompt_length is not None and max_completion_length is not None:
        raise ContextLengthError(
            f"{flags[0]} {max_prompt_length} + {flags[1]} {max_completion_length} = "
            f"{max_prompt_length + max_completion_length} exceeds {where}: lower one of them, or leave one unset "
            "to give it what the other leaves"
        )
    if max_prompt_length is not None:
        completion = context - max_prompt_length
        prompt = max_prompt_length
    elif max_completion_length is not None:
        prompt, completion = context - max_completion_length, max_completion_length
    else:
        completion = min(c_req, context // 2)
        prompt = context - completion
    return ContextLimits(prompt, completion, (p_req, c_req), context, source)
