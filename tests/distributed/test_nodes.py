"""Two nodes over loopback, each with its own --output-dir (node-local disks): checkpoint, agree, resume, or stop.

Each node is one ``torchrun --nnodes 2 --node_rank R`` with one process (LOCAL_RANK 0 on both), so these tests need
no PREFZOO_DIST_WORLDS of their own and run once, in the dist-2 env.
"""

from __future__ import annotations

import json
import os
import shutil
import time

import pytest

from prefzoo.train.checkpoint.save import complete_checkpoints, find_latest_checkpoint, is_complete
from tests.distributed._nodes import kill_node, run_nodes, start_nodes, wait_nodes
from tests.faults._run import final_weights, max_diff
from tests.faults.injector import SPEC as INJECTOR
from tests.train.helpers import base_config, params_of, run_inprocess

WORLDS = [int(w) for w in os.environ.get("PREFZOO_DIST_WORLDS", "2,4").split(",") if w]
pytestmark = [
    pytest.mark.distributed,
    pytest.mark.slow,
    pytest.mark.skipif(2 not in WORLDS, reason="two one-process nodes: run in the dist-2 env"),
]


def _copy(src, dst):
    dst.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(src, dst)
    return dst


def _steps(out):
    return [p.name for p in (out / "checkpoints").iterdir()]


def test_two_nodes_with_local_dirs_checkpoint_agree_resume_and_equal_one_node(tmp_path, tiny_dir, pairs_file):
    # node 1 reads its own copy of the data (same content, another path): the agreement is on content
    data = [pairs_file, _copy(pairs_file, tmp_path / "node1-disk" / "pairs.jsonl")]
    kw = dict(max_steps=4, save_steps=1, save_total_limit=2)
    cfgs = [base_config(tiny_dir, data[r], tmp_path / f"node{r}", **kw) for r in range(2)]
    logs = [tmp_path / f"node{r}.log" for r in range(2)]
    out = [tmp_path / f"node{r}" for r in range(2)]

    codes, texts = run_nodes([{**c, "stop_after_steps": 3} for c in cfgs], logs)
    assert codes == [0, 0], texts[0][-3000:] + texts[1][-3000:]
    assert "on 2 node(s); --output-dir node-local" in texts[0]
    for r in range(2):  # complete on both nodes, the same steps pruned, no .tmp-* litter; each rank's RNG state
        assert sorted(_steps(out[r])) == ["step-00000002", "step-00000003"], _steps(out[r])
        assert all(is_complete(p) for p in complete_checkpoints(out[r]))
        files = os.listdir(out[r] / "checkpoints" / "step-00000003")
        assert f"random_states_{r}.pkl" in files and "model.safetensors" in files and "optimizer.bin" in files
    assert (out[0] / "metrics.jsonl").is_file() and not (out[1] / "metrics.jsonl").exists()  # written once

    # node 1 lost its checkpoints: both ranks stop at once with the node, the step and the fix
    shutil.move(out[1] / "checkpoints", tmp_path / "node1-saved")
    t0 = time.monotonic()
    codes, texts = run_nodes([{**c, "resume": "auto"} for c in cfgs], logs, timeout=300)
    took = time.monotonic() - t0
    assert codes[0] != 0 and codes[1] != 0, texts[0][-3000:]
    for text in texts:
        assert "rank 1 on node 1" in text and "step-00000003" in text and "shared by every node" in text, text[-3000:]
    assert took < 120, took  # a guard against the old half-hour hang (--dist-timeout 1800 s), not a speed test
    shutil.move(tmp_path / "node1-saved", out[1] / "checkpoints")

    codes, texts = run_nodes([{**c, "resume": "auto"} for c in cfgs], logs)
    assert codes == [0, 0], texts[0][-3000:] + texts[1][-3000:]
    for r in range(2):
        assert "step-00000003 at step 3" in texts[r], texts[r][-3000:]
    assert (out[0] / "final" / "model.safetensors").is_file() and not (out[1] / "final").exists()

    # resubmitted once finished: every node returns at once (node 1 has no final/, but its finished marker)
    codes, texts = run_nodes([{**c, "resume": "auto", "dist_timeout": 60} for c in cfgs], logs, timeout=300)
    assert codes == [0, 0] and "already complete" in texts[0], texts[0][-3000:] + texts[1][-3000:]

    one = run_inprocess(base_config(tiny_dir, pairs_file, tmp_path / "one", per_device_batch_size=8, max_steps=4))
    assert max_diff(final_weights(out[0]), params_of(one.model)) < 1e-5


def test_node_with_other_data_is_refused_naming_both_fingerprints(tmp_path, tiny_dir, pairs_file):
    rows = [json.loads(line) for line in pairs_file.read_text().splitlines()]
    rows[5]["chosen"] = rows[5]["chosen"] + " 1"
    other = tmp_path / "other.jsonl"
    other.write_text("".join(json.dumps(r) + "\n" for r in rows))
    cfgs = [base_config(tiny_dir, d, tmp_path / f"node{r}") for r, d in enumerate((pairs_file, other))]
    codes, texts = run_nodes(cfgs, [tmp_path / f"node{r}.log" for r in range(2)], timeout=300)
    assert codes[0] != 0 and codes[1] != 0
    line = next((s for s in texts[0].splitlines() if "ranks disagree on the tokenized dataset" in s), None)
    assert line is not None, texts[0][-3000:]
    assert str(pairs_file) in line and str(other) in line and "rank 1 on node 1" in line, line
    assert not (tmp_path / "node0" / "checkpoints").exists()


def test_killed_node_ends_the_other_naming_it_and_checkpoints_stay_complete(tmp_path, tiny_dir, pairs_file):
    kw = dict(max_steps=40, save_steps=1, dist_timeout=20, callbacks=[INJECTOR])
    out = [tmp_path / f"node{r}" for r in range(2)]
    logs = [tmp_path / f"node{r}.log" for r in range(2)]
    procs = start_nodes(
        [base_config(tiny_dir, pairs_file, out[r], **kw) for r in range(2)], logs,
        PREFZOO_FAULTS="sleep_step@0", PREFZOO_FAULT_SLEEP="0.3",
    )  # fmt: skip
    t0 = time.monotonic()
    while find_latest_checkpoint(out[1]) is None or find_latest_checkpoint(out[1]).name < "step-00000002":
        assert time.monotonic() - t0 < 300 and procs[1].poll() is None, logs[1].read_text()[-3000:]
        time.sleep(0.2)
    kill_node(procs[1])
    code0 = wait_nodes(procs[:1], timeout=300)[0]
    text = logs[0].read_text()
    assert code0 != 0, text[-3000:]
    assert "lost rank(s) 1 (node 1)" in text and "--resume auto" in text, text[-3000:]
    for r in range(2):  # the newest complete checkpoint of each node is intact and resumable
        latest = find_latest_checkpoint(out[r])
        assert latest is not None and is_complete(latest) and latest.name >= "step-00000002", r
