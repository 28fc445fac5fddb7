"""A half-written default-task cache (issue 18): a build killed mid-write, or a cached folder with a truncated or
missing file, is detected with a log line and rebuilt identical; it is never loaded."""

from __future__ import annotations

import logging

import pytest

pytest.importorskip("transformers")

from prefzoo.data.default import WarmupConfig
from prefzoo.model import load_default_task

TINY = WarmupConfig(steps=3, batch_size=4, warmup_steps=1)  # not the shipped policy: built in the cache


def _weights(folder):
    return (folder / "model.safetensors").read_bytes()


@pytest.mark.parametrize("damage", ["truncated", "missing"])
def test_a_half_written_cache_is_detected_and_rebuilt(tmp_path, caplog, damage):
    first = load_default_task(tmp_path, seed=1, warmup=TINY).model_dir
    assert first.parent == tmp_path  # built in the cache, not the shipped folder
    good = _weights(first)
    victim = first / "model.safetensors"
    if damage == "truncated":
        victim.write_bytes(good[: len(good) // 2])
    else:
        victim.unlink()
    killed = tmp_path / (first.name + ".tmp-killed")  # what a build killed while saving leaves behind
    killed.mkdir()
    (killed / "config.json").write_text("{")
    with caplog.at_level(logging.WARNING, logger="prefzoo.model.default_policy"):
        again = load_default_task(tmp_path, seed=1, warmup=TINY)
    assert again.model_dir == first and _weights(first) == good  # rebuilt bit for bit
    assert f"default-task cache {first} is incomplete" in caplog.text
    assert f"removing {killed}" in caplog.text and not killed.exists()
    again.load_model()  # loads


def test_a_complete_cache_is_reused_without_a_rebuild(tmp_path, caplog):
    first = load_default_task(tmp_path, seed=1, warmup=TINY).model_dir
    mtime = (first / "model.safetensors").stat().st_mtime_ns
    with caplog.at_level(logging.WARNING, logger="prefzoo.model.default_policy"):
        load_default_task(tmp_path, seed=1, warmup=TINY)
    assert (first / "model.safetensors").stat().st_mtime_ns == mtime and "incomplete" not in caplog.text
