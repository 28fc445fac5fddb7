"""Pad tokenized pairs into one (2B, T) batch: B chosen then B rejected rows, with attention and completion masks."""

from __future__ import annotations

from typing import Any

import torch

__all__ = ["PreferenceCollator"]


class PreferenceCollator:
    """``collate(examples)`` -> dict of tensors for one concatenated chosen+rejected forward.

    Output (right padding, N = 2B rows, rows [0, B) chosen, [B, 2B) rejected):
    ``input_ids`` (N, T), ``attention_mask`` (N, T), ``completion_mask`` (N, T) True on completion tokens,
    ``chosen_lengths``/``rejected_lengths`` (B,), and ``ids`` (list of B example ids).
    """

    def __init__(self, pad_token_id: int, pad_to_multiple_of: int | None = None) -> None:
        self.pad_token_id = pad_token_id
        self.pad_to_multiple_of = pad_to_multiple_of

    def __call__(self, examples: list[dict[str, Any]]) -> dict[str, Any]:
        rows = [(ex["prompt_ids"], ex["chosen_ids"]) for ex in examples]
        rows += [(ex["prompt_ids"], ex["rejected_ids"]) for ex in examples]
        t = max(len(p) + len(c) for p, c in rows)
        if self.pad_to_multiple_of:
            t = -(-t // self.pad_to_multiple_of) * self.pad_to_multiple_of
        n = len(rows)
        input_ids = torch.full((n, t), self.pad_token_id, dtype=torch.long)  # (2B, T)
        attention_mask = torch.zeros((n, t), dtype=torch.long)  # (2B, T)
        completion_mask = torch.zeros((n, t), dtype=torch.bool)  # (2B, T)
        for i, (p, c) in enumerate(rows):
            seq = list(p) + list(c)
            input_ids[i, : len(seq)] = torch.tensor(seq, dtype=torch.long)
            attention_mask[i, : len(seq)] = 1
            completion_mask[i, len(p) : len(seq)] = True
        lengths = completion_mask.sum(dim=1)  # (2B,)
        b = len(examples)
        return {
            "input_ids": input_ids,
            "attention_mask": attention_mask,
            "completion_mask": completion_mask,
            "chosen_lengths": lengths[:b],
            "rejected_lengths": lengths[b:],
            "ids": [str(ex["id"]) for ex in examples],
        }
