"""Lists and unpaired data: formats, bad-row errors, conversions, tokenization and collation (TRL's KL rotation)."""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

import pytest
import torch

from prefzoo.data import DataFormatError, load_preference_dataset
from prefzoo.data.groups import GroupCollator, UnpairedCollator, tokenize_lists, tokenize_unpaired
from prefzoo.data.shapes import LISTS, PAIRS, UNPAIRED, data_shape, list_pairs, lists_to_pairs, unpair
from tests.support.shaped_data import make_lists, make_ultrafeedback_raw, make_unpaired


def _jsonl(tmp: Path, rows: list[dict[str, Any]], name: str = "d.jsonl") -> Path:
    path = tmp / name
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_ultrafeedback_raw_is_detected_and_sorted_best_first(tmp_path):
    ds = load_preference_dataset(str(_jsonl(tmp_path, make_ultrafeedback_raw(3))))
    assert data_shape(ds) == LISTS and ds.info.description.endswith("ultrafeedback-raw")
    for row in ds:
        assert row["scores"] == sorted(row["scores"], reverse=True)
        assert row["prompt"][0]["role"] == "user" and row["prompt"][0]["content"].startswith("add ")
        assert len(row["completions"]) == 4


def test_generic_list_keeps_ties_in_order_and_no_scores_means_column_order(tmp_path):
    rows = [{"prompt": "p", "completions": ["a", "b", "c", "d"], "scores": [1, 3, 1, 2]},
            {"prompt": "q", "completions": ["x", "y"], "scores": [0.5, 0.5]}]  # fmt: skip
    ds = load_preference_dataset(str(_jsonl(tmp_path, rows)))
    assert ds[0]["completions"] == ["b", "d", "a", "c"]  # stable: a before c among the tied 1s
    assert ds[0]["scores"] == [3, 2, 1, 1]
    unscored = load_preference_dataset(str(_jsonl(tmp_path, make_lists(2, scores=False), "u.jsonl")))
    assert unscored[0]["scores"] is None and unscored[0]["completions"] == make_lists(2, scores=False)[0]["completions"]


@pytest.mark.parametrize("style", ["plain", "conversational", "implicit"])
def test_unpaired_formats(tmp_path, style):
    rows = []
    for r in make_unpaired(4):
        if style == "conversational":
            r = {"prompt": [{"role": "user", "content": r["prompt"]}],
                 "completion": [{"role": "assistant", "content": r["completion"]}], "label": r["label"]}  # fmt: skip
        elif style == "implicit":
            r = {"completion": [{"role": "user", "content": r["prompt"]},
                                {"role": "assistant", "content": r["completion"]}], "label": r["label"]}  # fmt: skip
        rows.append(r)
    ds = load_preference_dataset(str(_jsonl(tmp_path, rows)))
    assert data_shape(ds) == UNPAIRED
    assert ds["label"] == [True, False, True, False]
    assert all(isinstance(c, str) for c in ds["completion"])
    if style != "plain":
        assert ds[0]["prompt"] == [{"role": "user", "content": make_unpaired(4)[0]["prompt"]}]


BAD_ROWS = [
    # (rows, words the one-line error must hold)
    ([{"prompt": "p", "completions": ["a", "b"]}, {"prompt": "q", "completions": ["only"]}],
     ["row 1", "'completions'", "K >= 2"]),
    ([{"prompt": "p", "completions": ["a", "b"], "scores": [1, 2]},
      {"prompt": "q", "completions": ["a", "b", "c"], "scores": [1, 2]}],
     ["row 1", "'scores'", "2 values for 3 completions", "one score per completion"]),
    ([{"prompt": "p", "completions": ["a", "b"], "scores": [1.0, float("nan")]}],
     ["row 0", "'scores[1]'", "finite"]),
    ([{"id": "x", "prompt": "p", "completion": "a", "label": "yes"}],
     ["row 0 (id 'x')", "'label'", "boolean", "true (desirable)"]),
    ([{"instruction": "i", "completions": [{"response": "a", "overall_score": 1}, {"response": "b"}]}],
     ["row 0", "completions[1].overall_score", "numbers"]),
]  # fmt: skip


@pytest.mark.parametrize(("rows", "words"), BAD_ROWS)
def test_bad_rows_get_one_line_naming_row_and_field(rows, words):
    import datasets

    from prefzoo.data.formats import normalize

    with pytest.raises(DataFormatError) as e:
        normalize(datasets.Dataset.from_list(rows))
    msg = str(e.value)
    assert "\n" not in msg
    for w in words:
        assert w in msg, (w, msg)


def test_nan_score_in_a_file_is_named(tmp_path):
    path = tmp_path / "nan.jsonl"
    path.write_text('{"prompt": "p", "completions": ["a", "b"], "scores": [1, 2]}\n'
                    '{"prompt": "q", "completions": ["a", "b"], "scores": [1, NaN]}\n')  # fmt: skip
    with pytest.raises(DataFormatError, match=r"row 1: field 'scores\[1\]' is nan"):
        load_preference_dataset(str(path))


def test_integer_labels_are_refused_not_cast(tmp_path):
    rows = [{"prompt": "p", "completion": "a", "label": 1}, {"prompt": "q", "completion": "b", "label": 0}]
    with pytest.raises(DataFormatError, match=r"row 0: field 'label' is 1"):
        load_preference_dataset(str(_jsonl(tmp_path, rows)))


def test_list_pairs_agree_with_the_tensor_reduction():
    """The data-level reduction (--pairs-from-lists) takes the same pairs as prefzoo.pairs_from_lists."""
    from prefzoo import GroupBatch
    from prefzoo.losses.shapes import pair_indices

    rng = random.Random(0)
    for _ in range(200):
        k = rng.randint(2, 6)
        scores = sorted((float(rng.randint(0, 3)) for _ in range(k)), reverse=True)  # best first, ties likely
        batch = GroupBatch(policy_logps=torch.zeros(1, k), scores=torch.tensor([scores]))
        for how in ("best-worst", "all-pairs", "best-vs-rest"):
            _, i, j = pair_indices(batch, how)
            assert list_pairs(scores, k, how) == list(zip(i.tolist(), j.tolist(), strict=True)), (scores, how)


def test_lists_to_pairs_counts_fully_tied_lists():
    import datasets

    rows = [{"id": "a", "prompt": "p", "completions": ["1", "2", "3"], "scores": [3.0, 2.0, 1.0]},
            {"id": "b", "prompt": "q", "completions": ["1", "2"], "scores": [1.0, 1.0]},
            {"id": "c", "prompt": "r", "completions": ["1", "2", "3"], "scores": None}]  # fmt: skip
    ds = datasets.Dataset.from_list(rows)
    pairs, tied = lists_to_pairs(ds, "all-pairs")
    assert tied == 1 and data_shape(pairs) == PAIRS
    assert pairs["id"] == ["a:0>1", "a:0>2", "a:1>2", "c:0>1", "c:0>2", "c:1>2"]
    assert pairs[2]["chosen"] == "2" and pairs[2]["rejected"] == "3"
    bw, _ = lists_to_pairs(ds, "best-worst")
    assert bw["id"] == ["a:0>2", "c:0>2"]


def test_unpair_matches_trl():
    import datasets

    trl_data = pytest.importorskip("trl.data_utils")
    pairs = datasets.Dataset.from_list([{"id": str(i), "prompt": f"p{i}", "chosen": f"w{i}", "rejected": f"l{i}"}
                                        for i in range(5)])  # fmt: skip
    ours = unpair(pairs)
    theirs = trl_data.unpair_preference_dataset(pairs.remove_columns("id"))
    assert ours["prompt"] == theirs["prompt"]
    assert ours["completion"] == theirs["completion"]
    assert ours["label"] == theirs["label"]


def test_group_collation_places_rows_in_the_grid(tokenizer):
    import datasets

    rows = [{"id": "a", "prompt": "add 1+2=", "completions": ["3", "4", "55"], "scores": [2.0, 1.0, 0.0]},
            {"id": "b", "prompt": "add 2+2=", "completions": ["4", "5"], "scores": [1.0, 0.0]}]  # fmt: skip
    tok, stats = tokenize_lists(datasets.Dataset.from_list(rows), tokenizer, 16, 8)
    assert stats.kept == 2
    batch = GroupCollator(tokenizer.pad_token_id)([tok[0], tok[1]])
    assert batch["group_mask"].tolist() == [[True, True, True], [True, True, False]]
    assert batch["input_ids"].shape[0] == 5  # only real completions are scored
    assert batch["scores"].tolist() == [[2.0, 1.0, 0.0], [1.0, 0.0, 0.0]]
    third = batch["input_ids"][2][batch["completion_mask"][2]].tolist()
    assert third == tok[0]["completion_ids"][2]  # row 2 = group 0, slot 2
    unscored = GroupCollator(0)([{**tok[0], "scores": None}, tok[1]])
    assert unscored["scores"] is None  # one list without scores: the batch ranks by column order


def test_kl_rows_rotate_completions_like_trl(tokenizer):
    """TRL 1.16 KTOTrainer: KL_completion_ids = [c_N, c_1, ..., c_{N-1}] within each batch."""
    import datasets

    rows = [{**r, "id": str(i)} for i, r in enumerate(make_unpaired(4))]
    tok, _ = tokenize_unpaired(datasets.Dataset.from_list(rows), tokenizer, 16, 8)
    examples = [tok[i] for i in range(4)]
    batch = UnpairedCollator(tokenizer.pad_token_id, kl=True)(examples)
    comps = [e["completion_ids"] for e in examples]
    trl_kl = [comps[-1]] + comps[:-1]  # noqa: RUF005 (TRL's spelling)  trl/trainer/kto_trainer.py add_kl_completion_ids
    for i, e in enumerate(examples):
        row = batch["kl_input_ids"][i][batch["kl_attention_mask"][i].bool()].tolist()
        assert row == e["prompt_ids"] + trl_kl[i]
        assert batch["kl_input_ids"][i][batch["kl_completion_mask"][i]].tolist() == trl_kl[i]
    assert batch["labels"].tolist() == [True, False, True, False]
    assert "kl_input_ids" not in UnpairedCollator(0)(examples)


def test_mixing_sources_of_different_shapes_is_one_line(tmp_path):
    from prefzoo.data.mixing import load_mixture
    from tests.support.tiny import make_pairs

    a = _jsonl(tmp_path, make_pairs(4), "a.jsonl")
    b = _jsonl(tmp_path, make_lists(4), "b.jsonl")
    with pytest.raises(DataFormatError, match="different data shapes"):
        load_mixture([str(a), str(b)], "train", None, 0)
