"""The entropy estimator of `mmpo-entropy` (paper appendix): unbiased, exclusive prefix, masked, both completions.

1. Unbiased: a tiny autoregressive model with vocabulary V ≤ 4 and length T ≤ 4 lets us
   enumerate all V^T sequences in float64: the exact entropy H = −Σ_z π(z) log π(z) and its
   gradient by autograd, against Σ_z π(z)·∇[P1 + P2](z) with π(z) held constant.  Every
   sequence is right-padded by a ragged number of positions holding junk log-probs and
   entropies under a false mask, so an estimator that reads padding is biased.
2. Per sequence: P1 = Σ_t log π(z_<t) H_t uses the *exclusive* prefix, so
   ∂surrogate/∂log π(z_t) = Σ_{t'>t} H_t' over real positions (the inclusive prefix, also
   unbiased in expectation, adds H_t) and ∂surrogate/∂H_t = 1 (the pathwise P2).
3. The loss: `mmpo-entropy` = `mmpo` − w·½(Ĥ_w + Ĥ_l) on different chosen and rejected
   completions with ragged masks, Ĥ computed here independently of prefzoo.
"""

from __future__ import annotations

import itertools

import pytest
import torch
from hypothesis import given
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


def _pad_ragged(theta, tok, ent, seed: int, max_pad: int = 3):
    """Append ``max_pad`` masked-out positions holding junk that depends on θ (reading them changes the result)."""
    n, t = tok.shape
    g = torch.Generator().manual_seed(seed + 1)
    junk = theta.sum() * torch.rand(n, max_pad, generator=g, dtype=F64) - 1.0  # (N, P) depends on θ
    tok_p = torch.cat((tok, junk), dim=1)
    ent_p = torch.cat((ent, 2.0 + junk.abs()), dim=1)
    mask = torch.zeros(n, t + max_pad, dtype=torch.bool)
    mask[:, :t] = True
    return tok_p, ent_p, mask


def _check(v: int, t: int, seed: int, beta: float = 1.0) -> tuple[torch.Tensor, torch.Tensor]:
    theta = _model(v, t, seed)
    seqs = torch.tensor(list(itertools.product(range(v), repeat=t)))  # (V^T, T) every sequence
    tok, ent = _token_stats(theta, seqs)
    logp_seq = tok.sum(1)  # (N,)
    exact_h = -(logp_seq.exp() * logp_seq).sum()
    (exact,) = torch.autograd.grad(beta * exact_h, theta, retain_graph=True)
    tok_p, ent_p, mask = _pad_ragged(theta, tok, ent, seed)
    surrogate = entropy_surrogate(tok_p, ent_p, mask)  # (N,)
    weights = logp_seq.exp().detach()
    (estimated,) = torch.autograd.grad(beta * (weights * surrogate).sum(), theta)
    # the surrogate's value is Σ_t H_t, whose expectation is H (chain rule of entropy)
    torch.testing.assert_close((weights * surrogate.detach()).sum(), exact_h.detach(), rtol=1e-12, atol=1e-12)
    return exact, estimated


@given(v=st.integers(2, 4), t=st.integers(1, 4), seed=st.integers(0, 10_000), beta=st.floats(0.01, 3.0))
def test_expected_surrogate_gradient_is_exact_entropy_gradient(v, t, seed, beta):
    exact, estimated = _check(v, t, seed, beta)
    torch.testing.assert_close(estimated, exact, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("t", [1, 2, 4])
def test_enumeration_sizes(t):
    exact, estimated = _check(4, t, 11)
    torch.testing.assert_close(estimated, exact, rtol=1e-10, atol=1e-12)


def _ragged(draw, b: int, t: int) -> torch.Tensor:
    """A right-padded mask: row i has 1..t real positions, and at least one row is padded when t > 1."""
    lengths = draw(st.lists(st.integers(1, t), min_size=b, max_size=b))
    if t > 1 and min(lengths) == t:
        lengths[0] = t - 1
    return torch.arange(t)[None, :] < torch.tensor(lengths)[:, None]  # (B, T)


@st.composite
def token_rows(draw, t_min: int = 1):
    b, t = draw(st.integers(1, 4)), draw(st.integers(t_min, 6))
    vals = st.floats(-8.0, -0.01, allow_nan=False)
    tok = torch.tensor(draw(st.lists(vals, min_size=b * t, max_size=b * t)), dtype=F64).reshape(b, t)
    ent = torch.tensor(draw(st.lists(st.floats(0.0, 3.0), min_size=b * t, max_size=b * t)), dtype=F64).reshape(b, t)
    mask = _ragged(draw, b, t)
    return tok, ent + 0.1, mask  # H_t > 0, so every term shows in the gradient


@given(rows=token_rows())
def test_per_sequence_gradient_uses_the_exclusive_prefix_and_ignores_padding(rows):
    tok, ent, mask = (x.clone() for x in rows)
    tok.requires_grad_()
    ent.requires_grad_()
    s = entropy_surrogate(tok, ent, mask)
    g_tok, g_ent = torch.autograd.grad(s.sum(), [tok, ent])
    m = mask.to(F64)
    h = ent.detach() * m
    later = h.flip(1).cumsum(1).flip(1) - h  # Σ_{t'>t} H_t' over real positions: the exclusive prefix's weight
    torch.testing.assert_close(g_tok, later * m, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(g_ent, m, rtol=0, atol=0)  # P2 = Σ_t H_t over real positions only
    torch.testing.assert_close(s.detach(), h.sum(1), rtol=1e-12, atol=1e-12)  # value Σ_t H_t


def _surrogate_here(tok, ent, mask):
    """Ĥ written out: Σ_t H_t + Σ_t (Σ_{t'<t} log π_t')·H_t − (same, detached), real positions only."""
    out = []
    for i in range(tok.shape[0]):
        n = int(mask[i].sum())
        lp, h = tok[i, :n], ent[i, :n]
        prefix = torch.stack([lp[:k].sum() for k in range(n)]) if n else lp
        p1 = (prefix * h.detach()).sum()
        out.append(h.sum() + p1 - p1.detach())
    return torch.stack(out)


@given(rw=token_rows(t_min=2), rl=token_rows(t_min=2), beta=st.floats(0.0, 2.0),
       entropy_beta=st.one_of(st.none(), st.floats(0.0, 2.0)))
def test_mmpo_entropy_loss_subtracts_the_mean_of_both_completions_estimators(rw, rl, beta, entropy_beta):
    (tw, hw, mw), (tl, hl, ml) = rw, rl
    b = min(tw.shape[0], tl.shape[0])
    tw, hw, mw, tl, hl, ml = tw[:b], hw[:b], mw[:b], tl[:b], hl[:b], ml[:b]
    hl = hl + 0.5  # chosen and rejected entropies differ everywhere
    tw, tl, hw, hl = (x.clone().requires_grad_() for x in (tw, tl, hw, hl))
    zeros = torch.zeros(b, dtype=F64)
    batch = prefzoo.PreferenceBatch(
        (tw * mw).sum(1), (tl * ml).sum(1), zeros - 1.0, zeros - 2.0,
        policy_chosen_token_logps=tw, policy_rejected_token_logps=tl, chosen_token_entropies=hw,
        rejected_token_entropies=hl, chosen_mask=mw, rejected_mask=ml,
    )
    full = prefzoo.get_loss("mmpo-entropy", beta=beta, entropy_beta=entropy_beta)(batch).losses
    plain = prefzoo.get_loss("mmpo", beta=beta)(batch).losses
    w = beta if entropy_beta is None else entropy_beta
    want_h = 0.5 * (_surrogate_here(tw, hw, mw) + _surrogate_here(tl, hl, ml))  # (B,)
    torch.testing.assert_close(plain.detach() - full.detach(), w * want_h.detach(), rtol=1e-12, atol=1e-12)
    got = torch.autograd.grad((plain - full).sum(), [tw, tl, hw, hl], allow_unused=True)
    want = torch.autograd.grad((w * want_h).sum(), [tw, tl, hw, hl], allow_unused=True)
    for g, e in zip(got, want, strict=True):
        g = torch.zeros_like(e) if g is None and e is not None else g
        e = torch.zeros_like(g) if e is None and g is not None else e
        if g is not None:
            torch.testing.assert_close(g, e, rtol=1e-12, atol=1e-12)


def test_hand_derived_two_token_example():
    """z = (z_1, z_2), log π = (−1, −2), H = (0.5, 0.25), one padded junk position.

    Value Σ H_t = 0.75.  ∂/∂log π(z_1) = H_2 = 0.25 (the exclusive prefix of t = 2 is log π(z_1));
    ∂/∂log π(z_2) = 0 (no later position); ∂/∂H_t = 1, 1, and 0 for the padding.
    """
    tok = torch.tensor([[-1.0, -2.0, -7.0]], dtype=F64, requires_grad=True)
    ent = torch.tensor([[0.5, 0.25, 9.0]], dtype=F64, requires_grad=True)
    mask = torch.tensor([[True, True, False]])
    s = entropy_surrogate(tok, ent, mask)
    g_tok, g_ent = torch.autograd.grad(s.sum(), [tok, ent])
    assert float(s.detach()) == pytest.approx(0.75, abs=1e-15)
    assert g_tok.tolist() == [[0.25, 0.0, 0.0]]
    assert g_ent.tolist() == [[1.0, 1.0, 0.0]]
