"""Dataset mixing: --dataset a --dataset b:0.3 concatenates or interleaves by weight; bad weights are one line."""

from __future__ import annotations

import json
from collections import Counter

import pytest

from prefzoo.data.formats import DataFormatError, detected_format
from prefzoo.data.mixing import Source, load_mixture, parse_sources


def _write(path, n, tag, conversational=False):
    rows = []
    for i in range(n):
        if conversational:  # TRL's conversational format: message lists everywhere
            row = {"prompt": [{"role": "user", "content": f"{tag} q{i}"}]}
            row.update({k: [{"role": "assistant", "content": f"{tag} {k}"}] for k in ("chosen", "rejected")})
        else:
            row = {"prompt": f"{tag} q{i}", "chosen": f"{tag} good", "rejected": f"{tag} bad"}
        rows.append({"id": i, **row})
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


def test_sources_parse_from_flags_and_yaml():
    assert parse_sources("a.jsonl") == [Source("a.jsonl")]
    assert parse_sources(["a.jsonl", "b.parquet:0.3"]) == [Source("a.jsonl"), Source("b.parquet", 0.3)]
    assert parse_sources(["org/name:v2"]) == [Source("org/name:v2")]  # a colon that is no weight stays in the name
    assert parse_sources([{"path": "c.jsonl", "weight": 0.5, "split": "test"}]) == [Source("c.jsonl", 0.5, "test")]
    with pytest.raises(DataFormatError, match=r"weight 1\.5 must be in"):
        parse_sources(["a.jsonl:1.5"])
    with pytest.raises(DataFormatError, match="unknown keys"):
        parse_sources([{"path": "a", "wieght": 0.5}])


def test_without_weights_every_row_of_every_source_is_kept(tmp_path):
    a, b = _write(tmp_path / "a.jsonl", 30, "a"), _write(tmp_path / "b.jsonl", 10, "b")
    ds = load_mixture([a, b], "train", None, seed=0)
    assert len(ds) == 40 and len(set(ds["id"])) == 40  # equal ids of the two files stay distinct
    assert Counter(i.split(":")[0] for i in ds["id"]) == {"0": 30, "1": 10}
    assert detected_format(ds).startswith("plain")


def test_weights_set_each_sources_share_of_the_mix(tmp_path):
    a, b = _write(tmp_path / "a.jsonl", 2000, "a"), _write(tmp_path / "b.jsonl", 2000, "b")
    ds = load_mixture([a, f"{b}:0.3"], "train", None, seed=0)
    share_b = sum(i.startswith("1:") for i in ds["id"]) / len(ds)
    assert 0.25 < share_b < 0.35  # b is 30% of the mix, a the remaining 70%
    again = load_mixture([a, f"{b}:0.3"], "train", None, seed=0)
    assert again["id"] == ds["id"]  # seeded


def test_bad_mixtures_are_one_line_errors(tmp_path):
    a, b = _write(tmp_path / "a.jsonl", 5, "a"), _write(tmp_path / "b.jsonl", 5, "b", conversational=True)
    with pytest.raises(DataFormatError, match="must sum to 1"):
        load_mixture([f"{a}:0.5", f"{a}:0.4"], "train", None, seed=0)
    with pytest.raises(DataFormatError, match="mix string prompts with conversations"):
        load_mixture([a, b], "train", None, seed=0)


def test_the_train_cli_mixes_repeated_dataset_flags(tmp_path):
    pytest.importorskip("accelerate")
    from prefzoo.cli.main import main
    from tests.support.tiny import make_model_dir, make_pairs, write_jsonl

    model = make_model_dir(tmp_path / "m")
    a = write_jsonl(tmp_path / "a.jsonl", make_pairs(24, seed=1))
    b = write_jsonl(tmp_path / "b.jsonl", make_pairs(24, seed=2))
    out = tmp_path / "out"
    argv = ["train", "--loss", "dpo", "--model", str(model), "--dataset", str(a), "--dataset", f"{b}:0.5"]
    argv += ["--max-steps", "1", "--output-dir", str(out), "--no-progress", "--report-to", "none"]
    assert main(argv) == 0
    card = json.loads((out / "final" / "run_card.json").read_text())
    assert card["config"]["dataset"] == [str(a), f"{b}:0.5"]
    assert card["data"]["train"]["format"] == f"plain ({a}) + plain ({b})"
