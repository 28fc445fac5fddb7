"""Given float64 inputs, the fused module computes in float64: loss and gradients within 1e-12 of a float64
unfused computation (the reference's log-probs and the KL rows stay float64 too), so float64 oracles test the math."""

from __future__ import annotations

import pytest
import torch

from prefzoo.nn import FusedLinearPreferenceLoss
from prefzoo.nn.layout import build_batch, choose_shape
from tests.nn.test_fused_loss import make_rows

LABELS = torch.tensor([True, False, True, True, False, False])


def _unfused(w: torch.Tensor, x: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    logp = torch.log_softmax(x @ w.t(), dim=-1)  # (R, T, V) float64
    keep = target != -100
    return (logp.gather(-1, target.clamp(min=0).unsqueeze(-1)).squeeze(-1) * keep).sum(1)  # (R,)


@pytest.mark.parametrize("loss", ["dpo", "kto"])
@pytest.mark.parametrize("keep_bytes", [0, None])
def test_float64_inputs_are_computed_in_float64(loss: str, keep_bytes: int | None) -> None:
    w, x, ref_x, target = (t.double() if t.is_floating_point() else t for t in make_rows(6))
    module = FusedLinearPreferenceLoss(loss, keep_bytes=keep_bytes)
    extra = {"labels": LABELS, "kl_policy_logps": torch.full((6,), -30.0, dtype=torch.float64),
             "kl_ref_logps": torch.full((6,), -30.5, dtype=torch.float64)} if loss == "kto" else {}  # fmt: skip
    w1, x1 = w.clone().requires_grad_(), x.clone().requires_grad_()
    got, _ = module(w1, x1, target, ref_input=ref_x, **extra)
    got.backward()
    w2, x2 = w.clone().requires_grad_(), x.clone().requires_grad_()
    fields = {"policy_logps": _unfused(w2, x2, target), "lengths": (target != -100).sum(1),
              "ref_logps": _unfused(w, ref_x, target).detach(), **extra}  # fmt: skip
    shape, k = choose_shape(module.loss_fn.spec, 6, extra.get("labels"), None)
    want = module.loss_fn(build_batch(shape, k, fields)).losses.mean()
    want.backward()
    assert got.dtype == torch.float64
    torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-14)
    for name, a, b in (("weight", w1.grad, w2.grad), ("input", x1.grad, x2.grad)):
        torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-14, msg=lambda m, n=name: f"{n}: {m}")
