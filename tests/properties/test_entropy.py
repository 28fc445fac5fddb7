"""The entropy estimator of `mmpo-entropy` (paper appendix) is unbiased: E_z[∇ surrogate(z)] = ∇ H(π(·|x)).

A tiny autoregressive model with vocabulary V ≤ 4 and length T ≤ 4 lets us enumerate
all V^T sequences in float64: the exact entropy H = −Σ_z π(z) log π(z) and its gradient
by autograd, against Σ_z π(z)·∇[P1 + P2](z) with π(z) held constant.
"""

from __future__ import annotations

import itertools

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import prefzoo
from prefzoo.losses.mmpo import entropy_surrogate

F64 = torch.float64


def _model(v: int, t: int, seed: int) -> torch.Tensor:
    """θ[t, prev, :] are the logits of token t given the previous token (prev = v for the start)."""
    g = torch.Generator().manual_seed(seed)
    return (2 * torch.randn(t, v + 1, v, generator=g, dtype=F64)).requires_grad_()


def _token_stats(theta: torch.Tensor, seqs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-token log π(z_t | z_<t) and H(π(·|z_<t)) for every sequence: (N, T) each."""
    n, t = seqs.shape
    v = theta.shape[-1]
    prev = torch.cat((torch.full((n, 1), v), seqs[:, :-1]), dim=1)  # (N, T)
    logits = theta[torch.arange(t)[None, :], prev]  # (N, T, V)
    logp = torch.log_softmax(logits, dim=-1)
    tok = logp.gather(2, seqs[..., None])[..., 0]  # (N, T)
    ent = -(logp.exp() * logp).sum(-1)  # (N, T)
    return tok, ent


def _check(v: int, t: int, seed: int, beta: float = 1.0) -> tuple[torch.Tensor, torch.Tensor]:
    theta = _model(v, t, seed)
    seqs = torch.tensor(list(itertools.product(range(v), repeat=t)))  # (V^T, T) every sequence
    tok, ent = _token_stats(theta, seqs)
    logp_seq = tok.sum(1)  # (N,)
    exact_h = -(logp_seq.exp() * logp_seq).sum()
    (exact,) = torch.autograd.grad(beta * exact_h, theta, retain_graph=True)
    mask = torch.ones_like(tok, dtype=torch.bool)
    surrogate = entropy_surrogate(tok, ent, mask)  # (N,)
    weights = logp_seq.exp().detach()
    (estimated,) = torch.autograd.grad(beta * (weights * surrogate).sum(), theta)
    # the surrogate's value is Σ_t H_t, whose expectation is H (chain rule of entropy)
    torch.testing.assert_close((weights * surrogate.detach()).sum(), exact_h.detach(), rtol=1e-12, atol=1e-12)
    return exact, estimated


@settings(max_examples=25)
@given(v=st.integers(2, 4), t=st.integers(1, 4), seed=st.integers(0, 10_000), beta=st.floats(0.01, 3.0))
def test_expected_surrogate_gradient_is_exact_entropy_gradient(v, t, seed, beta):
    exact, estimated = _check(v, t, seed, beta)
    torch.testing.assert_close(estimated, exact, rtol=1e-10, atol=1e-12)


def test_pathwise_term_alone_is_biased():
    """Dropping the score-function term P1 gives a different gradient: the test can fail."""
    v, t = 3, 3
    theta = _model(v, t, 7)
    seqs = torch.tensor(list(itertools.product(range(v), repeat=t)))
    tok, ent = _token_stats(theta, seqs)
    logp_seq = tok.sum(1)
    (exact,) = torch.autograd.grad(-(logp_seq.exp() * logp_seq).sum(), theta, retain_graph=True)
    (p2_only,) = torch.autograd.grad((logp_seq.exp().detach() * ent.sum(1)).sum(), theta)
    assert float((p2_only - exact).abs().max()) > 1e-3


def test_mmpo_entropy_loss_uses_the_estimator():
    """The loss subtracts β·½(Ĥ_w + Ĥ_l); its gradient through the entropies is the surrogate's."""
    v, t = 2, 3
    theta = _model(v, t, 3)
    seqs = torch.tensor(list(itertools.product(range(v), repeat=t)))
    tok, ent = _token_stats(theta, seqs)
    n = seqs.shape[0]
    mask = torch.ones(n, t, dtype=torch.bool)
    zeros = torch.zeros(n, dtype=F64)
    batch = prefzoo.PreferenceBatch(tok.sum(1), tok.sum(1).flip(0), zeros, zeros, policy_chosen_token_logps=tok,
                                    policy_rejected_token_logps=tok, chosen_token_entropies=ent,
                                    rejected_token_entropies=ent, chosen_mask=mask, rejected_mask=mask)
    full = prefzoo.get_loss("mmpo-entropy", beta=0.5)(batch).losses
    plain = prefzoo.get_loss("mmpo", beta=0.5)(batch).losses
    torch.testing.assert_close(plain - full, 0.5 * entropy_surrogate(tok, ent, mask))


@pytest.mark.parametrize("t", [1, 2, 4])
def test_enumeration_sizes(t):
    exact, estimated = _check(4, t, 11)
    torch.testing.assert_close(estimated, exact, rtol=1e-10, atol=1e-12)
