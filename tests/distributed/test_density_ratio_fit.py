"""``--density-ratio`` on 2 gloo ranks: the classifier fitted from the ranks' shares of the prompt sample (gathered)
equals the one-process fit, and every rank holds the same one (rank 0's, broadcast).

A rank fitting on its own share alone gets another classifier: the comparison can fail.
"""

from __future__ import annotations

import socket

import pytest
import torch

from tests.distributed import _density_ratio_worker as W

pytestmark = pytest.mark.distributed


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _spawn(world: int, tmp_path) -> dict:
    torch.multiprocessing.spawn(W.worker, args=(world, _port(), str(tmp_path)), nprocs=world, join=True)
    return torch.load(tmp_path / f"fit_{world}.pt")


def test_two_ranks_fit_the_one_process_classifier(tmp_path, monkeypatch):
    pytest.importorskip("accelerate")
    pytest.importorskip("datasets")
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    two = _spawn(2, tmp_path)
    one = W.fit(W.OneProcess(), lambda t: t)
    assert "MULTI_CPU" in two["type"] and two["theta"].shape[0] == 2
    assert torch.equal(two["theta"][0], two["theta"][1])  # every rank: the same classifier, bit for bit
    torch.testing.assert_close(two["theta"][0], one, atol=1e-6, rtol=0)  # = the whole sample's fit
    assert float(one.abs().max()) > 1e-2  # a classifier that separates something, not all zeros
