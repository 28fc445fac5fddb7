"""The spawn helper itself: a rank that finishes skips the interpreter's teardown; a rank that raises is reported."""

from __future__ import annotations

import atexit
from pathlib import Path

import pytest
import torch

from tests.distributed._spawn import spawn

pytestmark = pytest.mark.distributed


def _finishes(rank: int, world: int, port: int, out_dir: str) -> None:
    atexit.register(Path(out_dir, f"teardown-{rank}").touch)  # runs only if the interpreter tears down
    print(f"rank {rank} of {world} done", flush=False)  # unflushed: the helper must flush before it ends
    Path(out_dir, f"done-{rank}").touch()


def _raises(rank: int, world: int, port: int, out_dir: str) -> None:
    raise ValueError(f"rank {rank}: bad shard")


def test_a_finished_rank_ends_without_the_teardown(tmp_path, capfd):
    spawn(_finishes, 2, str(tmp_path))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["done-0", "done-1"]  # no teardown-R: atexit never ran
    out = capfd.readouterr().out
    assert "rank 0 of 2 done" in out and "rank 1 of 2 done" in out, out


def test_a_rank_that_raises_fails_the_spawn_with_its_error(tmp_path):
    with pytest.raises(torch.multiprocessing.ProcessRaisedException, match="bad shard"):
        spawn(_raises, 1, str(tmp_path))
