"""A checkpoint from someone else runs no code: every file of a real checkpoint that is not safetensors or JSON gets a
pickle whose ``__reduce__`` calls ``os.system``, one file at a time, and ``prefzoo train --resume auto`` (a
subprocess, as a user runs it) must refuse the file in one line naming it, and the command must never run.

The planted file's entry in the completion marker is rewritten to match it (its size, and its sha256 where the
marker lists one): a marker is no signature, whoever hands over a checkpoint writes it too.
"""

from __future__ import annotations

import hashlib
import json
import os
import pickle
import shutil
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from tests.faults._run import cli_args, env
from tests.train.helpers import base_config

MARKER_NAME = "prefzoo_checkpoint.json"
NOT_READ = ("latest", "zero_to_fp32.py", "zero_to_torch.py")  # DeepSpeed's text files: nothing reads them as data


class _Payload:
    """Unpickling this runs ``touch <path>``."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def __reduce__(self):
        return (os.system, (f"touch {self.path}",))


def _plant(ckpt: Path, rel: str, ran: Path) -> None:
    """``ckpt/rel`` becomes the payload; the marker's manifest (sizes and sha256) is made to match it, a file it did
    not list added, as an attacker who can edit the folder would: the test reaches the loaders behind the marker."""
    target = ckpt / rel
    target.write_bytes(pickle.dumps(_Payload(ran)))
    marker_path = ckpt / MARKER_NAME
    marker = json.loads(marker_path.read_text())
    marker.setdefault("files", {})[rel] = target.stat().st_size
    marker.setdefault("sha256", {})[rel] = hashlib.sha256(target.read_bytes()).hexdigest()
    marker_path.write_text(json.dumps(marker))


def _targets(ckpt: Path) -> list[str]:
    """Every file of the checkpoint that is not safetensors or JSON (and could be unpickled), plus the file of
    accelerate's custom objects that a stateful loss once wrote (a hostile checkpoint may still hold one)."""
    found = {
        str(p.relative_to(ckpt))
        for p in ckpt.rglob("*")
        if p.is_file() and p.suffix not in (".safetensors", ".json") and p.name not in NOT_READ
    }
    return sorted(found | {"custom_checkpoint_0.pkl"})


def _launch(nproc: int) -> list[str]:
    if nproc == 1:
        return [sys.executable, "-m", "prefzoo.cli.main"]
    return [sys.executable, "-m", "torch.distributed.run", f"--nproc_per_node={nproc}", "--standalone", "-m",
            "prefzoo.cli.main"]  # fmt: skip


def _train(cfg: dict, nproc: int, timeout: int = 900) -> subprocess.CompletedProcess:
    cmd = [*_launch(nproc), "train", *cli_args(cfg)]
    return subprocess.run(cmd, env=env(DS_ACCELERATOR="cpu"), capture_output=True, text=True, timeout=timeout)


def _check_every_file(tmp_path: Path, cfg: dict, nproc: int) -> None:
    """Train one step with a checkpoint, then for each file: a fresh copy of the run with the payload in that file,
    resumed for a second step."""
    first = _train(cfg, nproc)
    assert first.returncode == 0, (first.stdout + first.stderr)[-4000:]
    out = Path(cfg["output_dir"])
    ckpt = out / "checkpoints" / "step-00000001"
    targets = _targets(ckpt)
    assert targets, sorted(p.name for p in ckpt.rglob("*"))
    for i, rel in enumerate(targets):
        run = tmp_path / f"planted-{i}"
        shutil.copytree(out, run)
        ran = tmp_path / f"ran-{i}"
        _plant(run / "checkpoints" / "step-00000001", rel, ran)
        resumed = _train({**cfg, "output_dir": str(run), "max_steps": 2, "resume": "auto"}, nproc)
        text = resumed.stdout + resumed.stderr
        assert not ran.exists(), f"the payload in {rel} ran:\n{text[-3000:]}"
        assert resumed.returncode != 0, text[-3000:]
        errors = [line for line in text.splitlines() if line.startswith("prefzoo train: error:")]
        assert errors and rel in errors[0] and "refuses this file" in errors[0], (rel, text[-3000:])
        assert "Traceback" not in text or nproc > 1, text[-3000:]  # torchrun adds its own summary of the exit
        shutil.rmtree(run)


@pytest.mark.slow
def test_no_file_of_a_stateful_loss_checkpoint_runs_code(tmp_path, tiny_dir, pairs_file):
    """BCO keeps a running reward mean between steps: it is saved, and read back, without pickle."""
    cfg = base_config(tiny_dir, pairs_file, tmp_path / "run", loss="bco", unpair=True, max_steps=1, save_steps=1)
    _check_every_file(tmp_path, cfg, nproc=1)


@pytest.mark.slow
@pytest.mark.distributed
@pytest.mark.parametrize("engine", ["ddp", "fsdp"])
def test_no_file_of_a_two_process_checkpoint_runs_code(tmp_path, tiny_dir, pairs_file, engine):
    """DDP (accelerate's files, the stateful loss) and FSDP2 (DCP's pickled metadata and items) on 2 gloo ranks."""
    kw = {"loss": "bco", "unpair": True} if engine == "ddp" else {"fsdp": True}
    cfg = base_config(tiny_dir, pairs_file, tmp_path / "run", max_steps=1, save_steps=1, per_device_batch_size=2, **kw)
    _check_every_file(tmp_path, cfg, nproc=2)


@pytest.mark.slow
@pytest.mark.distributed
@pytest.mark.deepspeed
def test_no_file_of_a_deepspeed_checkpoint_runs_code(tmp_path, tiny_dir, pairs_file):
    """DeepSpeed's own files are pickles by design: read with weights_only=True, a payload is refused."""
    pytest.importorskip("deepspeed")
    cfg = base_config(tiny_dir, pairs_file, tmp_path / "run", max_steps=1, save_steps=1, deepspeed="zero2")
    _check_every_file(tmp_path, cfg, nproc=1)


def test_the_readers_themselves_refuse_a_payload(tmp_path):
    """Second line: with the check before loading gone, each reader a resume goes through still refuses (DCP's
    metadata and its non-tensor items, DeepSpeed's checkpoint engine, accelerate's torch files)."""
    import io

    import torch

    from prefzoo.train.checkpoint.state import dcp_planner, read_dcp_metadata, safe_torch_load
    from prefzoo.train.engines.deepspeed import read_with_weights_only

    ran = tmp_path / "ran"
    bad = tmp_path / "bad.pkl"
    bad.write_bytes(pickle.dumps(_Payload(ran)))
    zipped = tmp_path / "bad.pt"
    torch.save({"state": _Payload(ran)}, zipped)
    with pytest.raises(pickle.UnpicklingError):
        read_dcp_metadata(bad)
    for f in (bad, zipped):
        with pytest.raises(pickle.UnpicklingError):
            safe_torch_load(str(f))

    def full_pickle(path, map_location=None):  # DeepSpeed's own TorchCheckpointEngine.load
        return torch.load(path, map_location=map_location, weights_only=False)

    engine = SimpleNamespace(checkpoint_engine=SimpleNamespace(load=full_pickle))
    read_with_weights_only(engine, [])
    with pytest.raises(pickle.UnpicklingError):
        engine.checkpoint_engine.load(str(zipped))
    planner = dcp_planner()
    planner.flatten_state_dict = False
    planner.state_dict = {}
    with pytest.raises(pickle.UnpicklingError):
        planner.load_bytes(None, io.BytesIO(zipped.read_bytes()))
    assert not ran.exists()


@pytest.mark.deepspeed
def test_the_deepspeed_engine_reads_its_files_with_weights_only(tmp_path):
    """The engine's load_state points DeepSpeed's own checkpoint engine (full pickle) at the weights-only reader
    before accelerate asks DeepSpeed to load."""
    pytest.importorskip("deepspeed")
    import torch
    from deepspeed.runtime.checkpoint_engine.torch_checkpoint_engine import TorchCheckpointEngine

    from prefzoo.train.config import TrainConfig
    from prefzoo.train.engines import EngineSettings, engine_for

    ran = tmp_path / "ran"
    bad = tmp_path / "mp_rank_00_model_states.pt"
    torch.save({"module": _Payload(ran)}, bad)
    wrapped = SimpleNamespace(checkpoint_engine=TorchCheckpointEngine())
    accelerator = SimpleNamespace(_models=[wrapped], load_state=lambda folder: wrapped.checkpoint_engine.load(str(bad)))
    with pytest.raises(pickle.UnpicklingError):
        engine = engine_for(EngineSettings.of(TrainConfig(model="m", deepspeed="zero2")))
        engine.load_state(accelerator, None, None, tmp_path)
    assert not ran.exists()


@pytest.mark.slow
@pytest.mark.distributed
@pytest.mark.deepspeed
def test_a_deepspeed_checkpoint_resumes_through_the_weights_only_reader(tmp_path, tiny_dir, pairs_file):
    """DeepSpeed's files read with weights_only=True resume a run to where the uninterrupted one ends."""
    pytest.importorskip("deepspeed")
    from tests.faults._run import final_weights, max_diff

    kw = dict(max_steps=2, save_steps=1, deepspeed="zero2")
    whole = _train(base_config(tiny_dir, pairs_file, tmp_path / "whole", **kw), 1)
    assert whole.returncode == 0, (whole.stdout + whole.stderr)[-3000:]
    cfg = base_config(tiny_dir, pairs_file, tmp_path / "run", **{**kw, "max_steps": 1})
    assert _train(cfg, 1).returncode == 0
    resumed = _train({**cfg, "max_steps": 2, "resume": "auto"}, 1)
    text = resumed.stdout + resumed.stderr
    assert resumed.returncode == 0 and "resumed from" in text, text[-3000:]
    diff = max_diff(final_weights(tmp_path / "whole"), final_weights(tmp_path / "run"))
    assert diff < 1e-6, diff
