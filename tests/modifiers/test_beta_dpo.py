"""β-DPO's running margin statistics: against a transcription of the authors' code, a hand case, and its properties.

The transcription is junkangwu/beta-DPO trainers.py (``update_and_sync_tensor_mean``, γ = 0.9, then
``preference_loss`` with ``mode_loss="beta_DPO"``, and the masked mean of ``get_batch_metrics``), over several
training steps.  Its ``torch.multinomial`` draw is replaced by prefzoo's sampler (checked separately against
``torch.multinomial`` in distribution), so both sides train on the same pairs.
"""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch
import torch.nn.functional as F

import prefzoo
from prefzoo.modifiers.margins import beta_dpo_sample
from prefzoo.testing import shard_batch
from prefzoo.testing.sharding import run_threads
from prefzoo.types import PreferenceBatch
from tests.modifiers.test_transcriptions import DTYPES, _batch, _compare, _f64, _prefzoo_batch

F64 = torch.float64


class AuthorsBetaDPO:
    """trainers.py of the β-DPO authors, transcribed (one process: all_gather_if_needed is the identity)."""

    def __init__(self, beta: float, a: float, mode_weight: float, gamma: float = 0.9) -> None:
        self.beta, self.a, self.mode_weight, self.gamma = beta, a, mode_weight, gamma
        self.gap_mean = torch.zeros(1, dtype=F64)
        self.gap_std = torch.zeros(1, dtype=F64)
        self.steps = 0

    def update_and_sync_tensor_mean(self, gap_local):
        with torch.no_grad():
            self.gap_mean.mul_(self.gamma).add_(gap_local.mean(), alpha=1 - self.gamma)
            self.gap_std.mul_(self.gamma).add_(gap_local.std(), alpha=1 - self.gamma)

    def __call__(self, pc, pr, rc, rr, seed=0):
        gap_local = (pc - rc - pr + rr).detach()
        self.update_and_sync_tensor_mean(gap_local)
        self.steps += 1
        logits = (pc - pr) - (rc - rr)
        A = (pc - rc - pr + rr).detach()
        mean, std = self.gap_mean, self.gap_std
        sample_num = int(A.numel() * (1 - self.mode_weight))
        # the authors: torch.multinomial(exp(-0.5 * ((A - mean) / std) ** 2), sample_num, replacement=False)
        drawn = beta_dpo_sample(A, mean[0], std[0], sample_num, seed, self.steps)
        sample_index = torch.nonzero(drawn)[:, 0]
        one_hot_like = torch.zeros_like(A)
        one_hot_like[sample_index] = 1
        global_mask = one_hot_like.detach()
        A_used = torch.mean(A[sample_index])
        beta_used = self.beta * (1 + self.a * (A_used - self.gap_mean))
        beta_used = beta_used.clamp(min=1e-3)
        losses = -F.logsigmoid(beta_used.detach() * logits)
        self.last_beta = float(beta_used)
        # get_batch_metrics returns masked_losses.sum() / count: per pair, losses · mask · N / count
        return losses * global_mask * (A.numel() / global_mask.sum())


def _steps(dtype, n_steps=3):
    return [_batch(dtype, seed=20 + s, b=8) for s in range(n_steps)]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("rho", [1.0, 0.5])
def test_beta_dpo_equals_the_authors_code_over_steps(dtype, rho):
    loss = prefzoo.get_loss("dpo", beta=0.5, modifiers=[f"beta-dpo:alpha=0.2,filter_fraction={rho},seed=3"])
    theirs = AuthorsBetaDPO(beta=0.5, a=0.2, mode_weight=1 - rho)
    for x in _steps(dtype):
        out = loss(_prefzoo_batch(x))
        x64 = _f64(x)
        want = theirs(x64["pw"].sum(-1), x64["pl"].sum(-1), x64["rw"].sum(-1), x64["rl"].sum(-1), seed=3)
        assert theirs.last_beta > 2e-3  # neither side's floor on β is active
        _compare(out.losses, want, x, x64, dtype)
        tol = 1e-12 if dtype == F64 else 1e-5
        assert float(out.metrics["beta-dpo/beta"]) == pytest.approx(theirs.last_beta, rel=tol)
        st = loss.state
        assert float(st["beta-dpo.margin_mean"]) == pytest.approx(float(theirs.gap_mean), rel=tol, abs=tol)
        assert float(st["beta-dpo.margin_std"]) == pytest.approx(float(theirs.gap_std), rel=tol, abs=tol)
    assert 0 < float(out.metrics["beta-dpo/kept"]) <= 1
    if rho < 1:
        assert int((out.losses != 0).sum()) == 4  # ⌊0.5·8⌋ pairs trained on


def _pairs(deltas):
    d = torch.tensor(deltas, dtype=F64)
    z = torch.zeros_like(d)
    return PreferenceBatch(policy_chosen_logps=d.clone().requires_grad_(), policy_rejected_logps=z,
                           ref_chosen_logps=z, ref_rejected_logps=z)  # fmt: skip


def test_hand_derived_running_margin():
    # β₀ = 1, α = 0.5, m = 0.5, no filtering, margins Δ = (2, 0): mean 1, unbiased std √2.
    # step 1: M₀ = 0.5·0 + 0.5·1 = 0.5, β = 1 + 0.5·(1 − 0.5) = 1.25: L = (−log σ(2.5), log 2)
    # step 2: M₀ = 0.75, β = 1.125: L = (−log σ(2.25), log 2);  σ = 0.5·(0.5·√2) + 0.5·√2 = 0.75·√2
    # evaluation: M₀ stays 0.75, β = 1.125
    loss = prefzoo.get_loss("dpo", beta=1.0, modifiers=["beta-dpo:alpha=0.5,momentum=0.5,filter_fraction=1"])
    got = loss(_pairs([2.0, 0.0])).losses.tolist()
    assert got == pytest.approx([math.log1p(math.exp(-2.5)), math.log(2)], rel=1e-12)
    got = loss(_pairs([2.0, 0.0])).losses.tolist()
    assert got == pytest.approx([math.log1p(math.exp(-2.25)), math.log(2)], rel=1e-12)
    assert float(loss.state["beta-dpo.margin_mean"]) == 0.75
    assert float(loss.state["beta-dpo.margin_std"]) == pytest.approx(0.75 * math.sqrt(2), rel=1e-15)
    with torch.no_grad():
        out = loss(_pairs([2.0, 0.0]))
    assert out.losses.tolist() == pytest.approx([math.log1p(math.exp(-2.25)), math.log(2)], rel=1e-12)
    assert float(loss.state["beta-dpo.margin_mean"]) == 0.75 and float(loss.state["beta-dpo.steps"]) == 2


def test_filtering_trains_on_the_mean_over_the_drawn_pairs():
    """⌊ρN⌋ pairs keep their loss at β_batch, scaled by N/⌊ρN⌋; the others get 0; evaluation keeps every pair."""
    x = _pairs([3.0, -1.0, 0.5, 0.25, 2.0, -0.5, 1.0])
    loss = prefzoo.get_loss("dpo", beta=1.0, modifiers=["beta-dpo:alpha=0.3,filter_fraction=0.6"])
    out = loss(x)
    kept = out.losses != 0
    assert int(kept.sum()) == 4  # ⌊0.6·7⌋
    beta = float(out.metrics["beta-dpo/beta"])
    plain = -F.logsigmoid(beta * x.policy_chosen_logps.detach())
    torch.testing.assert_close(out.losses.detach()[kept], plain[kept] * 7 / 4, rtol=1e-12, atol=0)
    d = x.policy_chosen_logps.detach()
    m0 = float(loss.state["beta-dpo.margin_mean"])
    assert beta == pytest.approx(1 + 0.3 * (float(d[kept].mean()) - m0), rel=1e-12)  # from the drawn pairs only
    with torch.no_grad():
        assert bool((loss(x).losses > 0).all())


def test_sampler_draws_as_torch_multinomial_without_replacement():
    """Inclusion frequencies of the Gumbel top-k equal those of the authors' torch.multinomial(w, k, False)."""
    m = torch.tensor([0.0, 0.5, -1.0, 2.0, 1.0], dtype=F64)
    mean, std = torch.tensor(0.3, dtype=F64), torch.tensor(0.8, dtype=F64)
    w = torch.exp(-0.5 * ((m - mean) / std) ** 2)
    draws = 4000
    ours = torch.stack([beta_dpo_sample(m, mean, std, 2, seed=0, step=s) for s in range(draws)]).double().mean(0)
    g = torch.Generator().manual_seed(0)
    theirs = torch.zeros(5, dtype=F64)
    for _ in range(draws):
        theirs[torch.multinomial(w, 2, replacement=False, generator=g)] += 1 / draws
    torch.testing.assert_close(ours, theirs, atol=0.035, rtol=0)  # 4σ of a frequency over 4000 draws
    assert float(ours[3]) < 0.2 < float(ours[0])  # the far outlier M = 2 is rarely drawn, M = 0 often


def test_sampler_is_a_function_of_seed_and_step():
    m = torch.linspace(-2, 2, 9, dtype=F64)
    one, std = torch.tensor(0.0, dtype=F64), torch.tensor(1.0, dtype=F64)
    a = beta_dpo_sample(m, one, std, 4, seed=1, step=5)
    assert torch.equal(a, beta_dpo_sample(m, one, std, 4, seed=1, step=5)) and int(a.sum()) == 4
    others = [beta_dpo_sample(m, one, std, 4, seed=s, step=t) for s, t in ((1, 6), (2, 5), (0, 1))]
    assert any(not torch.equal(a, o) for o in others)
    uniform = beta_dpo_sample(m, one, torch.tensor(0.0, dtype=F64), 4, seed=0, step=1)  # σ = 0: uniform, no NaN
    assert int(uniform.sum()) == 4
    tiny = beta_dpo_sample(m * 1e3, one, std, 4, seed=0, step=1)  # every weight underflows: still 4 drawn
    assert int(tiny.sum()) == 4


def _run(loss, batches, gather=None):
    return [loss(b, gather=gather) for b in batches]


def _batches(n_steps=4, n=9):
    g = torch.Generator().manual_seed(7)
    return [_pairs((2 * torch.randn(n, generator=g, dtype=F64) + 0.3 * s).tolist()) for s in range(n_steps)]


def test_state_dict_resume_is_bit_exact():
    mods = ["beta-dpo:alpha=0.4,filter_fraction=0.5"]
    batches = _batches()
    whole = prefzoo.get_loss("dpo", modifiers=mods)
    want = [o.losses.detach() for o in _run(whole, batches)]
    first = prefzoo.get_loss("dpo", modifiers=mods)
    _run(first, batches[:2])
    saved = first.state_dict()
    assert set(saved) == {"beta-dpo.margin_mean", "beta-dpo.margin_std", "beta-dpo.steps"}
    resumed = prefzoo.get_loss("dpo", modifiers=mods)
    resumed.load_state_dict(saved)
    got = [o.losses.detach() for o in _run(resumed, batches[2:])]
    for a, b in zip(got, want[2:], strict=True):
        assert torch.equal(a, b)
    fresh = [o.losses.detach() for o in _run(prefzoo.get_loss("dpo", modifiers=mods), batches[2:])]
    assert not all(torch.equal(a, b) for a, b in zip(fresh, want[2:], strict=True))  # the state matters


def test_checkpoint_restores_the_running_margin(tmp_path):
    pytest.importorskip("accelerate")
    from prefzoo.train.checkpoint import load_loss_state, save_loss_state

    loss = prefzoo.get_loss("dpo", modifiers=["beta-dpo:filter_fraction=0.5"])
    batches = _batches()
    _run(loss, batches[:2])
    save_loss_state(loss, tmp_path)
    after = [o.losses.detach() for o in _run(loss, batches[2:])]
    load_loss_state(loss, tmp_path)
    again = [o.losses.detach() for o in _run(loss, batches[2:])]
    assert all(torch.equal(a, b) for a, b in zip(after, again, strict=True))


@pytest.mark.parametrize("sizes", [[1, 8], [4, 2, 3]])
def test_sharded_steps_equal_one_process(sizes):
    """Each rank its own bound loss (its own state), the gather hook: every step equals one process on the batch."""
    mods = ["beta-dpo:alpha=0.4,filter_fraction=0.5,seed=2"]
    batches = _batches()
    one = prefzoo.get_loss("dpo", modifiers=mods)
    want = [o.losses.detach() for o in _run(one, batches)]
    ranks = [prefzoo.get_loss("dpo", modifiers=mods) for _ in sizes]
    for b, w in zip(batches, want, strict=True):
        shards = shard_batch(b, sizes)
        outs = run_threads(lambda rank, ex, sh=shards: ranks[rank](sh[rank], gather=lambda t: ex.gather(rank, t)),
                           len(sizes))  # fmt: skip
        torch.testing.assert_close(torch.cat([o.losses.detach() for o in outs]), w, atol=1e-14, rtol=0)
    for r in ranks:
        for k, v in one.state.items():
            assert torch.equal(r.state[k], v), k
    alone = prefzoo.get_loss("dpo", modifiers=mods)  # a rank without the gather: other statistics
    _run(alone, [shard_batch(b, sizes)[-1] for b in batches])
    assert float(alone.state["beta-dpo.margin_mean"]) != float(one.state["beta-dpo.margin_mean"])


def test_called_without_state_is_a_one_line_error():
    from prefzoo.modifiers.margins import BetaDPOParams, beta_dpo
    from prefzoo.types import LossContext

    spec = prefzoo.loss_spec("dpo")
    with pytest.raises(prefzoo.PreferenceBatchError, match=r"through prefzoo\.Loss"):
        beta_dpo(lambda b, p: None, _pairs([1.0]), BetaDPOParams(), spec, spec.params(), LossContext())


def test_composes_with_a_stateless_modifier_and_keeps_its_keys():
    loss = prefzoo.get_loss("dpo", modifiers=["ld-dpo", "beta-dpo"])
    assert set(loss.state) == {"beta-dpo.margin_mean", "beta-dpo.margin_std", "beta-dpo.steps"}
    assert dataclasses.is_dataclass(loss.params)
    assert prefzoo.get_loss("dpo", modifiers=["wpo"]).state is None
