"""MMPO specifics: the identity L = −s_w, hand-derived values, the entropy ablation, and in-batch coupling."""

from __future__ import annotations

import math
import threading

import pytest
import torch

import prefzoo
from prefzoo.losses.mmpo import entropy_surrogate
from prefzoo.testing import shard_batch

F64 = torch.float64


def batch(pw, pl, rw, rl, **kw):
    t = lambda xs: torch.tensor(xs, dtype=F64)  # noqa: E731
    return prefzoo.PreferenceBatch(
        policy_chosen_logps=t(pw).requires_grad_(),
        policy_rejected_logps=t(pl).requires_grad_(),
        ref_chosen_logps=t(rw),
        ref_rejected_logps=t(rl),
        **kw,
    )


def test_hand_derived_listing_values():
    """One pair, β = 0.1, r_ε = 0.6, ε = 1e-6; worked by hand.

    R_w = 0.6 + 0.1·(−10) = −0.4,  R_l = 0.1 + 0.1·(−12) = −1.1;  min = −1.1, max = −0.4, denom = 0.7 + ε
    R̂_w = (0.7 + ε)/(0.7 + ε) = 1,  R̂_l = ε/(0.7 + ε)
    s_w = −5 + 1 = −4,  s_l = −6 + ε/(0.7+ε)
    L = −logsumexp(s_w, s_l) − log σ(s_w − s_l) = −s_w = 4
    """
    b = batch([-5.0], [-6.0], [-10.0], [-12.0])
    out = prefzoo.get_loss("mmpo")(b)
    eps = 1e-6
    s_l = -6 + eps / (0.7 + eps)
    assert out.chosen_rewards.item() == pytest.approx(-4.0, abs=1e-12)
    assert out.rejected_rewards.item() == pytest.approx(s_l, abs=1e-12)
    assert out.losses.item() == pytest.approx(4.0, abs=1e-12)
    no_aux = prefzoo.get_loss("mmpo-no-aux")(b).losses.item()
    assert no_aux == pytest.approx(-math.log(math.exp(-4.0) + math.exp(s_l)), abs=1e-12)


@pytest.mark.parametrize("beta", [0.0, 0.01, 0.5, 3.0])
@pytest.mark.parametrize("r_eps", [0.0, 0.6, 0.9])
def test_identity_loss_is_minus_chosen_score_and_gradient_is_nll(beta, r_eps):
    g = torch.Generator().manual_seed(int(beta * 100 + r_eps * 10))
    B = 7
    pw = -torch.rand(B, generator=g, dtype=F64) * 300
    pl = -torch.rand(B, generator=g, dtype=F64) * 300
    rw = -torch.rand(B, generator=g, dtype=F64) * 300
    rl = -torch.rand(B, generator=g, dtype=F64) * 300
    for name in ("mmpo", "mmpo-no-norm"):
        b = batch(pw.tolist(), pl.tolist(), rw.tolist(), rl.tolist())
        out = prefzoo.get_loss(name, beta=beta, reward_epsilon=r_eps)(b)
        torch.testing.assert_close(out.losses.detach(), -out.chosen_rewards, atol=1e-9, rtol=0)
        out.losses.sum().backward()
        torch.testing.assert_close(b.policy_chosen_logps.grad, -torch.ones(B, dtype=F64), atol=1e-12, rtol=0)
        torch.testing.assert_close(b.policy_rejected_logps.grad, torch.zeros(B, dtype=F64), atol=1e-12, rtol=0)


def test_no_aux_gradient_is_sigmoid_weighted():
    b = batch([-3.0, -9.0], [-4.0, -2.0], [-5.0, -5.0], [-6.0, -1.0])
    out = prefzoo.get_loss("mmpo-no-aux")(b)
    out.losses.sum().backward()
    d = out.chosen_rewards - out.rejected_rewards
    torch.testing.assert_close(-b.policy_chosen_logps.grad, torch.sigmoid(d))
    torch.testing.assert_close(-b.policy_rejected_logps.grad, torch.sigmoid(-d))


def test_entropy_ablation_value_and_gradient():
    T = 4
    g = torch.Generator().manual_seed(3)
    tw = -torch.rand(2, T, generator=g, dtype=F64)
    tl = -torch.rand(2, T, generator=g, dtype=F64)
    hw = torch.rand(2, T, generator=g, dtype=F64).requires_grad_()
    hl = torch.rand(2, T, generator=g, dtype=F64).requires_grad_()
    mw = torch.tensor([[1, 1, 1, 1], [1, 1, 0, 0]], dtype=torch.bool)
    ml = torch.tensor([[1, 1, 1, 0], [1, 1, 1, 1]], dtype=torch.bool)
    tw_ = tw.clone().requires_grad_()
    b = batch(
        [-3.0, -4.0],
        [-5.0, -6.0],
        [-3.0, -4.0],
        [-5.0, -6.0],
        policy_chosen_token_logps=tw_,
        policy_rejected_token_logps=tl,
        chosen_token_entropies=hw,
        rejected_token_entropies=hl,
        chosen_mask=mw,
        rejected_mask=ml,
    )
    out = prefzoo.get_loss("mmpo-entropy", beta=0.2)(b)
    base = prefzoo.get_loss("mmpo", beta=0.2)(b).losses
    H = 0.5 * ((hw * mw).sum(1) + (hl * ml).sum(1))
    torch.testing.assert_close(out.losses.detach(), (base - 0.2 * H).detach())
    out.losses.sum().backward()
    # ∂/∂H_t of −β·½(P2 + P1): −β/2 · (1 + 0) on real tokens (P1 holds H constant), 0 on padding
    torch.testing.assert_close(hw.grad, -0.1 * mw.to(F64))
    # ∂/∂log π(z_s) of −β/2·Σ_t log π(z_<t)·H_t = −β/2·Σ_{t>s} H_t on real tokens
    suffix = torch.flip(torch.cumsum(torch.flip(hw.detach() * mw, [1]), 1), [1]) - hw.detach() * mw
    torch.testing.assert_close(tw_.grad, -0.1 * suffix * mw)


def test_entropy_surrogate_value_is_token_entropy_sum():
    lp = torch.tensor([[-0.5, -1.0, -0.2]], dtype=F64)
    h = torch.tensor([[0.3, 0.4, 0.9]], dtype=F64)
    m = torch.tensor([[True, True, False]])
    assert entropy_surrogate(lp, h, m).item() == pytest.approx(0.7)


def _threaded_shards(name: str, shards: list[prefzoo.PreferenceBatch]) -> list[torch.Tensor]:
    """Run the loss on each shard in its own thread with an all-gather built from a barrier (rank order)."""
    n = len(shards)
    barrier = threading.Barrier(n)
    slots: list[list[torch.Tensor | None]] = [[None] * n]
    results: list[torch.Tensor | None] = [None] * n
    lock = threading.Lock()
    loss = prefzoo.get_loss(name)

    def worker(rank: int) -> None:
        calls = 0

        def gather(t: torch.Tensor) -> torch.Tensor:
            nonlocal calls
            with lock:
                while len(slots) <= calls:
                    slots.append([None] * n)
                slots[calls][rank] = t
            barrier.wait()
            out = torch.cat(slots[calls])  # type: ignore[arg-type]
            barrier.wait()
            calls += 1
            return out

        results[rank] = loss(shards[rank], gather=gather).losses.detach()

    threads = [threading.Thread(target=worker, args=(r,)) for r in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return results  # type: ignore[return-value]


@pytest.mark.parametrize("name", ["mmpo", "mmpo-no-aux", "mmpo-length-norm", "aot", "aot-unpaired"])
def test_gathered_shards_equal_full_batch(name):
    g = torch.Generator().manual_seed(0)
    B = 7
    v = lambda: (-torch.rand(B, generator=g, dtype=F64) * 80).tolist()  # noqa: E731
    lens = torch.randint(1, 40, (B,), generator=g)
    full = batch(v(), v(), v(), v(), chosen_lengths=lens, rejected_lengths=lens.flip(0))
    want = prefzoo.get_loss(name)(full).losses.detach()
    shards = shard_batch(full, [3, 1, 3])  # uneven shards, one of size 1: the library's own split of every field
    got = torch.cat(_threaded_shards(name, shards))
    torch.testing.assert_close(got, want, atol=1e-12, rtol=0)
    if name.startswith("mmpo"):  # without the gather each shard normalizes alone: the losses differ
        alone = torch.cat([prefzoo.get_loss(name)(s).losses.detach() for s in shards])
        assert not torch.allclose(alone, want)


def test_metrics_by_hand():
    """β = 1, r_ε = r_l = 0, ε = 0.  R_w = log π_ref(y_w) = (−1, −2), R_l = (−3, −5): min −5, max −1,
    R̂_w = (1, 0.75), R̂_l = (0.5, 0).  With log π_w = (−1, −2), log π_l = (−1, −1):
    s_w = (0, −1.25), s_l = (−0.5, −1),
    so mmpo/weight_chosen = (σ(0.5) + σ(−0.25))/2.  mmpo-entropy adds mmpo/entropy = mean of ½(ΣH_w + ΣH_l) over real
    positions: pair 0 ½(0.5 + 0.25 + 1.0) = 0.875, pair 1 ½(0.25 + 2.0) = 1.125, mean 1.0."""
    t = lambda *v: torch.tensor(v, dtype=torch.float64)  # noqa: E731
    kw = dict(beta=1.0, reward_epsilon=0.0, rejected_reward=0.0, norm_eps=0.0)
    mask = torch.tensor([[True, True], [True, False]])
    batch = prefzoo.PreferenceBatch(
        t(-1.0, -2.0), t(-1.0, -1.0), t(-1.0, -2.0), t(-3.0, -5.0),
        policy_chosen_token_logps=t([-0.5, -0.5], [-2.0, -9.0]),
        policy_rejected_token_logps=t([-1.0, 0.0], [-1.0, 0.0]),
        chosen_token_entropies=t([0.5, 0.25], [0.25, 7.0]), rejected_token_entropies=t([1.0, 3.0], [2.0, 3.0]),
        chosen_mask=mask, rejected_mask=torch.tensor([[True, False], [True, False]]),
    )
    want_w = (1 / (1 + math.exp(-0.5)) + 1 / (1 + math.exp(0.25))) / 2
    for name in ("mmpo", "mmpo-entropy"):
        out = prefzoo.get_loss(name, **kw)(batch)
        assert out.chosen_rewards.tolist() == [0.0, -1.25] and out.rejected_rewards.tolist() == [-0.5, -1.0]
        m = {k: float(v) for k, v in out.metrics.items()}
        want = {"mmpo/reward_min": -5.0, "mmpo/reward_max": -1.0, "mmpo/weight_chosen": want_w}
        if name == "mmpo-entropy":
            want["mmpo/entropy"] = 1.0
        assert m.keys() == want.keys(), m
        for k, v in want.items():
            assert m[k] == pytest.approx(v, abs=1e-15), k
    nn = prefzoo.get_loss("mmpo-no-norm", **kw)(batch).metrics
    assert set(nn) == {"mmpo/weight_chosen"}  # no normalization, no min and max
