"""The MMPO identity: −logsumexp(s_w, s_l) − log σ(s_w − s_l) = −s_w exactly, so ∇L = −∇log π(y_w).

The gradient with respect to the policy log-probs is (−1, 0) per pair for every β,
r_ε, reference and rejected response (−1/|y_w| for the length-normalized ablation).
"""

from __future__ import annotations

import torch
from hypothesis import given

import prefzoo
from prefzoo.testing import loss_params, preference_batches
from tests.properties._helpers import leaves64, mmpo_scores


def _check(name: str, batch, params, average: bool = False, normalize: bool = True) -> None:
    b = leaves64(batch)
    out = prefzoo.Loss(prefzoo.loss_spec(name), params)(b)
    s_w, _ = mmpo_scores(b, params, average=average, normalize=normalize)
    mag = 1 + max(float(t.abs().max()) for t in (b.policy_chosen_logps.detach(), b.policy_rejected_logps.detach(), s_w))
    tol = 16 * 2.0**-53 * mag  # float64 rounding of logsumexp at scores of size |s|
    torch.testing.assert_close(out.losses.detach(), -s_w, rtol=1e-12, atol=1e-9)
    gw, gl = torch.autograd.grad(out.losses.sum(), [b.policy_chosen_logps, b.policy_rejected_logps])
    want = -1 / b.chosen_lengths.to(gw.dtype) if average else -torch.ones_like(gw)
    torch.testing.assert_close(gw, want, rtol=1e-9, atol=tol)
    torch.testing.assert_close(gl, torch.zeros_like(gl), rtol=0, atol=tol)


@given(batch=preference_batches(dtypes=("float64",), reference=True), params=loss_params(prefzoo.loss_spec("mmpo")))
def test_mmpo_is_minus_chosen_score(batch, params):
    _check("mmpo", batch, params)


@given(batch=preference_batches(dtypes=("float64",), reference=True),
       params=loss_params(prefzoo.loss_spec("mmpo-no-norm")))
def test_mmpo_no_norm_is_minus_chosen_score(batch, params):
    _check("mmpo-no-norm", batch, params, normalize=False)


@given(batch=preference_batches(dtypes=("float64",), reference=True, lengths=True),
       params=loss_params(prefzoo.loss_spec("mmpo-length-norm")))
def test_mmpo_length_norm_gradient_is_per_token_nll(batch, params):
    _check("mmpo-length-norm", batch, params, average=True)


@given(batch=preference_batches(dtypes=("float64",), reference=True),
       p1=loss_params(prefzoo.loss_spec("mmpo")), p2=loss_params(prefzoo.loss_spec("mmpo")))
def test_gradient_is_the_same_for_every_params_reference_and_rejected(batch, p1, p2):
    """Two param draws, and a second batch with another reference and rejected response: identical gradients."""
    b1 = leaves64(batch)
    other = batch.replace(ref_chosen_logps=batch.ref_rejected_logps.flip(0), ref_rejected_logps=batch.ref_chosen_logps,
                          policy_rejected_logps=batch.policy_rejected_logps.flip(0))
    b2 = leaves64(other)
    spec = prefzoo.loss_spec("mmpo")
    g1 = torch.autograd.grad(prefzoo.Loss(spec, p1)(b1).losses.sum(), b1.policy_chosen_logps)[0]
    g2 = torch.autograd.grad(prefzoo.Loss(spec, p2)(b2).losses.sum(), b2.policy_chosen_logps)[0]
    torch.testing.assert_close(g1, g2, rtol=0, atol=1e-11)
