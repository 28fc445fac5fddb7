"""Pad tokenized pairs into one batch: 2B rows (chosen, then rejected) or, sharing the prompt, B [x, y_w, y_l] rows."""

from __future__ import annotations

from typing import Any

import torch

from prefzoo.types import SEGMENT_CHOSEN, SEGMENT_PAD, SEGMENT_PROMPT, SEGMENT_REJECTED

_SEGMENTS = (SEGMENT_PAD, SEGMENT_PROMPT, SEGMENT_CHOSEN, SEGMENT_REJECTED)

__all__ = ["PreferenceCollator"]


class PreferenceCollator:
    """``collate(examples)`` -> dict of tensors for one concatenated chosen+rejected forward.

    Output (right padding, N = 2B rows, rows [0, B) chosen, [B, 2B) rejected):
    ``input_ids`` (N, T), ``attention_mask`` (N, T), ``completion_mask`` (N, T) True on completion tokens,
    ``chosen_lengths``/``rejected_lengths`` (B,), and ``ids`` (list of B example ids).

    With ``share_prompt=True`` there is one row per pair, [x, y_w, y_l] (N = B rows), and ``completion_mask`` holds
    int64 segment ids instead of booleans: 0 padding, 1 prompt, 2 chosen, 3 rejected.  ``PolicyLogps`` recognises
    this layout and builds the attention mask and position ids that keep y_l from seeing y_w.
    """

    # the segment ids of prefzoo.types, as class attributes too
    SEGMENT_PAD, SEGMENT_PROMPT, SEGMENT_CHOSEN, SEGMENT_REJECTED = _SEGMENTS

    def __init__(self, pad_token_id: int, pad_to_multiple_of: int | None = None, share_prompt: bool = False) -> None:
        self.pad_token_id = pad_token_id
        self.pad_to_multiple_of = pad_to_multiple_of
        self.share_prompt = share_prompt

    def _shared(self, examples: list[dict[str, Any]]) -> dict[str, Any]:
        rows = [(list(ex["prompt_ids"]), list(ex["chosen_ids"]), list(ex["rejected_ids"])) for ex in examples]
        t = round_up(max(len(p) + len(w) + len(l_) for p, w, l_ in rows), self.pad_to_multiple_of)
        b = len(rows)
        input_ids = torch.full((b, t), self.pad_token_id, dtype=torch.long)  # (B, T)
        segments = torch.zeros((b, t), dtype=torch.long)  # (B, T) segment ids
        for i, (p, w, l_) in enumerate(rows):
            input_ids[i, : len(p) + len(w) + len(l_)] = torch.tensor(p + w + l_, dtype=torch.long)
            segments[i, : len(p)] = self.SEGMENT_PROMPT
            segments[i, len(p) : len(p) + len(w)] = self.SEGMENT_CHOSEN
            segments[i, len(p) + len(w) : len(p) + len(w) + len(l_)] = self.SEGMENT_REJECTED
        return {
            "input_ids": input_ids,
            "attention_mask": (segments != self.SEGMENT_PAD).long(),  # (B, T) real tokens
            "completion_mask": segments,
            "chosen_lengths": (segments == self.SEGMENT_CHOSEN).sum(dim=1),  # (B,)
            "rejected_lengths": (segments == self.SEGMENT_REJECTED).sum(dim=1),  # (B,)
            "ids": [str(ex["id"]) for ex in examples],
            **pair_scores(examples),
        }

    def __call__(self, examples: list[dict[str, Any]]) -> dict[str, Any]:
        if self.share_prompt:
            return self._shared(examples)
        rows = [(ex["prompt_ids"], ex["chosen_ids"]) for ex in examples]
        rows += [(ex["prompt_ids"], ex["rejected_ids"]) for ex in examples]
        padded = pad_rows(rows, self.pad_token_id, self.pad_to_multiple_of)  # (2B, T) each: chosen rows, then rejected
        lengths = padded["completion_mask"].sum(dim=1)  # (2B,)
        b = len(examples)
        return {
            **padded,
            "chosen_lengths": lengths[:b],
            "rejected_lengths": lengths[b:],
            "ids": [str(ex["id"]) for ex in examples],
            **pair_scores(examples),
        }


def pad_rows(
    rows: list[tuple[list[int], list[int]]], pad_token_id: int, multiple: int | None = None
) -> dict[str, torch.Tensor]:
    """Right-padded rows ``[x, y]``: input_ids (N, T), attention_mask (N, T), completion_mask (N, T) bool."""
    t = round_up(max(len(p) + len(c) for p, c in rows), multiple)
    n = len(rows)
    input_ids = torch.full((n, t), pad_token_id, dtype=torch.long)  # (N, T)
    attention_mask = torch.zeros((n, t), dtype=torch.long)  # (N, T)
    completion_mask = torch.zeros((n, t), dtype=torch.bool)  # (N, T)
    for i, (p, c) in enumerate(rows):
        seq = list(p) + list(c)
        input_ids[i, : len(seq)] = torch.tensor(seq, dtype=torch.long)
        attention_mask[i, : len(seq)] = 1
        completion_mask[i, len(p) : len(seq)] = True
    return {"input_ids": input_ids, "attention_mask": attention_mask, "completion_mask": completion_mask}


def round_up(t: int, multiple: int | None) -> int:
    """``t`` rounded up to a multiple of ``multiple`` (unchanged when it is None or 0)."""
    return -(-t // multiple) * multiple if multiple else t


def pair_scores(examples: list[dict[str, Any]]) -> dict[str, torch.Tensor]:
    """``chosen_scores``/``rejected_scores`` (B,) float32 from the data's score_chosen/score_rejected, if any."""
    if not examples or "score_chosen" not in examples[0]:
        return {}
    return {
        "chosen_scores": torch.tensor([float(ex["score_chosen"]) for ex in examples], dtype=torch.float32),
        "rejected_scores": torch.tensor([float(ex["score_rejected"]) for ex in examples], dtype=torch.float32),
    }
