"""β-DPO on 2 gloo processes (uneven shards, the production gather) equals one process with the same global batch.

Three training steps (running M₀ and σ, the filtering draw over the gathered batch) and one evaluation step: per-pair
losses and gradients equal one process's, and every rank ends with the single process's state.
"""

from __future__ import annotations

import pytest
import torch

from tests.distributed import _beta_dpo_worker as W
from tests.distributed._spawn import spawn

pytestmark = pytest.mark.distributed


def test_beta_dpo_on_two_gloo_processes_equals_one(tmp_path):
    pytest.importorskip("accelerate")
    spawn(W.worker, 2, str(tmp_path))
    out = torch.load(tmp_path / "beta_dpo_2.pt")
    assert "MULTI_CPU" in out["type"] and out["sizes"] == [1, 8], out
    want = W.single_process()
    for k, v in want.items():
        got = out["res"][k]
        if k.startswith("state-"):  # every rank holds the single process's state
            assert torch.equal(got, v.expand(2)), k
        else:
            torch.testing.assert_close(got, v, atol=1e-14, rtol=0, msg=k)
    dropped = [int((want[f"losses-{s}"] == 0).sum()) for s in range(W.STEPS + 1)]
    assert dropped == [W.N - W.N // 2] * W.STEPS + [0], dropped  # training draws ⌊ρN⌋ pairs, evaluation keeps all
    assert float(want["state-beta-dpo.steps"]) == W.STEPS


def test_a_rank_alone_would_differ():
    """Rank 1's shard without the gather gets other statistics: the test above can fail."""
    want = W.single_process()
    alone = W.shard_results(slice(1, W.N), lambda t: t)
    assert float(alone["state-beta-dpo.margin_mean"]) != float(want["state-beta-dpo.margin_mean"])
