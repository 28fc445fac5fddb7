"""``--density-ratio`` on 2 gloo ranks: the classifier fitted from the ranks' shares of the prompt sample (gathered)
equals the one-process fit, and every rank holds the same one (rank 0's, broadcast).

A rank fitting on its own share alone gets another classifier: the comparison can fail.
"""

from __future__ import annotations

import pytest
import torch

from tests.distributed import _density_ratio_worker as W
from tests.distributed._spawn import spawn

pytestmark = pytest.mark.distributed


def test_two_ranks_fit_the_one_process_classifier(tmp_path):
    pytest.importorskip("accelerate")
    pytest.importorskip("datasets")
    spawn(W.worker, 2, str(tmp_path))
    two = torch.load(tmp_path / "fit_2.pt")
    one = W.fit(W.OneProcess(), lambda t: t)
    assert "MULTI_CPU" in two["type"] and two["theta"].shape[0] == 2
    assert torch.equal(two["theta"][0], two["theta"][1])  # every rank: the same classifier, bit for bit
    torch.testing.assert_close(two["theta"][0], one, atol=1e-6, rtol=0)  # = the whole sample's fit
    assert float(one.abs().max()) > 1e-2  # a classifier that separates something, not all zeros
