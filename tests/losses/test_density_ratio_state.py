"""The density-ratio classifier loads a lower-precision checkpoint back into float64 (its working precision)."""

from __future__ import annotations

import torch

from prefzoo.losses.density_ratio import DensityRatioClassifier


def test_a_float32_state_dict_loads_as_float64_and_scores_like_it():
    state = {"weight": torch.tensor([0.1, -0.3], dtype=torch.float32), "bias": torch.tensor(0.7, dtype=torch.float32)}
    clf = DensityRatioClassifier.from_state_dict(state)
    assert clf.weight.dtype == torch.float64 and clf.bias.dtype == torch.float64
    assert {k: v.dtype for k, v in clf.state_dict().items()} == {"weight": torch.float64, "bias": torch.float64}
    e = torch.tensor([[1.0, 2.0], [-0.5, 0.25]], dtype=torch.float64)
    expected = torch.sigmoid(e @ state["weight"].double() + state["bias"].double())
    assert torch.equal(clf.prob_desirable(e), expected)
