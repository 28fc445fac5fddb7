"""Corrupt caches are detected, rebuilt with a log line, never trained on; --precompute-ref resume survives them."""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path

import pytest
import torch

from tests.faults._run import final_weights, max_diff
from tests.train.helpers import base_config, run_inprocess

KW = dict(loss="dpo", max_steps=4, save_steps=2, precompute_ref=True)


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory, tiny_dir, pairs_file):
    """Final weights of the run trained start to end with a freshly computed reference."""
    root = tmp_path_factory.mktemp("full")
    run_inprocess(base_config(tiny_dir, pairs_file, root / "run", **KW, ref_cache_dir=str(root / "ref")))
    return final_weights(root / "run")


def _table(path):
    from safetensors import safe_open

    with safe_open(str(path), framework="pt") as f:
        return f.metadata(), f.get_tensor("logps").clone()  # a copy: the file is rewritten in place later


def _drop_a_row(path):
    """The table loses its last row (the ids and checksum stay): a reference-cache table with a wrong row count."""
    from safetensors import safe_open
    from safetensors.torch import save_file

    with safe_open(str(path), framework="pt") as f:
        meta, logps = f.metadata(), f.get_tensor("logps")
    save_file({"logps": logps[:-1].clone()}, str(path), metadata=meta)


def _tamper(path):
    """One value changed, everything else intact: only the checksum can tell."""
    from safetensors import safe_open
    from safetensors.torch import save_file

    with safe_open(str(path), framework="pt") as f:
        meta, logps = f.metadata(), f.get_tensor("logps")
    logps[0, 0] += 1.0
    save_file({"logps": logps}, str(path), metadata=meta)


CORRUPTIONS = {
    "deleted": (lambda p: p.unlink(), None),
    "wrong row count": (_drop_a_row, "does not match this dataset/model/tokenization: recomputing"),
    "tampered value": (_tamper, "failed its checksum or holds non-finite values: recomputing"),
    "truncated file": (lambda p: p.write_bytes(p.read_bytes()[:100]), "unreadable"),
}


@pytest.mark.parametrize("corruption", list(CORRUPTIONS))
def test_resume_with_precompute_ref_after_the_cache_changed(
    tmp_path, tiny_dir, pairs_file, uninterrupted, caplog, corruption
):
    corrupt, message = CORRUPTIONS[corruption]
    cache = tmp_path / "ref"
    cfg = base_config(tiny_dir, pairs_file, tmp_path / "run", **KW, ref_cache_dir=str(cache))
    first = run_inprocess({**cfg, "stop_after_steps": 2})
    assert first.global_step == 2 and first.final_dir is None
    (path,) = cache.glob("ref-logps-*.safetensors")
    good = _table(path)
    corrupt(path)
    with caplog.at_level(logging.WARNING, logger="prefzoo.scoring.reference_cache"):
        res = run_inprocess({**cfg, "resume": "auto"})
    assert res.global_step == 4
    if message:
        assert any(message in r.getMessage() and str(path) in r.getMessage() for r in caplog.records), caplog.text
    meta, logps = _table(path)
    assert meta == good[0] and torch.equal(logps, good[1])  # rebuilt, identical to the one computed first
    diff = max_diff(uninterrupted, final_weights(tmp_path / "run"))
    assert diff < 1e-6, diff  # never trained on the corrupt table
    card = json.loads((tmp_path / "run" / "final" / "run_card.json").read_text())
    assert card["steps"] == 4


def test_precomputed_table_equals_the_live_reference(tmp_path, tiny_dir, pairs_file):
    """The cache stores what the frozen reference computes (else a rebuilt cache proves nothing)."""
    live = run_inprocess(base_config(tiny_dir, pairs_file, tmp_path / "live", **{**KW, "precompute_ref": False}))
    cached = run_inprocess(base_config(tiny_dir, pairs_file, tmp_path / "pre", **KW, ref_cache_dir=str(tmp_path / "c")))
    for a, b in zip(live.history, cached.history, strict=True):
        assert abs(a["loss"] - b["loss"]) < 1e-5
    assert torch.isfinite(torch.tensor([h["loss"] for h in cached.history])).all()


def test_a_truncated_tokenised_dataset_cache_is_rebuilt(tmp_path, tiny_dir, pairs_file, caplog):
    from prefzoo.data.formats import load_preference_dataset

    data = tmp_path / "pairs.jsonl"
    data.write_bytes(pairs_file.read_bytes())  # a file of its own: its datasets cache folder is new
    cfg = dict(loss="dpo", max_steps=2)
    run_inprocess(base_config(tiny_dir, data, tmp_path / "a", **cfg))
    folder = Path(load_preference_dataset(str(data)).cache_files[0]["filename"]).parent
    cached = sorted(folder.glob("cache-*.arrow"))
    assert cached  # the id-naming and tokenising maps were cached
    for f in cached:  # a run killed while writing them, or a full disk
        os.truncate(f, f.stat().st_size // 2)
    with caplog.at_level(logging.WARNING, logger="prefzoo.data.cache"):
        run_inprocess(base_config(tiny_dir, data, tmp_path / "b", **cfg))
    rebuilt = [r.getMessage() for r in caplog.records if "corrupt tokenised-dataset cache" in r.getMessage()]
    assert rebuilt and str(folder) in rebuilt[0] and "rebuilding it" in rebuilt[0], caplog.text
    assert max_diff(final_weights(tmp_path / "a"), final_weights(tmp_path / "b")) == 0.0  # trained on the same rows
