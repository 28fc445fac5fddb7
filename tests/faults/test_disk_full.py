"""A full disk while checkpointing (ENOSPC in the writer): the previous checkpoint stays newest, --resume auto works."""

from __future__ import annotations

import errno
import re
import threading
import time

import pytest

from prefzoo.cli.main import main
from prefzoo.testing.sharding import run_threads
from prefzoo.train.checkpoint.save import DiskFullError, complete_checkpoints, find_latest_checkpoint
from tests.faults._run import cli_args, final_weights, max_diff
from tests.faults.injector import SPEC as INJECTOR
from tests.properties._helpers import ThreadAccelerator
from tests.train.helpers import base_config, run_inprocess, run_processes

KW = dict(loss="dpo", max_steps=6, save_steps=2)


def test_enospc_in_the_checkpoint_writer_keeps_the_previous_one_and_resumes(
    tmp_path, tiny_dir, pairs_file, faults, capsys
):
    out = tmp_path / "run"
    cfg = base_config(tiny_dir, pairs_file, out, **KW)
    faults("enospc@4")
    assert main(["train", *cli_args({**cfg, "callbacks": [INJECTOR]})]) != 0
    err = [x for x in capsys.readouterr().err.strip().splitlines() if not x.startswith("prefzoo fault injection")]
    tmp = out / "checkpoints" / ".tmp-step-00000004"
    assert len(err) == 1, err
    line = err[0]
    assert "disk full (ENOSPC) writing checkpoint 4" in line and str(tmp / "model.safetensors") in line, line
    assert " MB, " in line and "MB are free" in line and "step-00000002 is kept" in line and "--resume auto" in line
    assert [p.name for p in complete_checkpoints(out)] == ["step-00000002"]  # the previous one is the newest
    assert not tmp.exists() and not (out / "final").exists()
    faults("")  # space freed
    res = run_inprocess({**cfg, "resume": "auto"})
    assert res.global_step == 6 and find_latest_checkpoint(out).name == "step-00000006"
    run_inprocess(base_config(tiny_dir, pairs_file, tmp_path / "full", **KW))
    diff = max_diff(final_weights(tmp_path / "full"), final_weights(out))
    assert diff < 1e-6, diff


@pytest.mark.slow  # about 40 s on a loaded 2-core machine (2 spawned processes)
@pytest.mark.distributed
def test_enospc_on_one_rank_stops_every_rank_without_a_hang(tmp_path, tiny_dir, pairs_file, faults):
    out = tmp_path / "run"
    faults("enospc@4:1")  # rank 1's writer only (its RNG-state file); rank 0 wrote everything
    cfg = base_config(tiny_dir, pairs_file, out, **KW, per_device_batch_size=2, dist_timeout=60, callbacks=[INJECTOR])
    with pytest.raises(AssertionError, match=r"disk full \(ENOSPC\) writing checkpoint 4") as err:
        run_processes(cfg, 2)
    assert "timed out" not in str(err.value) and "--dist-timeout" not in str(err.value)
    assert [p.name for p in complete_checkpoints(out)] == ["step-00000002"]
    assert not (out / "checkpoints" / ".tmp-step-00000004").exists()


def test_enospc_while_saving_the_final_model_is_one_line_and_resume_writes_it(
    tmp_path, tiny_dir, pairs_file, faults, capsys
):
    out = tmp_path / "run"
    cfg = base_config(tiny_dir, pairs_file, out, **KW)
    faults("enospc_final@0")
    assert main(["train", *cli_args({**cfg, "callbacks": [INJECTOR]})]) == 2
    err = [x for x in capsys.readouterr().err.strip().splitlines() if not x.startswith("prefzoo fault injection")]
    assert len(err) == 1, err
    line = err[0]
    assert f"disk full (ENOSPC) writing the final model at {out / '.tmp-final' / 'model.safetensors'}" in line, line
    assert "MB are free" in line and "step-00000006 is intact" in line and "--resume auto" in line, line
    assert not (out / "final").exists() and not (out / ".tmp-final").exists()
    assert find_latest_checkpoint(out).name == "step-00000006"  # complete (manifest sizes checked)
    faults("")  # space freed: the same command with --resume auto writes the model, trains nothing again
    res = run_inprocess({**cfg, "resume": "auto"})
    assert res.global_step == 6 and res.history == [] and (out / "final" / "run_card.json").is_file()
    run_inprocess(base_config(tiny_dir, pairs_file, tmp_path / "full", **KW))
    assert max_diff(final_weights(tmp_path / "full"), final_weights(out)) == 0


_RANK = threading.local()  # which thread rank is running: set in each rank's thread


def _on_two_thread_ranks(save) -> dict[int, str | None]:
    """``save(accelerator)`` on two thread ranks (prefzoo.testing.sharding.run_threads); each rank's DiskFullError
    message (any other error is raised)."""

    def rank_main(rank, ex):
        _RANK.id = rank
        try:
            save(ThreadAccelerator(rank, ex))
        except DiskFullError as e:
            return str(e)
        return None

    return dict(enumerate(run_threads(rank_main, 2)))


def _checkpoint_on_thread_ranks(out, monkeypatch):
    from prefzoo.train.checkpoint.save import save_checkpoint

    def write(tmp):  # rank 0 writes its part, rank 1's disk is full
        if _RANK.id == 0:
            (tmp / "model.safetensors").write_bytes(b"x" * 300_000)
        else:
            raise OSError(errno.ENOSPC, "No space left on device", str(tmp / "random_states_1.pkl"))

    errors = _on_two_thread_ranks(lambda acc: save_checkpoint(acc, out, 4, {}, keep=2, write=write))
    return errors, out / "checkpoints" / ".tmp-step-00000004"


def _final_model_on_thread_ranks(out, monkeypatch):
    from types import SimpleNamespace

    from prefzoo.train.checkpoint import final as runcard

    def save_model_folder(acc, policy, tokenizer, tmp, defaults, merge, engine, finite=None):
        tmp.mkdir(parents=True, exist_ok=True)
        if acc.is_main_process:
            (tmp / "model.safetensors").write_bytes(b"x" * 300_000)
        raise OSError(errno.ENOSPC, "No space left on device", str(tmp / "model.safetensors"))

    monkeypatch.setattr(runcard, "save_model_folder", save_model_folder)
    cfg = SimpleNamespace(output_dir=str(out), merge_lora=False)
    errors = _on_two_thread_ranks(lambda acc: runcard.write_final_model(acc, None, None, cfg, SimpleNamespace()))
    return errors, out / ".tmp-final"


@pytest.mark.parametrize(
    "save", [_checkpoint_on_thread_ranks, _final_model_on_thread_ranks], ids=["checkpoint", "final"]
)
def test_enospc_on_one_rank_every_rank_measures_the_partial_folder_before_it_is_removed(tmp_path, monkeypatch, save):
    """The writer removes the partial folder only after every process has measured it for the error's size. CI once
    failed here: rank 1 was walking ``.tmp-step-N`` while rank 0 removed it (FileNotFoundError from ``rglob``). Rank
    1's measurement is slowed so that a removal without a barrier always lands before or inside it."""
    from prefzoo.train.checkpoint import save as ckpt

    measure = ckpt._bytes

    def slow_on_rank_1(folder):
        if getattr(_RANK, "id", None) == 1:
            time.sleep(0.5)
        return measure(folder)

    monkeypatch.setattr(ckpt, "_bytes", slow_on_rank_1)
    errors, tmp = save(tmp_path / "run", monkeypatch)
    sizes = {r: m and re.search(r"needs about ([0-9.]+) MB", m) for r, m in errors.items()}
    assert set(sizes) == {0, 1} and all(sizes.values()), errors
    assert sizes[0].group(1) == sizes[1].group(1) == "0.3", errors  # both saw rank 0's 300 kB before the removal
    assert not tmp.exists()
