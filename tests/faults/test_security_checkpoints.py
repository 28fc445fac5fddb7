"""Files you can trust: a checkpoint is resumed only if every file's sha256 matches its marker, a final model with
NaN or inf is never written, a full disk reported by torch or safetensors is the one-line disk-full error, and a
resume compares the loss's effective parameters (defaults included).  Each runs the CLI in a subprocess, as a user.

One short run (two checkpoints, ``--loss-param beta=0.1``: the default value, typed) is trained once; each test breaks
a copy of it.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from prefzoo.train.checkpoint import COMPLETE_MARKER, complete_checkpoints
from tests.faults._run import ROOT, cli_args, env, final_weights
from tests.faults.injector import SPEC as INJECTOR
from tests.train.helpers import base_config

KW = dict(loss="dpo", max_steps=2, save_steps=1, per_device_batch_size=4, grad_accum=1)


def prefzoo(*args: str, timeout: int = 600, **extra_env: str) -> subprocess.CompletedProcess:
    """``prefzoo ARGS`` in a fresh process, as a user runs it (stdout and stderr apart)."""
    cmd = [sys.executable, "-m", "prefzoo.cli.main", *args]
    return subprocess.run(cmd, env=env(**extra_env), cwd=ROOT, capture_output=True, text=True, timeout=timeout)


def train(cfg: dict, *extra: str, **extra_env: str) -> subprocess.CompletedProcess:
    return prefzoo("train", *cli_args(cfg), *extra, **extra_env)


def errors(proc: subprocess.CompletedProcess) -> list[str]:
    """The error lines a user reads; a traceback fails the test."""
    assert "Traceback" not in proc.stderr, proc.stderr[-3000:]
    return [x for x in proc.stderr.splitlines() if x.startswith("prefzoo train: error:")]


def snapshot(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


@pytest.fixture(scope="module")
def trained(tmp_path_factory, tiny_dir, pairs_file):
    """A finished run: checkpoints step-1 and step-2, final/, metrics.jsonl; trained with ``beta=0.1`` typed."""
    out = tmp_path_factory.mktemp("trusted") / "run"
    cfg = base_config(tiny_dir, pairs_file, out, **KW)
    proc = train(cfg, "--loss-param", "beta=0.1")
    assert proc.returncode == 0, proc.stderr[-3000:]
    return cfg


@pytest.fixture
def run(trained, tmp_path):
    """A copy of the trained run to break: (its config, its output dir)."""
    out = tmp_path / "run"
    shutil.copytree(trained["output_dir"], out)
    return {**trained, "output_dir": str(out)}, out


def _step(out: Path, n: int) -> Path:
    return out / "checkpoints" / f"step-{n:08d}"


def _verifies(ckpt: Path) -> bool:
    from prefzoo.train.checkpoint import verify_checkpoint

    verdict = verify_checkpoint(ckpt)
    return verdict.ok and verdict.hashed


def _info(path: Path) -> dict:
    proc = prefzoo("checkpoint", "info", str(path), "--json")
    assert proc.returncode == 0, proc.stderr[-2000:]
    return json.loads(proc.stdout)


# -- item 2: a damaged checkpoint ---------------------------------------------------------------------------------


def test_every_checkpoint_file_has_its_sha256_in_the_marker_and_verifies(run):
    _, out = run
    for ckpt in complete_checkpoints(out):
        marker = json.loads((ckpt / COMPLETE_MARKER).read_text())
        on_disk = {p.name for p in ckpt.iterdir() if p.name != COMPLETE_MARKER}
        assert set(marker["sha256"]) == set(marker["files"]) == on_disk, marker
        assert _verifies(ckpt)
    info = _info(out)
    assert info["verified"] is True and info["verification"].startswith("yes"), info


def test_a_damaged_newest_checkpoint_is_refused_and_resume_auto_falls_back_to_one_that_verifies(run):
    cfg, out = run
    newest = _step(out, 2)
    model = newest / "model.safetensors"
    with model.open("r+b") as f:  # 8 KB in the middle overwritten: same size, so the manifest's sizes cannot tell
        f.seek(model.stat().st_size // 2)
        f.write(b"\xff" * 8192)
    info = _info(newest)
    assert info["verified"] is False and "model.safetensors" in info["verification"], info
    assert info["resumes_on"].startswith("nothing: it fails verification"), info
    asked = train({**cfg, "max_steps": 3, "resume": str(newest)})  # asked for by path: refused, one line
    err = errors(asked)
    assert asked.returncode == 2 and len(err) == 1 and "fails verification (model.safetensors: its sha256" in err[0]
    auto = train({**cfg, "max_steps": 3, "resume": "auto"}, "--loss-param", "beta=0.1")
    assert auto.returncode == 0, auto.stderr[-3000:]
    said = auto.stdout
    assert "skipping step-00000002: model.safetensors: its sha256 differs" in said, said[-3000:]
    assert "resuming from step-00000001, the newest checkpoint that verifies" in said, said[-3000:]
    assert f"resumed from {_step(out, 1)} at step 1" in said, said[-3000:]
    weights = final_weights(out)
    assert all(bool(w.isfinite().all()) for w in weights.values())
    assert all(_verifies(c) for c in complete_checkpoints(out))  # step-2 written again


def test_a_truncated_newest_checkpoint_without_an_older_one_is_refused_and_nothing_is_overwritten(run):
    cfg, out = run
    shutil.rmtree(_step(out, 1))
    model = _step(out, 2) / "model.safetensors"
    model.write_bytes(model.read_bytes()[:1000])
    before = {"final": snapshot(out / "final"), "metrics": (out / "metrics.jsonl").read_bytes()}
    proc = train({**cfg, "max_steps": 3, "resume": "auto"})
    err = errors(proc)
    assert proc.returncode == 2 and len(err) == 1, proc.stderr[-3000:]
    assert "no checkpoint in" in err[0] and "verifies (step-00000002: incomplete" in err[0], err
    assert "nothing in" in err[0] and "is overwritten" in err[0], err
    assert snapshot(out / "final") == before["final"] and (out / "metrics.jsonl").read_bytes() == before["metrics"]


def test_non_finite_weights_never_replace_the_final_model(run):
    """A checkpoint whose weights hold NaN and whose marker predates sha256 (it cannot be verified): the run warns,
    resumes, skips its steps as non-finite and then refuses to write the final model; the old one stays."""
    from safetensors.torch import load_file, save_file

    cfg, out = run
    newest = _step(out, 2)
    path = newest / "model.safetensors"
    weights = load_file(str(path))
    save_file({k: v.fill_(float("nan")) for k, v in weights.items()}, str(path), metadata={"format": "pt"})
    marker = json.loads((newest / COMPLETE_MARKER).read_text())
    del marker["sha256"]  # a marker written by an older prefzoo
    marker["files"]["model.safetensors"] = path.stat().st_size
    (newest / COMPLETE_MARKER).write_text(json.dumps(marker))
    assert _info(newest)["verified"] is None
    before = snapshot(out / "final")
    proc = train({**cfg, "max_steps": 3, "resume": "auto"})
    assert "records no sha256 (written by an older prefzoo)" in proc.stdout, proc.stdout[-3000:]
    err = errors(proc)
    assert proc.returncode == 2 and len(err) == 1, proc.stderr[-3000:]
    assert "the trained weights hold NaN or inf" in err[0] and "keeps the model it held" in err[0], err
    assert snapshot(out / "final") == before and not (out / ".tmp-final").exists()


# -- item 6: a full disk as torch and safetensors report it -------------------------------------------------------


def test_a_full_disk_reported_as_runtime_error_is_the_one_line_disk_full_error(tmp_path, tiny_dir, pairs_file):
    out = tmp_path / "run"
    cfg = base_config(tiny_dir, pairs_file, out, **KW, callbacks=[INJECTOR])
    proc = train(cfg, PREFZOO_FAULTS="enospc_rt@2")
    err = errors(proc)
    assert proc.returncode == 2 and len(err) == 1, proc.stderr[-3000:]
    assert "disk full (ENOSPC) writing checkpoint 2" in err[0] and "step-00000001 is kept" in err[0], err
    assert not (out / "checkpoints" / ".tmp-step-00000002").exists()
    assert [p.name for p in complete_checkpoints(out)] == ["step-00000001"]


def _can_mount_tmpfs(where: Path) -> bool:
    probe = subprocess.run(["unshare", "-rm", "sh", "-c", f"mount -t tmpfs -o size=64k tmpfs {where}"],
                           capture_output=True)  # fmt: skip
    return probe.returncode == 0


def test_a_really_full_disk_while_torch_saves_is_the_one_line_disk_full_error(tmp_path, tiny_dir, pairs_file):
    """The output dir on a 576 KiB tmpfs (a mount namespace of its own): checkpoint 1 (~320 KB) fits, checkpoint 2
    runs out of space in torch.save of optimizer.bin, whose RuntimeError ('unexpected pos ...') names no errno."""
    disk = tmp_path / "disk"
    disk.mkdir()
    if shutil.which("unshare") is None or not _can_mount_tmpfs(disk):
        pytest.skip("needs unshare -rm and a tmpfs mount (a user namespace)")
    out = disk / "run"
    cfg = base_config(tiny_dir, pairs_file, out, **KW)
    args = " ".join(f"'{a}'" for a in ["-m", "prefzoo.cli.main", "train", *cli_args(cfg)])
    script = (f"mount -t tmpfs -o size=576k tmpfs {disk} && {sys.executable} {args}; rc=$?; "
              f"ls -a {out}/checkpoints; exit $rc")  # fmt: skip
    proc = subprocess.run(["unshare", "-rm", "sh", "-c", script], env=env(), cwd=ROOT, capture_output=True,
                          text=True, timeout=600)  # fmt: skip
    err = errors(proc)
    assert proc.returncode == 2 and len(err) == 1, proc.stderr[-3000:]
    assert "disk full (ENOSPC) writing checkpoint 2" in err[0] and "step-00000001 is kept" in err[0], err
    listed = proc.stdout.split()
    assert "step-00000001" in listed and not any(x.startswith(".tmp-") for x in listed), proc.stdout


def test_a_full_disk_reported_by_safetensors_while_the_final_model_is_written_is_disk_full(tmp_path, monkeypatch):
    """The final model's handler (``write_final_model``) maps safetensors' own error the same way, and removes the
    partial folder."""
    from types import SimpleNamespace

    from safetensors import SafetensorError

    from prefzoo.train.checkpoint import final
    from prefzoo.train.checkpoint.save import DiskFullError

    def save_model_folder(acc, policy, tokenizer, tmp, defaults, merge, engine, finite=None):
        tmp.mkdir(parents=True, exist_ok=True)
        (tmp / "model.safetensors").write_bytes(b"x" * 1000)  # the write stopped here
        raise SafetensorError("Error while serializing: I/O error: No space left on device (os error 28)")

    monkeypatch.setattr(final, "save_model_folder", save_model_folder)
    one = SimpleNamespace(num_processes=1, is_main_process=True, is_local_main_process=True, process_index=0,
                          wait_for_everyone=lambda: None)  # fmt: skip
    cfg = SimpleNamespace(output_dir=str(tmp_path / "run"), merge_lora=False)
    with pytest.raises(DiskFullError, match=r"disk full \(ENOSPC\) writing the final model at .*\.tmp-final"):
        final.write_final_model(one, None, None, cfg, SimpleNamespace())
    assert not (tmp_path / "run" / ".tmp-final").exists()


# -- item 7: the loss as meant ------------------------------------------------------------------------------------


def test_resume_compares_the_effective_loss_parameters_and_info_shows_them(run):
    cfg, out = run
    effective = {"beta": 0.1, "f_divergence": "reverse_kl", "alpha_divergence_coef": 0.5}
    assert _info(_step(out, 2))["loss_params"] == effective
    other = train({**cfg, "max_steps": 3, "resume": "auto"}, "--loss-param", "beta=0.2")
    err = errors(other)
    assert other.returncode == 2 and len(err) == 1 and "beta=0.1, this run has beta=0.2" in err[0], err
    same = train({**cfg, "max_steps": 3, "resume": "auto"})  # beta=0.1 is the default: the same loss
    assert same.returncode == 0, same.stderr[-3000:]
    assert f"resumed from {_step(out, 2)} at step 2" in same.stdout, same.stdout[-3000:]
    assert _info(out)["loss_params"] == effective
