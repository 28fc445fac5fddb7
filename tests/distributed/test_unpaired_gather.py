"""KTO's gathered z₀ and BCO's running δ on 2 and 4 gloo ranks with uneven shards, through the production gather.

Spawned ranks (the first holding one example) run kto, apo-zero-unpaired and three training steps plus one
evaluation step of one bound bco loss, with prefzoo.train.engines.accelerator.make_gather on an Accelerator(cpu=True)
(MULTI_CPU).  Per-example losses and gradients equal one process on the whole batch; every rank holds the same z₀,
the same δ at every step and the same BCO state afterwards.
"""

from __future__ import annotations

import os

import pytest
import torch

from tests.distributed import _unpaired_workers as W
from tests.distributed._spawn import spawn

pytestmark = pytest.mark.distributed
WORLDS = [int(w) for w in os.environ.get("PREFZOO_DIST_WORLDS", "2,4").split(",") if w]


@pytest.mark.parametrize("world", WORLDS)
def test_unpaired_losses_on_uneven_gloo_shards_equal_one_process(world, tmp_path):
    pytest.importorskip("accelerate")
    spawn(W.worker, world, str(tmp_path))
    out = torch.load(tmp_path / f"unpaired_{world}.pt")
    assert "MULTI_CPU" in out["type"] and out["sizes"][0] == 1 and sum(out["sizes"]) == W.N, out
    ref = W.single_process()
    assert set(out["res"]) == set(ref)
    for name, want in ref.items():
        got = out["res"][name]
        if name == "bco-state":  # every rank's state equals the single process's
            for k, v in want.items():
                torch.testing.assert_close(got[k], v.expand(world), atol=1e-12, rtol=1e-12, msg=f"state {k}")
            continue
        torch.testing.assert_close(got["losses"], want["losses"], atol=1e-12, rtol=1e-12, msg=name)
        torch.testing.assert_close(got["grad"], want["grad"], atol=1e-12, rtol=1e-12, msg=name)
        torch.testing.assert_close(got["point"], want["point"].expand(world), atol=1e-12, rtol=1e-12, msg=name)
    assert float(ref["kto"]["point"]) > 0  # z₀ is not clamped here: the gathered mean matters
    deltas = [float(ref[f"bco-{s}"]["point"]) for s in range(W.BCO_STEPS + 1)]
    assert len(set(deltas[: W.BCO_STEPS])) == W.BCO_STEPS and deltas[-1] == deltas[-2], deltas  # eval: δ unmoved


def test_a_rank_alone_would_differ():
    """Each rank on its own shard (no gather) gets another z₀ and δ: the test above can fail."""
    from prefzoo.testing import split_sizes

    ref = W.single_process()
    sizes = split_sizes(W.N, 2)
    alone = W.shard_results(slice(sizes[0], W.N), lambda t: t)
    for name in ("kto", "bco-0", "bco-2"):
        assert abs(float(alone[name]["point"]) - float(ref[name]["point"])) > 1e-3, name
