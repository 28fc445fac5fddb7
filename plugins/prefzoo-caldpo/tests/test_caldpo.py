"""Tests of the Cal-DPO plugin: registration through its entry point and hand-derived values."""

from __future__ import annotations

import math
import subprocess
import sys

import pytest
import torch

import prefzoo


def _batch(pw, pl, rw, rl):
    t = lambda xs: torch.tensor(xs, dtype=torch.float64, requires_grad=True)  # noqa: E731
    return prefzoo.PreferenceBatch(
        policy_chosen_logps=t(pw),
        policy_rejected_logps=t(pl),
        ref_chosen_logps=torch.tensor(rw, dtype=torch.float64),
        ref_rejected_logps=torch.tensor(rl, dtype=torch.float64),
    )


def test_registered_through_entry_point():
    prefzoo.reset_registry()
    spec = prefzoo.loss_spec("cal-dpo")
    assert spec.plugin == "caldpo"  # the entry-point name, not a built-in module
    assert "cal-dpo" in prefzoo.list_losses()


def test_hand_derived_value_at_reference():
    # ρ_w = ρ_l = 0: −log σ(0) + (1/(2β))² + (1/(2β))² = log 2 + 2·25 for β = 0.1
    loss = prefzoo.get_loss("cal-dpo", beta=0.1)
    out = loss(_batch([-5.0], [-7.0], [-5.0], [-7.0]))
    assert out.losses.item() == pytest.approx(math.log(2) + 50.0, abs=1e-12)


def test_hand_derived_gradient():
    # ρ_w = 1, ρ_l = −1, β = 0.5 (target 1): dL/dρ_w = −σ(−2) + 0 ; dL/dρ_l = σ(−2) + 0
    b = _batch([0.0], [-3.0], [-1.0], [-2.0])
    out = prefzoo.get_loss("cal-dpo", beta=0.5)(b)
    out.losses.sum().backward()
    s = 1 / (1 + math.exp(2.0))
    assert b.policy_chosen_logps.grad.item() == pytest.approx(-s, abs=1e-12)
    assert b.policy_rejected_logps.grad.item() == pytest.approx(s, abs=1e-12)


def test_bad_beta_names_the_parameter():
    with pytest.raises(prefzoo.LossParamError, match="beta"):
        prefzoo.get_loss("cal-dpo", beta=0.0)


def test_shown_by_cli():
    out = subprocess.run([sys.executable, "-m", "prefzoo", "losses"], capture_output=True, text=True, check=True)
    row = next(line for line in out.stdout.splitlines() if line.startswith("cal-dpo"))
    assert "plugin" in row and "caldpo" in row
