"""`prefzoo checkpoint info DIR`: what a checkpoint holds and what it resumes on, from a real run's checkpoints."""

from __future__ import annotations

import json

import pytest

from prefzoo.cli.main import main
from tests.train.helpers import base_config, run_inprocess


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory, tiny_dir, pairs_file):
    out = tmp_path_factory.mktemp("ckpt-info") / "run"
    run_inprocess(base_config(tiny_dir, pairs_file, out, max_steps=2, save_steps=1, per_device_batch_size=2,
                              grad_accum=2))  # fmt: skip
    return out


def test_info_on_a_run_describes_its_newest_checkpoint(run_dir, capsys):
    assert main(["checkpoint", "info", str(run_dir)]) == 0
    out = capsys.readouterr().out
    assert "checkpoints/step-00000002 (complete)" in out
    assert "written by:      DDP on 1 processes × 2 × 2 accumulation (4 examples per step)" in out
    assert "resumes on:      one process, DDP or FSDP2 on any number of processes, with 4 examples per step" in out
    assert main(["checkpoint", "info", str(run_dir / "checkpoints" / "step-00000001"), "--json"]) == 0
    info = json.loads(capsys.readouterr().out)
    assert info["step"] == 1 and info["loss"] == "dpo" and info["format"] == "accelerate" and info["bytes"] > 0


def test_info_says_a_truncated_checkpoint_resumes_on_nothing(run_dir, tmp_path, capsys):
    import shutil

    broken = tmp_path / "step-00000002"
    shutil.copytree(run_dir / "checkpoints" / "step-00000002", broken)
    (broken / "model.safetensors").write_bytes(b"cut")
    assert main(["checkpoint", "info", str(broken), "--json"]) == 0
    info = json.loads(capsys.readouterr().out)
    assert info["complete"] is False and info["resumes_on"].startswith("nothing: incomplete or corrupt checkpoint")


def test_info_on_a_folder_without_checkpoints_is_one_line(tmp_path, capsys):
    assert main(["checkpoint", "info", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "no complete checkpoint under" in err[0], err
