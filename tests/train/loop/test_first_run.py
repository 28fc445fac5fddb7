"""What a newcomer reads in a CLI run: the thread choice first, no library noise, and a last line naming the outputs."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys

NOISE = ("Removed shared tensor", "Setting accelerator to CPU", "FutureWarning", "Traceback")


def _run(args, tmp_path):
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}
    env.pop("OMP_NUM_THREADS", None)  # the CLI chooses (conftest sets 1 for in-process tests)
    env.pop("THP_MEM_ALLOC_ENABLE", None)  # the CLI chooses
    cmd = [sys.executable, "-m", "prefzoo", "train", *args]
    return subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600, cwd=tmp_path)


def test_a_run_is_quiet_and_its_last_line_names_everything_it_wrote(tmp_path, tiny_dir, pairs_file):
    out = tmp_path / "out"
    proc = _run(
        ["--loss", "dpo", "--model", str(tiny_dir), "--dataset", str(pairs_file), "--max-steps", "2",
         "--output-dir", str(out), "--threads", "1", "--eval-at-start"],
        tmp_path,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-2000:]
    for noise in NOISE:
        assert noise not in proc.stderr + proc.stdout, noise
    lines = proc.stdout.strip().splitlines()
    assert lines[0] == "prefzoo train: 1 CPU thread (--threads)"
    thp = "/sys/kernel/mm/transparent_hugepage/enabled"
    if sys.platform.startswith("linux") and os.path.exists(thp) and "[never]" not in open(thp).read():
        assert lines[1].startswith("prefzoo train: transparent huge pages"), lines[:3]  # set before torch loads
    last = lines[-1]
    assert last.startswith("prefzoo train: done")
    assert f"final model {out / 'final'}" in last and f"metrics {out / 'metrics.jsonl'}" in last
    assert f"last checkpoint {out / 'checkpoints'}" in last
    assert ("TensorBoard" in last) == (importlib.util.find_spec("tensorboard") is not None)
    assert any("eval reward accuracy" in line for line in lines)  # evaluations go to stdout, the bar to stderr
    assert "eval reward accuracy" not in proc.stderr
    # DPO scores the starting policy against itself: every held-out pair ties, and the line says why it reads 0.000
    before = next(line for line in lines if "before training: eval reward accuracy" in line)
    assert before.startswith("prefzoo train: before training: eval reward accuracy 0.000 (100% of pairs tie; a tie "
                             "counts as wrong), eval loss 0.6931"), before
    # the detected format and one decoded pair, the prompt/completion boundary marked, before training starts
    assert any(line.startswith("prefzoo train: data format plain; chat template: none") for line in lines)
    chosen = next(line for line in lines if line.startswith("prefzoo train:   chosen:"))
    assert "=' ‖ '" in chosen and chosen.endswith("<eos>'")  # prompt ends at '=', completion ends with eos
