"""prefzoo.nn's Liger classes: ``loss=`` puts any prefzoo loss behind them, KTO's ``kl`` is taken as given, and a
loss of the wrong kind or a bad argument is a one-line error.  (Their agreement with Liger itself: Liger-Kernel's own
tests, run by ``tox -e liger`` through tests/liger/liger_suite.py.)"""

from __future__ import annotations

import pytest
import torch

from prefzoo.nn import (
    FusedInputError,
    FusedLinearPreferenceLoss,
    LigerFusedLinearCPOLoss,
    LigerFusedLinearDPOLoss,
    LigerFusedLinearKTOLoss,
    LigerFusedLinearORPOLoss,
    LigerFusedLinearSimPOLoss,
    fused_sequence_logps,
)
from prefzoo.registry import get_loss
from tests.nn.test_fused_loss import make_rows

LABELS = torch.tensor([True, False, True, True, False, False])


def _grad_of(fn, w: torch.Tensor, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    w, x = w.clone().requires_grad_(), x.clone().requires_grad_()
    loss = fn(w, x)
    loss.backward()
    return loss.detach(), w.grad, x.grad


@pytest.mark.parametrize("loss", ["0.8*dpo + 0.2*bco-pair", "ipo", get_loss("dpo", modifiers=["ld-dpo"], beta=0.2)],
                         ids=["sum", "ipo", "ld-dpo"])  # fmt: skip
def test_loss_argument_is_the_native_modules_loss(loss) -> None:
    """Liger's DPO class with ``loss=`` computes what FusedLinearPreferenceLoss computes with that loss."""
    w, x, ref_x, target = make_rows(6)
    ours = LigerFusedLinearDPOLoss(loss=loss)
    native = FusedLinearPreferenceLoss(loss)
    a = _grad_of(lambda w, x: ours(w, x, target, None, ref_x, w.detach())[0], w, x)
    b = _grad_of(lambda w, x: native(w, x, target, None, ref_x, w.detach())[0], w, x)
    for got, want in zip(a, b, strict=True):
        torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-7)


def test_kto_kl_is_taken_as_given() -> None:
    """L = mean(1 − σ(β·s·(ρ − kl))), s = ±1 by label, a negative kl included (prefzoo's kto would clamp it at 0)."""
    w, x, ref_x, target = make_rows(6)
    kl = -0.7
    loss, out = LigerFusedLinearKTOLoss(beta=0.3, use_ref_model=True)(x, w, target, None, LABELS, ref_x, w, None,
                                                                        torch.tensor([kl]))  # fmt: skip
    rho = fused_sequence_logps(w, x, target) - fused_sequence_logps(w, ref_x, target)
    sign = torch.where(LABELS, 1.0, -1.0)
    torch.testing.assert_close(loss, (1 - torch.sigmoid(0.3 * sign * (rho - kl))).mean(), rtol=1e-6, atol=1e-7)
    torch.testing.assert_close(out[4], (0.3 * rho)[LABELS].sum(), rtol=1e-6, atol=1e-6)  # rewards: β·ρ, unshifted


def test_kto_with_prefzoos_kto_clamps_as_trl() -> None:
    """``loss="kto"``: kl is the KL rows' mean, clamped at 0 as TRL's KTOTrainer does."""
    w, x, ref_x, target = make_rows(6)
    ours = LigerFusedLinearKTOLoss(use_ref_model=True, loss="kto")
    got, _ = ours(x, w, target, None, LABELS, ref_x, w, None, torch.tensor(-0.5))
    zero, _ = ours(x, w, target, None, LABELS, ref_x, w, None, torch.tensor(0.0))
    torch.testing.assert_close(got, zero)


def test_average_log_prob_is_the_per_token_mean() -> None:
    """DPO with ``average_log_prob`` is prefzoo's sigmoid-norm (DPO on per-token averaged log-ratios)."""
    w, x, ref_x, target = make_rows(6)
    ours = LigerFusedLinearDPOLoss(beta=0.5, average_log_prob=True)
    native = FusedLinearPreferenceLoss("sigmoid-norm", beta=0.5)
    a = _grad_of(lambda w, x: ours(w, x, target, None, ref_x, w.detach())[0], w, x)
    b = _grad_of(lambda w, x: native(w, x, target, None, ref_x, w.detach())[0], w, x)
    for got, want in zip(a, b, strict=True):
        torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize(("build", "message"), [
    (lambda: LigerFusedLinearKTOLoss(loss="dpo"), "takes a loss on unpaired rows"),
    (lambda: LigerFusedLinearSimPOLoss(loss="kto"), "takes a loss on pairs"),
    (lambda: LigerFusedLinearDPOLoss(loss_type="ipo"), "Unsupported loss_type"),
    (lambda: LigerFusedLinearDPOLoss(loss_type="exo_pair"), "label_smoothing must be > 0"),
    (lambda: LigerFusedLinearCPOLoss(label_smoothing=0.7), "label_smoothing"),
])  # fmt: skip
def test_bad_construction_is_one_line(build, message) -> None:
    with pytest.raises(ValueError, match=message) as e:
        build()
    assert "\n" not in str(e.value)


def test_bad_calls_are_one_line() -> None:
    w, x, _, target = make_rows(6)
    with pytest.raises(FusedInputError, match="preference_labels is required"):
        LigerFusedLinearKTOLoss()(x, w, target)
    with pytest.raises(FusedInputError, match="stack chosen rows over rejected rows"):
        LigerFusedLinearORPOLoss()(w, x[:5], target[:5])
    with pytest.raises(FusedInputError, match="kl must be one number or one per row"):
        LigerFusedLinearKTOLoss()(x, w, target, None, LABELS, kl=torch.zeros(4))
    with pytest.raises(FusedInputError, match="compares with no reference point"):
        LigerFusedLinearKTOLoss(loss="bco")(x, w, target, None, LABELS, kl=0.1)
