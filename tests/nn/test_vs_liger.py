"""prefzoo.nn gives Liger-Kernel's loss and gradients on the same inputs, where Liger is installed.

Liger's ``dpo``, ``simpo``, ``orpo`` and ``kto`` fused losses (its chunked pure-torch path, ``compiled=False``)
against ``FusedLinearPreferenceLoss`` with the prefzoo loss of the same formula: the same call for the pair losses;
Liger's KTO takes ``_input`` first and its KL estimate z₀ as one number, which prefzoo computes from the mismatched
pairs' log-probs (here chosen so that their mean is that number).
"""

from __future__ import annotations

from typing import Any

import pytest
import torch

from prefzoo.nn import FusedLinearPreferenceLoss
from tests.nn.test_fused_loss import make_rows

chunked = pytest.importorskip("liger_kernel.chunked_loss")

PAIRS = [
    ("dpo", {"beta": 0.1}, "LigerFusedLinearDPOLoss", {"beta": 0.1}),
    ("simpo", {"beta": 2.0, "gamma_beta_ratio": 0.25}, "LigerFusedLinearSimPOLoss",
     {"beta": 2.0, "gamma": 0.5, "compute_nll_loss": False}),
    ("orpo", {"beta": 0.2, "nll_reduction": "batch-tokens"}, "LigerFusedLinearORPOLoss", {"beta": 0.2}),
    ("1*dpo + 0.5*sft", {"beta": 0.1, "sft.nll_reduction": "batch-tokens"}, "LigerFusedLinearDPOLoss",
     {"beta": 0.1, "compute_nll_loss": True, "alpha": 0.5}),  # Liger's NLL term: a weighted sum with sft
]  # fmt: skip


def _leaves(*ts: torch.Tensor) -> list[torch.Tensor]:
    return [t.clone().requires_grad_() for t in ts]


def _compare(ours: tuple[Any, ...], theirs: tuple[Any, ...]) -> None:
    (loss_a, a), (loss_b, b) = ours, theirs
    torch.testing.assert_close(loss_a, loss_b, rtol=1e-5, atol=1e-6)
    torch.autograd.backward([loss_a, loss_b])
    for name, x, y in zip(("weight", "input"), a, b, strict=True):
        assert x.grad is not None and y.grad is not None and float(x.grad.abs().sum()) > 0
        torch.testing.assert_close(x.grad, y.grad, rtol=1e-4, atol=1e-6, msg=lambda m, n=name: f"{n}: {m}")


@pytest.mark.parametrize(("loss", "params", "liger", "liger_params"), PAIRS, ids=["dpo", "simpo", "orpo", "dpo+nll"])
def test_pair_losses_equal_ligers(loss, params, liger, liger_params) -> None:
    w, x, ref_x, target = make_rows(6, t=16, h=12)
    ref = {"ref_input": ref_x, "ref_weight": w + 0.05} if "dpo" in loss else {}
    ours = _leaves(w, x)
    got, _ = FusedLinearPreferenceLoss(loss, **params)(ours[0], ours[1], target, **ref)
    theirs = _leaves(w, x)
    module = getattr(chunked, liger)(compiled=False, **liger_params)
    refs = (None, ref_x, w + 0.05) if ref else ()  # Liger's SimPO and ORPO take no reference arguments
    want = module(theirs[0], theirs[1], target, *refs)[0]
    _compare((got, ours), (want, theirs))


def test_kto_equals_ligers() -> None:
    w, x, ref_x, target = make_rows(6, t=16, h=12)
    labels = torch.tensor([True, False, True, True, False, False])
    z0 = 0.7
    kl_policy = torch.linspace(-40.0, -30.0, 6)  # mean(kl_policy − kl_ref) = z0
    ours = _leaves(w, x)
    got, _ = FusedLinearPreferenceLoss("kto", beta=0.3)(
        ours[0], ours[1], target, ref_input=ref_x, labels=labels, kl_policy_logps=kl_policy,
        kl_ref_logps=kl_policy - z0,
    )  # fmt: skip
    theirs = _leaves(w, x)
    module = chunked.LigerFusedLinearKTOLoss(beta=0.3, use_ref_model=True, compiled=False)
    want = module(theirs[1], theirs[0], target, None, labels, ref_x, w, None, torch.tensor(z0))
    _compare((got, ours), (want[0] if isinstance(want, tuple) else want, theirs))
