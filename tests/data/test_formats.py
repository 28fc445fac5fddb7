"""Every recognised format loads from local files into the same normalized, tokenized pairs."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from prefzoo.data import DataFormatError, load_preference_dataset, tokenize_pairs

PAIRS = [("add 1+2=", "3", "4"), ("add 10+5=", "15", "14"), ("add 7+7=", "14", "41")]


def _rows(fmt: str) -> list[dict]:
    out = []
    for i, (p, w, l) in enumerate(PAIRS):
        if fmt == "plain":
            out.append({"id": str(i), "prompt": p, "chosen": w, "rejected": l})
        elif fmt == "conversational":  # TRL implicit prompt: shared prefix
            user = {"role": "user", "content": p}
            out.append(
                {
                    "id": str(i),
                    "chosen": [user, {"role": "assistant", "content": w}],
                    "rejected": [user, {"role": "assistant", "content": l}],
                }
            )
        elif fmt == "conversational-explicit":
            out.append(
                {
                    "id": str(i),
                    "prompt": [{"role": "user", "content": p}],
                    "chosen": [{"role": "assistant", "content": w}],
                    "rejected": [{"role": "assistant", "content": l}],
                }
            )
        elif fmt == "ultrafeedback":
            user = {"role": "user", "content": p}
            out.append(
                {
                    "prompt_id": str(i),
                    "prompt": p,
                    "chosen": [user, {"role": "assistant", "content": w}],
                    "rejected": [user, {"role": "assistant", "content": l}],
                    "score_chosen": 8.0,
                }
            )
        elif fmt == "orca":
            out.append({"system": "", "question": p, "chosen": w, "rejected": l})
    return out


def _write(tmp: Path, fmt: str, suffix: str) -> Path:
    import datasets

    rows = _rows(fmt)
    path = tmp / f"{fmt}{suffix}"
    if suffix == ".jsonl":
        path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    elif suffix == ".json":
        path.write_text(json.dumps(rows))
    elif suffix == ".parquet":
        datasets.Dataset.from_list(rows).to_parquet(str(path))
    elif suffix == "/":
        datasets.Dataset.from_list(rows).save_to_disk(str(path))
    return path


def _token_pairs(ds, tok) -> list[tuple]:
    enc, _ = tokenize_pairs(ds, tok)
    return [(r["prompt_ids"], r["chosen_ids"], r["rejected_ids"]) for r in enc]


@pytest.mark.parametrize(
    ("fmt", "suffix", "expected"),
    [
        ("plain", ".jsonl", "plain"),
        ("plain", ".parquet", "plain"),
        ("plain", "/", "plain"),
        ("conversational", ".jsonl", "conversational"),
        ("conversational-explicit", ".json", "conversational"),
        ("ultrafeedback", ".jsonl", "ultrafeedback"),
        ("ultrafeedback", ".parquet", "ultrafeedback"),
        ("orca", ".jsonl", "orca"),
    ],
)
def test_each_format_gives_the_same_pairs(tmp_path, tokenizer, fmt, suffix, expected):
    from prefzoo.data.formats import detect_format

    path = _write(tmp_path, fmt, suffix)
    ds = load_preference_dataset(str(path))
    assert ds.column_names == ["id", "prompt", "chosen", "rejected"]
    assert [r["chosen"] for r in ds] == [w for _, w, _ in PAIRS]
    assert [r["rejected"] for r in ds] == [l for _, _, l in PAIRS]
    assert detect_format(list(_rows(fmt)[0]), _rows(fmt)[0]) == expected
    plain = load_preference_dataset(str(_write(tmp_path, "plain", ".jsonl")))
    assert _token_pairs(ds, tokenizer) == _token_pairs(plain, tokenizer)


def test_ultrafeedback_prompt_is_conversation_before_final_answer(tmp_path):
    turn = [
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": "hello"},
        {"role": "user", "content": "add 1+1="},
    ]
    row = {
        "prompt": "add 1+1=",
        "chosen": [*turn, {"role": "assistant", "content": "2"}],
        "rejected": [*turn, {"role": "assistant", "content": "3"}],
    }
    path = tmp_path / "uf.jsonl"
    path.write_text(json.dumps(row) + "\n")
    ds = load_preference_dataset(str(path))
    assert ds[0]["prompt"] == turn
    assert (ds[0]["chosen"], ds[0]["rejected"]) == ("2", "3")


def test_orca_system_becomes_a_system_message(tmp_path):
    path = tmp_path / "orca.jsonl"
    path.write_text(json.dumps({"system": "be brief", "question": "q?", "chosen": "a", "rejected": "b"}) + "\n")
    ds = load_preference_dataset(str(path))
    assert ds[0]["prompt"] == [{"role": "system", "content": "be brief"}, {"role": "user", "content": "q?"}]


def test_misnamed_columns_are_named_with_the_formats(tmp_path):
    path = tmp_path / "bad.jsonl"
    path.write_text(json.dumps({"Prompt": "x", "good": "a", "rejected": "b"}) + "\n")
    with pytest.raises(DataFormatError) as e:
        load_preference_dataset(str(path))
    msg = str(e.value)
    assert "missing ['chosen', 'prompt']" in msg and "column 'Prompt': did you mean 'prompt'?" in msg
    assert "ultrafeedback" in msg and "orca" in msg


@pytest.mark.parametrize(("typo", "want"), [("rejeted", "rejected"), ("choosen", "chosen"), ("promt", "prompt")])
def test_a_near_miss_column_gets_a_did_you_mean(tmp_path, typo, want):
    row = {"prompt": "x", "chosen": "a", "rejected": "b"}
    row[typo] = row.pop(want)
    path = tmp_path / "typo.jsonl"
    path.write_text(json.dumps(row) + "\n")
    with pytest.raises(DataFormatError) as e:
        load_preference_dataset(str(path))
    assert f"column {typo!r}: did you mean {want!r}? rename it" in str(e.value)
    assert "\n" not in str(e.value)


def test_empty_dataset_is_an_error(tmp_path):
    import datasets

    from prefzoo.data import normalize

    with pytest.raises(DataFormatError, match="empty"):
        normalize(datasets.Dataset.from_dict({"prompt": [], "chosen": [], "rejected": []}))


def test_missing_split_and_missing_file(tmp_path):
    path = _write(tmp_path, "plain", "/")
    with pytest.raises(DataFormatError, match="no such file"):
        load_preference_dataset(str(tmp_path / "nope.jsonl"))
    ok = load_preference_dataset(str(path))  # save_to_disk of a single Dataset: the split name is not used
    assert len(ok) == 3


def test_mismatched_conversation_prefix_is_an_error(tmp_path):
    row = {
        "chosen": [{"role": "user", "content": "a"}, {"role": "assistant", "content": "x"}],
        "rejected": [{"role": "user", "content": "b"}, {"role": "assistant", "content": "y"}],
    }
    path = tmp_path / "c.jsonl"
    path.write_text(json.dumps(row) + "\n")
    with pytest.raises(DataFormatError, match="shared prefix"):
        load_preference_dataset(str(path))
