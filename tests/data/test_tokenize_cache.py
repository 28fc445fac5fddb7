"""A second tokenisation of the same data (a ``datasets`` cache hit) reads its counts from a small stored summary, not
from the tokenised columns: the same counts as the first pass, at a cost that does not grow with the data; a
missing or corrupt summary is recomputed, never trusted."""

from __future__ import annotations

import json
import logging
from dataclasses import asdict
from pathlib import Path
from typing import Any

import datasets
import pytest

from prefzoo.data import tokenize_pairs
from prefzoo.data.tokenize import FLAGS
from tests.support.tiny import make_pairs, write_jsonl

ENCODED = {*FLAGS, "prompt_ids", "chosen_ids", "rejected_ids"}  # the columns a tokenising pass writes

# every count non-zero: (max_prompt_length, max_completion_length) = (6, 4)
ROWS = [
    {"prompt": "abc", "chosen": "de", "rejected": "f"},  # kept
    {"prompt": "abcdefghij", "chosen": "de", "rejected": "f"},  # kept, prompt truncated
    {"prompt": "abc", "chosen": "defghij", "rejected": "f"},  # kept, completion truncated
    {"prompt": "abc", "chosen": "", "rejected": "f"},  # dropped: no completion token
    {"prompt": "abc", "chosen": "de", "rejected": "de"},  # dropped: identical
    {"prompt": "abc", "chosen": "x" * 1_000_001, "rejected": "f"},  # dropped: oversized
]
WANT = {"total": 6, "kept": 3, "dropped": 3, "prompt_truncated": 1, "completion_truncated": 1, "identical": 1,
        "oversized": 1}  # fmt: skip


def _load(tmp_path: Path, rows: list[dict[str, Any]]) -> datasets.Dataset:
    """A file-backed dataset (its maps are cached on disk, as a real run's are)."""
    tmp_path.mkdir(parents=True, exist_ok=True)
    data = write_jsonl(tmp_path / "pairs.jsonl", [{"id": str(i), **r} for i, r in enumerate(rows)])
    return datasets.load_dataset("json", data_files=str(data), split="train", cache_dir=str(tmp_path / "hf"))


@pytest.fixture()
def reads(monkeypatch: pytest.MonkeyPatch) -> list[tuple[set[str], int]]:
    """(columns, rows) of every Arrow table ``datasets`` turns into Python or Arrow output (rows, columns, slices)."""
    import datasets.arrow_dataset as ad

    seen: list[tuple[set[str], int]] = []
    original = ad.format_table

    def spy(table: Any, *a: Any, **k: Any) -> Any:
        seen.append((set(table.column_names), table.num_rows))
        return original(table, *a, **k)

    monkeypatch.setattr(ad, "format_table", spy)
    return seen


def _summary(tmp_path: Path) -> Path:
    (path,) = (tmp_path / "hf").rglob("prefzoo-tokenize-stats-*.json")
    return path


def test_the_cached_pass_counts_the_same_without_reading_the_tokenised_columns(tmp_path, tokenizer, reads):
    ds = _load(tmp_path, ROWS)
    _, first = tokenize_pairs(ds, tokenizer, max_prompt_length=6, max_completion_length=4)
    assert {k: v for k, v in asdict(first).items() if k in WANT} == WANT
    assert any(cols & ENCODED for cols, _ in reads)  # the first pass did count the flags
    reads.clear()
    enc, again = tokenize_pairs(ds, tokenizer, max_prompt_length=6, max_completion_length=4)
    assert again == first and again.examples and len(enc) == 3
    assert not [cols for cols, _ in reads if cols & ENCODED], reads  # nothing of the tokenised columns was read


def test_the_cached_pass_reads_as_much_at_400_pairs_as_at_40(tmp_path, tokenizer, reads):
    """The whole preparation (normalise, name ids, tokenise): rows read on a cache hit do not grow with the data."""
    from prefzoo.train import TrainConfig
    from prefzoo.train.setup.splits import SplitSettings, prepare_datasets

    run = TrainConfig(model="unused", eval_fraction=0.0, report_to="none", progress=False)
    cfg = SplitSettings(run.data, run.evaluation, run.seed, run.progress)
    read = {}
    for n in (40, 400):
        ds = _load(tmp_path / str(n), [{k: r[k] for k in ("prompt", "chosen", "rejected")} for r in make_pairs(n)])
        first = prepare_datasets(cfg, tokenizer, train=ds)[2]
        reads.clear()
        again = prepare_datasets(cfg, tokenizer, train=ds)[2]
        assert again == first and first["train"]["kept"] == n
        read[n] = sum(rows for _, rows in reads)
    assert read[400] == read[40] <= 100, read  # format detection reads the first rows; nothing else is read


def _tamper_count(path: Path) -> None:
    """kept and dropped moved by one (still adding up): only the checksum can tell."""
    stored = json.loads(path.read_text())
    stored["body"]["value"]["kept"] -= 1
    stored["body"]["value"]["dropped"] += 1
    path.write_text(json.dumps(stored))


def _forge(path: Path) -> None:
    """A wrong total with a checksum that matches it (a summary written by a buggy writer)."""
    from prefzoo.data.cache import _checksum

    stored = json.loads(path.read_text())
    stored["body"]["value"]["total"] += 1
    stored["body"]["value"]["dropped"] += 1
    stored["sha256"] = _checksum(stored["body"])
    path.write_text(json.dumps(stored))


def _other_rows(path: Path) -> None:
    from prefzoo.data.cache import _checksum

    stored = json.loads(path.read_text())
    stored["body"]["rows"] += 1
    stored["sha256"] = _checksum(stored["body"])
    path.write_text(json.dumps(stored))


CORRUPTIONS = {
    "deleted": (lambda p: p.unlink(), None),
    "truncated": (lambda p: p.write_bytes(p.read_bytes()[:40]), "JSONDecodeError"),
    "count changed": (_tamper_count, "checksum mismatch"),
    "forged total": (_forge, "'total': 7"),
    "another dataset's": (_other_rows, "written for another dataset"),
}


@pytest.mark.parametrize("corruption", list(CORRUPTIONS))
def test_a_missing_or_corrupt_summary_is_recomputed(tmp_path, tokenizer, caplog, corruption):
    corrupt, why = CORRUPTIONS[corruption]
    ds = _load(tmp_path, ROWS)
    _, first = tokenize_pairs(ds, tokenizer, max_prompt_length=6, max_completion_length=4)
    path = _summary(tmp_path)
    good = path.read_text()
    corrupt(path)
    with caplog.at_level(logging.WARNING, logger="prefzoo.data.cache"):
        _, again = tokenize_pairs(ds, tokenizer, max_prompt_length=6, max_completion_length=4)
    assert again == first  # recomputed from the columns, not taken from the bad file
    warned = [r.getMessage() for r in caplog.records if "corrupt dataset summary" in r.getMessage()]
    if why is None:
        assert not warned, warned  # a missing summary is simply computed
    else:
        assert warned and str(path) in warned[0] and why in warned[0] and "recomputing" in warned[0], caplog.text
    assert json.loads(path.read_text()) == json.loads(good)  # and rewritten whole


def test_an_in_memory_dataset_is_counted_and_writes_no_summary(tmp_path, tokenizer, monkeypatch):
    ds = datasets.Dataset.from_list([{"id": str(i), **r} for i, r in enumerate(ROWS)])
    monkeypatch.chdir(tmp_path)
    _, stats = tokenize_pairs(ds, tokenizer, max_prompt_length=6, max_completion_length=4)
    assert {k: v for k, v in asdict(stats).items() if k in WANT} == WANT
    assert not list(tmp_path.rglob("prefzoo-*.json"))


def test_pairs_from_lists_count_their_tied_lists_without_reading_them_again(tmp_path, reads):
    from prefzoo.data.formats import normalize
    from prefzoo.data.shapes import lists_to_pairs

    rows = [{"prompt": "p", "completions": ["a", "b", "c"], "scores": [3, 2, 1]},
            {"prompt": "q", "completions": ["a", "b"], "scores": [1, 1]}] * 3  # fmt: skip
    lists = normalize(_load(tmp_path, rows))
    pairs, tied = lists_to_pairs(lists, "all-pairs")
    reads.clear()
    again, tied_again = lists_to_pairs(lists, "all-pairs")
    assert (tied, tied_again, len(pairs), len(again)) == (3, 3, 9, 9)
    assert not [cols for cols, _ in reads if "none" in cols], reads
