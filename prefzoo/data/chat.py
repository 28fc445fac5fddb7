"""Prompts and completions as token ids, rendered one way for training and for evaluation (TRL's convention).

- A plain-string prompt is used as given: ``tokenizer(prompt).input_ids`` (the tokenizer adds its own BOS if it
  does).  It is never wrapped in a chat template, so an already-templated prompt is not templated twice.
- A conversation (a list of ``{"role", "content"}`` messages) goes through the tokenizer's chat template with the
  generation prompt.  Without a template its contents are joined by blank lines (roles are lost: warned once).
- A completion after a plain prompt is ``text + eos``.  After a conversation it is what the template renders for
  the assistant turn (``Paris<|im_end|>\\n`` for ChatML, ``Paris<|eot_id|>`` for Llama 3,
  ``Paris<end_of_turn>\\n`` for Gemma): the rendering of prompt + answer minus the rendering of the prompt, so no
  BOS or EOS is added twice.

``--chat-template`` chooses the template: ``auto`` (the tokenizer's own), ``none`` (no template: conversations are
flattened) or a ``.jinja`` file (replaces the tokenizer's).
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from prefzoo.data.formats import DataFormatError

__all__ = [
    "Prompt",
    "check_chat_template",
    "has_chat_template",
    "render_completion",
    "render_prompt",
    "set_chat_template",
]

log = logging.getLogger(__name__)

Prompt = str | list[dict[str, str]]
_warned: set[str] = set()  # tokenizers already warned about flattened conversations (by name)


def set_chat_template(tokenizer: Any, choice: str | None) -> str:
    """Apply ``--chat-template`` (``auto``, ``none`` or a path to a ``.jinja`` file); returns what was decided."""
    if choice in (None, "auto"):
        return "the tokenizer's own" if has_chat_template(tokenizer) else "none (the tokenizer has no chat template)"
    if choice == "none":
        tokenizer.chat_template = None
        return "none (--chat-template none)"
    path = Path(choice).expanduser()
    if not path.is_file():
        raise DataFormatError(
            f"--chat-template {choice}: no such file; give 'auto' (the tokenizer's), 'none', or a .jinja file"
        )
    tokenizer.chat_template = path.read_text()
    return f"{path} (--chat-template)"


def has_chat_template(tokenizer: Any) -> bool:
    return bool(getattr(tokenizer, "chat_template", None))


def _ids(out: Any) -> list[int]:
    if isinstance(out, dict) or hasattr(out, "input_ids"):  # BatchEncoding in newer transformers
        out = out["input_ids"]
    return list(out)


def _warn_flattened(tokenizer: Any) -> None:
    name = str(getattr(tokenizer, "name_or_path", "") or type(tokenizer).__name__)
    if name in _warned:
        return
    _warned.add(name)
    log.warning(
        "the tokenizer %s has no chat template: conversations are flattened to their contents joined by blank "
        "lines (roles are lost). Give one with --chat-template PATH.jinja, or set tokenizer.chat_template",
        name,
    )


def render_prompt(tokenizer: Any, prompt: Prompt) -> list[int]:
    """Prompt token ids: a string as given; a conversation through the chat template (with the generation prompt)."""
    if isinstance(prompt, str):
        return list(tokenizer(prompt).input_ids)
    if has_chat_template(tokenizer):
        return _ids(tokenizer.apply_chat_template(prompt, add_generation_prompt=True, tokenize=True))
    _warn_flattened(tokenizer)
    return list(tokenizer("\n\n".join(m["content"] for m in prompt)).input_ids)


def render_completion(tokenizer: Any, prompt: Prompt, completion: str) -> list[int]:
    """Completion token ids: ``text + eos`` after a string prompt, the template's assistant turn after a conversation.

    An empty (or all-whitespace) completion has no content token: ``[]`` (the pair is dropped, not trained on).
    """
    if not completion.strip():
        return []
    if isinstance(prompt, str) or not has_chat_template(tokenizer):
        return [*tokenizer(completion, add_special_tokens=False).input_ids, tokenizer.eos_token_id]
    head = tokenizer.apply_chat_template(prompt, add_generation_prompt=True, tokenize=False)
    full = tokenizer.apply_chat_template(
        [*prompt, {"role": "assistant", "content": completion}], add_generation_prompt=False, tokenize=False
    )
    if not full.startswith(head):
        raise DataFormatError(
            "the chat template renders a conversation with its answer differently from the same conversation "
            "before the answer (it rewrites earlier turns), so the completion tokens cannot be separated; use "
            "--chat-template PATH.jinja with a template that only appends the assistant turn, or --chat-template none"
        )
    return list(tokenizer(full[len(head) :], add_special_tokens=False).input_ids)


def _template_line(error: BaseException) -> int | None:
    """The template line a Jinja error points at: a syntax error's own, else the innermost ``<template>`` frame's."""
    line = getattr(error, "lineno", None)
    if isinstance(line, int):
        return line
    tb, found = error.__traceback__, None
    while tb is not None:
        if tb.tb_frame.f_code.co_filename == "<template>":
            found = tb.tb_lineno
        tb = tb.tb_next
    return found


def check_chat_template(tokenizer: Any, row: dict[str, Any], source: str) -> None:
    """Render the chat template once on ``row`` (a normalized example) before any model loads: a broken template is
    one :class:`DataFormatError` naming its source (``source``), the template line and Jinja's message.  A row with
    a plain-string prompt renders no template, so it checks nothing."""
    prompt = row.get("prompt")
    if isinstance(prompt, str) or not prompt or not has_chat_template(tokenizer):
        return
    completions = row.get("completions") or [row.get("chosen") or row.get("completion") or "ok"]
    try:
        render_completion(tokenizer, prompt, str(completions[0]) or "ok")
    except DataFormatError:
        raise
    except Exception as e:  # jinja2's TemplateSyntaxError, UndefinedError, raise_exception(...), ...
        line = _template_line(e)
        where = f", line {line}" if line is not None else ""
        message = " ".join(str(e).split()) or type(e).__name__
        raise DataFormatError(
            f"chat template ({source}){where}: {type(e).__name__}: {message}; fix the template, or give another "
            "with --chat-template PATH.jinja (or --chat-template none)"
        ) from None
