"""Truncation keeps the prompt's end and the completion's start; dropped pairs are counted; collation masks."""

from __future__ import annotations

import datasets
import pytest
import torch

from prefzoo.data import DataFormatError, PreferenceCollator, ensure_pad_token, tokenize_pairs


def _ds(rows):
    return datasets.Dataset.from_list([{"id": str(i), **r} for i, r in enumerate(rows)])


def test_truncation_keeps_prompt_end_and_completion_start(tokenizer):
    ds = _ds([{"prompt": "abcdefghij", "chosen": "klmnop", "rejected": "qr"}])
    enc, stats = tokenize_pairs(ds, tokenizer, max_prompt_length=4, max_completion_length=3)
    row = enc[0]
    assert tokenizer.decode(row["prompt_ids"]).replace(" ", "") == "ghij"  # the END of the prompt
    assert tokenizer.decode(row["chosen_ids"]).replace(" ", "") == "klm"  # the START of the completion
    assert row["rejected_ids"][-1] == tokenizer.eos_token_id and len(row["rejected_ids"]) == 3
    assert (stats.prompt_truncated, stats.completion_truncated, stats.dropped) == (1, 1, 0)


def test_empty_completions_are_dropped_and_counted(tokenizer):
    ds = _ds(
        [
            {"prompt": "a", "chosen": "b", "rejected": "c"},
            {"prompt": "a", "chosen": "", "rejected": "c"},
            {"prompt": "a", "chosen": "b", "rejected": "  "},
        ]
    )
    enc, stats = tokenize_pairs(ds, tokenizer)
    assert (stats.total, stats.kept, stats.dropped) == (3, 1, 2)
    assert enc["id"] == ["0"]


def test_all_pairs_dropped_is_an_error(tokenizer):
    with pytest.raises(DataFormatError, match="all 1 pairs were dropped"):
        tokenize_pairs(_ds([{"prompt": "a", "chosen": "", "rejected": ""}]), tokenizer)


def test_no_pad_token_uses_eos_and_says_so():
    from tests.support.tiny import build_tokenizer

    tok = build_tokenizer(pad=False)
    note = ensure_pad_token(tok)
    assert note is not None and "eos" in note
    assert tok.pad_token_id == tok.eos_token_id
    assert ensure_pad_token(tok) is None


def test_collator_layout(tokenizer):
    ex = [
        {"id": "a", "prompt_ids": [5, 6], "chosen_ids": [7, 2], "rejected_ids": [8, 9, 2]},
        {"id": "b", "prompt_ids": [5], "chosen_ids": [2], "rejected_ids": [9, 2]},
    ]
    b = PreferenceCollator(pad_token_id=0)(ex)
    assert b["input_ids"].shape == (4, 5)
    assert b["input_ids"][0].tolist() == [5, 6, 7, 2, 0]  # chosen rows first
    assert b["input_ids"][2].tolist() == [5, 6, 8, 9, 2]  # then rejected rows
    assert b["completion_mask"][1].tolist() == [False, True, False, False, False]
    assert b["attention_mask"][3].tolist() == [1, 1, 1, 0, 0]
    assert torch.equal(b["chosen_lengths"], torch.tensor([2, 1]))
    assert torch.equal(b["rejected_lengths"], torch.tensor([3, 2]))
    assert b["ids"] == ["a", "b"]
