"""Tokenization and collation of lists (G prompts × up to K completions) and unpaired examples.

Lists and unpaired examples are tokenized like pairs (:mod:`prefzoo.data.tokenize`: the prompt keeps its end, each
completion its start, the same chat rendering) and counted in the same :class:`TokenizeStats`.  Collation lays
every completion out as its own right-padded row ``[x, y]``, so one :func:`prefzoo.sequence_logps` forward scores
all G·K completions (or all N examples); the batch says where each row belongs.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch

from prefzoo.data.chat import render_completion, render_prompt
from prefzoo.data.collate import pad_rows
from prefzoo.data.tokenize import FLAGS, TokenizeStats, encode_dataset, encoded_flags, text_chars
from prefzoo.data.validate import MAX_TEXT_CHARS, DataFormatError

if TYPE_CHECKING:
    import datasets

__all__ = [
    "GroupCollator",
    "UnpairedCollator",
    "completion_encoder",
    "pad_rows",
    "tokenize_lists",
    "tokenize_unpaired",
]

log = logging.getLogger(__name__)


def completion_encoder(
    tokenizer: Any, limits: tuple[int, int], requested: tuple[int, int] | None, answers: str
) -> Callable[[dict[str, Any]], dict[str, Any]]:
    """The function that tokenizes one normalized list (``answers="completions"``: completion_ids holds K lists) or
    unpaired example (``"completion"``: one list): the row's other columns as they are, prompt_ids, completion_ids
    and the :data:`prefzoo.data.tokenize.FLAGS`."""
    max_p, max_c = limits
    req_p, req_c = requested or limits
    if tokenizer.eos_token_id is None:
        raise DataFormatError("the tokenizer has no eos token; completions end with eos. Set tokenizer.eos_token")
    many = answers == "completions"

    def encode(row: dict[str, Any]) -> dict[str, Any]:
        texts = row[answers] if many else [row[answers]]
        base = {k: row[k] for k in row if k not in ("prompt", answers)}
        if max([text_chars(row["prompt"]), *(len(t) for t in texts)]) > MAX_TEXT_CHARS:
            return {**base, "prompt_ids": [], "completion_ids": [[]] * len(texts) if many else [],
                    **dict.fromkeys(FLAGS, False), "oversized": True}  # fmt: skip
        prompt = render_prompt(tokenizer, row["prompt"])
        comps = [render_completion(tokenizer, row["prompt"], t) for t in texts]
        longest = max(len(c) for c in comps)
        cut_c = [c[:max_c] for c in comps]  # completions keep their START
        identical = many and all(c == cut_c[0] for c in cut_c) and len(cut_c[0]) > 0
        keep = len(prompt) > 0 and all(len(c) > 0 for c in comps) and not identical
        return {
            **base,
            "prompt_ids": prompt[-max_p:],  # the prompt keeps its END (the question nearest the answer)
            "completion_ids": cut_c if many else cut_c[0],
            **encoded_flags(len(prompt), longest, limits, (req_p, req_c), keep, identical),
        }

    return encode


def _tokenize(
    ds: datasets.Dataset,
    tokenizer: Any,
    limits: tuple[int, int],
    requested: tuple[int, int] | None,
    num_proc: int | None,
    answers: str,
    what: str,
    progress: bool,
) -> tuple[datasets.Dataset, TokenizeStats]:
    """Tokenize the completions in column ``answers`` (a list of strings, or one string) after each prompt."""
    encode = completion_encoder(tokenizer, limits, requested, answers)
    if len(ds) == 0:
        raise DataFormatError(f"the dataset (or the selected split) is empty: it holds no {what}")
    return encode_dataset(ds, encode, num_proc, what, "with identical completions", "the completions", progress)


def tokenize_lists(
    ds: datasets.Dataset,
    tokenizer: Any,
    max_prompt_length: int = 1800,
    max_completion_length: int = 512,
    num_proc: int | None = None,
    *,
    requested: tuple[int, int] | None = None,
    progress: bool = True,
) -> tuple[datasets.Dataset, TokenizeStats]:
    """Columns id, prompt_ids, completion_ids (K lists), scores (or None); a list is dropped (counted) when a
    completion or the prompt has no token left, or all its completions are identical after truncation."""
    return _tokenize(ds, tokenizer, (max_prompt_length, max_completion_length), requested, num_proc,
                     "completions", "lists", progress)  # fmt: skip


def tokenize_unpaired(
    ds: datasets.Dataset,
    tokenizer: Any,
    max_prompt_length: int = 1800,
    max_completion_length: int = 512,
    num_proc: int | None = None,
    *,
    requested: tuple[int, int] | None = None,
    progress: bool = True,
) -> tuple[datasets.Dataset, TokenizeStats]:
    """Columns id, prompt_ids, completion_ids, label; examples with no completion token left are dropped, counted."""
    return _tokenize(ds, tokenizer, (max_prompt_length, max_completion_length), requested, num_proc,
                     "completion", "examples", progress)  # fmt: skip


class GroupCollator:
    """``collate(lists)`` -> one row per completion, group by group, and where each row sits in the (G, K) grid.

    Output: ``input_ids``/``attention_mask``/``completion_mask`` (N, T) with N = Σ_g K_g rows (group 0's completions
    first, best first); ``group_mask`` (G, K) bool, True on the slots that hold a completion (row-major order of
    the True slots is the row order), K = the largest group; ``scores`` (G, K) float32 (0 on empty slots) or None
    when any list in the batch has no scores (then column order is the ranking); ``ids`` (G example ids).
    """

    def __init__(self, pad_token_id: int, pad_to_multiple_of: int | None = None) -> None:
        self.pad_token_id = pad_token_id
        self.pad_to_multiple_of = pad_to_multiple_of

    def __call__(self, examples: list[dict[str, Any]]) -> dict[str, Any]:
        rows = [(ex["prompt_ids"], c) for ex in examples for c in ex["completion_ids"]]
        out: dict[str, Any] = pad_rows(rows, self.pad_token_id, self.pad_to_multiple_of)
        sizes = [len(ex["completion_ids"]) for ex in examples]
        g, k = len(examples), max(sizes)
        mask = torch.arange(k).unsqueeze(0) < torch.tensor(sizes).unsqueeze(1)  # (G, K)
        out["group_mask"] = mask
        if all(ex.get("scores") is not None for ex in examples):
            scores = torch.zeros(g, k, dtype=torch.float32)  # (G, K)
            scores[mask] = torch.tensor([s for ex in examples for s in ex["scores"]], dtype=torch.float32)
            out["scores"] = scores
        else:
            out["scores"] = None
        out["ids"] = [str(ex["id"]) for ex in examples]
        return out


class UnpairedCollator:
    """``collate(examples)`` -> N rows ``[x_i, y_i]``, their labels, and (``kl=True``) the N mismatched KL rows.

    The KL rows are TRL 1.16 KTOTrainer's: the completions rotated by one within the batch,
    ``(x_1, y_N), (x_2, y_1), ..., (x_N, y_{N-1})``, so the mismatched outputs are the batch's own outputs paired
    with other prompts.  Output: ``input_ids``/``attention_mask``/``completion_mask`` (N, T); ``labels`` (N,) bool
    (True = desirable); ``kl_input_ids``/``kl_attention_mask``/``kl_completion_mask`` (N, T') with ``kl``;
    ``ids`` (N example ids).
    """

    def __init__(self, pad_token_id: int, kl: bool = False, pad_to_multiple_of: int | None = None) -> None:
        self.pad_token_id = pad_token_id
        self.kl = kl
        self.pad_to_multiple_of = pad_to_multiple_of

    def __call__(self, examples: list[dict[str, Any]]) -> dict[str, Any]:
        prompts = [list(ex["prompt_ids"]) for ex in examples]
        comps = [list(ex["completion_ids"]) for ex in examples]
        out: dict[str, Any] = pad_rows(list(zip(prompts, comps, strict=True)), self.pad_token_id,
                                       self.pad_to_multiple_of)  # fmt: skip
        out["labels"] = torch.tensor([bool(ex["label"]) for ex in examples], dtype=torch.bool)  # (N,)
        if self.kl:
            shifted = comps[-1:] + comps[:-1]  # TRL: [y_N, y_1, ..., y_{N-1}]
            kl = pad_rows(list(zip(prompts, shifted, strict=True)), self.pad_token_id, self.pad_to_multiple_of)
            out.update({f"kl_{k}": v for k, v in kl.items()})
        out["ids"] = [str(ex["id"]) for ex in examples]
        return out
