"""A full disk while checkpointing (ENOSPC in the writer): the previous checkpoint stays newest, --resume auto works."""

from __future__ import annotations

import pytest

from prefzoo.cli.main import main
from prefzoo.train.checkpoint import complete_checkpoints, find_latest_checkpoint
from tests.faults._run import cli_args, final_weights, max_diff
from tests.faults.injector import SPEC as INJECTOR
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
