"""kto, apo-zero-unpaired, bco: TRL's own code in value and gradient (fp64, fp32, bf16), hand-derived cases,
only-desirable batches, the gathered z₀ / δ over simulated ranks, and BCO's running δ as loss state."""

from __future__ import annotations

import math

import pytest
import torch

import prefzoo
from prefzoo.testing.sharding import run_threads
from tests.losses.trl_unpaired import RunningMoments, bco_trl, kto_trl

F64 = torch.float64
# (atol, rtol) as tests/losses/test_formulas.py: bf16 inputs are computed in float32, their gradients arrive in bf16
TOL = {torch.float64: (1e-12, 1e-12), torch.float32: (2e-6, 2e-5), torch.bfloat16: (2e-6, 2e-5)}
GRAD_TOL = {**TOL, torch.bfloat16: (1e-4, 8e-3)}
KTO_CASES = [{}, {"beta": 0.7, "desirable_weight": 1.33, "undesirable_weight": 0.6}, {"beta": 2.0}]
DTYPES = [torch.float64, torch.float32, torch.bfloat16]


def random_inputs(seed: int, n: int = 9, kl_shift: float = 1.0) -> dict[str, torch.Tensor]:
    """Summed log-probs of completions of 1..30 tokens; ρ and the KL log-ratios within a few nats of 0."""
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(1, 30, (n,), generator=g)
    ref = -(0.05 + 1.2 * torch.rand(n, generator=g, dtype=F64)) * lengths
    policy = ref + 4 * torch.randn(n, generator=g, dtype=F64)
    kl_ref = -(0.05 + 1.2 * torch.rand(n, generator=g, dtype=F64)) * lengths
    kl_policy = kl_ref + 2 * torch.randn(n, generator=g, dtype=F64) + kl_shift
    labels = torch.rand(n, generator=g) < 0.5
    labels[0], labels[1] = True, False
    return {"policy": policy, "ref": ref, "kl_policy": kl_policy, "kl_ref": kl_ref, "labels": labels,
            "lengths": lengths}


def unpaired(x: dict[str, torch.Tensor], dtype: torch.dtype = F64, kl: bool = True) -> prefzoo.UnpairedBatch:
    return prefzoo.UnpairedBatch(
        policy_logps=x["policy"].to(dtype).detach().clone().requires_grad_(),
        ref_logps=x["ref"].to(dtype),
        labels=x["labels"],
        lengths=x["lengths"],
        kl_policy_logps=x["kl_policy"].to(dtype) if kl else None,
        kl_ref_logps=x["kl_ref"].to(dtype) if kl else None,
    )


def rounded(x: dict[str, torch.Tensor], dtype: torch.dtype) -> dict[str, torch.Tensor]:
    """The inputs prefzoo saw (rounded to ``dtype``), in float64, the policy a fresh leaf."""
    r = {k: (v.to(dtype).to(F64) if v.is_floating_point() else v) for k, v in x.items()}
    r["policy"] = r["policy"].clone().requires_grad_()
    return r


def trl_order(labels: torch.Tensor) -> torch.Tensor:
    """Where TRL puts each example: desirable ones first, then undesirable ones, each in batch order."""
    order = torch.cat((torch.nonzero(labels).flatten(), torch.nonzero(~labels).flatten()))
    return torch.argsort(order)


def prefzoo_side(name: str, params: dict, b: prefzoo.UnpairedBatch, loss=None):
    loss = loss or prefzoo.get_loss(name, **params)
    out = loss(b)
    (grad,) = torch.autograd.grad(out.losses.mean(), b.policy_logps)
    return out, out.losses.detach().double(), grad.double()


def assert_close(got, want, dtype, what, grad=False):
    atol, rtol = (GRAD_TOL if grad else TOL)[dtype]
    torch.testing.assert_close(got, want, atol=atol, rtol=rtol, msg=lambda m: f"{what}: {m}")


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("params", KTO_CASES, ids=lambda p: ",".join(f"{k}={v}" for k, v in p.items()) or "default")
@pytest.mark.parametrize(("name", "loss_type"), [("kto", "kto"), ("apo-zero-unpaired", "apo_zero_unpaired")])
def test_kto_family_is_trl_116(name, loss_type, params, dtype):
    """Per-example losses (TRL's order undone), their mean's gradient and z₀ equal TRL 1.16's KTO code."""
    for seed, shift in ((0, 1.0), (1, -3.0), (2, 0.3)):  # z₀ > 0, z₀ clamped to 0, z₀ small
        x = random_inputs(seed, kl_shift=shift)
        b = unpaired(x, dtype, kl=name == "kto")
        out, got, grad = prefzoo_side(name, params, b)
        r = rounded(x, dtype)
        want, chosen, rejected, kl = kto_trl(r["policy"], r["ref"], r["labels"], r["kl_policy"], r["kl_ref"],
                                             loss_type=loss_type, **params)
        (want_grad,) = torch.autograd.grad(want.nanmean(), r["policy"])
        want = want.detach()[trl_order(x["labels"])]
        assert_close(got, want, dtype, f"{name} {params} seed {seed} losses")
        assert_close(grad, want_grad, dtype, f"{name} {params} seed {seed} dL/dlogπ", grad=True)
        trl_rewards = torch.cat((chosen, rejected))[trl_order(x["labels"])]
        assert_close(out.chosen_rewards.double(), trl_rewards, dtype, "β·ρ")
        if name == "kto":
            assert_close(out.metrics["kto/z0"].double(), kl.double(), dtype, "z0")
            assert (float(kl) > 0) == (shift > 0), (seed, float(kl))  # both branches of the clamp are exercised


def _bco_trl_step(r, running: RunningMoments, beta: float, do_train: bool = True):
    lab = r["labels"]
    return bco_trl(r["policy"][lab], r["policy"][~lab], r["ref"][lab], r["ref"][~lab], running, beta=beta,
                   do_train=do_train)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("beta", [0.1, 0.9])
def test_bco_is_trl(beta, dtype):
    """Three training steps and one evaluation on one bound loss: δ follows TRL's RunningMoments (TRL computes it
    in float32), and given δ, each step's losses and gradient are TRL's bco_loss (run in float64)."""
    loss = prefzoo.get_loss("bco", beta=beta)
    running = RunningMoments()
    for step in range(4):
        training = step < 3
        x = random_inputs(10 + step)
        x["ref"] = x["ref"] - 3.0 * step  # the reward mean drifts from step to step
        b = unpaired(x, dtype, kl=False)
        with torch.set_grad_enabled(True):
            out = loss(b, update_state=training)
        (grad,) = torch.autograd.grad(out.losses.mean(), b.policy_logps)
        r = rounded(x, dtype)
        _, _, _, trl_delta = _bco_trl_step(r, running, beta, do_train=training)
        delta = out.metrics["bco/delta"].double()
        torch.testing.assert_close(delta, trl_delta.double(), atol=1e-6, rtol=1e-6)  # TRL: float32 arithmetic
        assert float(loss.state["delta"]) == pytest.approx(running.mean, rel=1e-6, abs=1e-7)
        # the loss given δ: TRL's bco_loss with do_train=False and δ = prefzoo's, its tensors in float64
        fixed = RunningMoments(mean=float(delta))
        prev = torch.get_default_dtype()
        torch.set_default_dtype(F64)  # TRL's torch.as_tensor(running.mean) would round δ to float32
        try:
            want, _, _, _ = _bco_trl_step(r, fixed, beta, do_train=False)
        finally:
            torch.set_default_dtype(prev)
        (want_grad,) = torch.autograd.grad(want.mean(), r["policy"])
        assert_close(out.losses.detach().double(), want.detach()[trl_order(x["labels"])], dtype, f"step {step}")
        assert_close(grad.double(), want_grad, dtype, f"step {step} dL/dlogπ", grad=True)
    assert float(loss.state["count"]) == 27  # three training batches of 9; the evaluation did not count


def test_kto_hand_derived():
    """β = 1, λ_D = 2, λ_U = 0.5; ρ = (2 ln 3, 0), labels (desirable, undesirable), KL log-ratios (ln 3, ln 3).

    z₀ = max(0, ln 3) = ln 3.  Desirable: 2·(1 − σ(2 ln 3 − ln 3)) = 2·(1 − 3/4) = 1/2.
    Undesirable: 0.5·(1 − σ(ln 3 − 0)) = 0.5·1/4 = 1/8.  With σ' = σ(1 − σ) = 3/16 at ln 3:
    ∂L/∂ρ_0 = −2·3/16 = −3/8,  ∂L/∂ρ_1 = +0.5·3/16 = 3/32.  Rewards β·ρ = (2 ln 3, 0), compared with β·z₀ = ln 3.
    """
    ln3 = math.log(3)
    b = prefzoo.UnpairedBatch(
        policy_logps=torch.tensor([2 * ln3 - 5.0, -7.0], dtype=F64, requires_grad=True),
        ref_logps=torch.tensor([-5.0, -7.0], dtype=F64), labels=torch.tensor([True, False]),
        kl_policy_logps=torch.tensor([ln3 - 4.0, ln3 - 9.0], dtype=F64),
        kl_ref_logps=torch.tensor([-4.0, -9.0], dtype=F64),
    )
    out = prefzoo.get_loss("kto", beta=1.0, desirable_weight=2.0, undesirable_weight=0.5)(b)
    torch.testing.assert_close(out.losses.detach(), torch.tensor([0.5, 0.125], dtype=F64), atol=1e-14, rtol=0)
    out.losses.sum().backward()
    torch.testing.assert_close(b.policy_logps.grad, torch.tensor([-3 / 8, 3 / 32], dtype=F64), atol=1e-14, rtol=0)
    torch.testing.assert_close(out.chosen_rewards, torch.tensor([2 * ln3, 0.0], dtype=F64), atol=1e-14, rtol=0)
    torch.testing.assert_close(out.rejected_rewards, torch.full((2,), ln3, dtype=F64), atol=1e-14, rtol=0)
    assert float(out.metrics["kto/z0"]) == pytest.approx(ln3, abs=1e-14)
    # a negative KL estimate is clamped: z₀ = 0, desirable 2·(1 − σ(2 ln 3)) = 2·(1 − 9/10) = 1/5, undesirable
    # 0.5·(1 − σ(0)) = 1/4
    b2 = b.replace(kl_policy_logps=torch.tensor([-4.5, -9.5], dtype=F64))
    out2 = prefzoo.get_loss("kto", beta=1.0, desirable_weight=2.0, undesirable_weight=0.5)(b2)
    torch.testing.assert_close(out2.losses.detach(), torch.tensor([0.2, 0.25], dtype=F64), atol=1e-14, rtol=0)
    assert float(out2.metrics["kto/z0"]) == 0.0


def test_apo_zero_unpaired_hand_derived():
    """β = 0.5, ρ = (2 ln 3, 2 ln 3), labels (desirable, undesirable): βρ = ln 3, σ(ln 3) = 3/4.

    Desirable 1 − 3/4 = 1/4, undesirable σ(ln 3) = 3/4; ∂L/∂ρ = ∓β·3/16 = (−3/32, 3/32).  No KL inputs needed.
    """
    ln3 = math.log(3)
    b = prefzoo.UnpairedBatch(
        policy_logps=torch.tensor([2 * ln3 - 1.0, 2 * ln3 - 2.0], dtype=F64, requires_grad=True),
        ref_logps=torch.tensor([-1.0, -2.0], dtype=F64), labels=torch.tensor([True, False]),
    )
    out = prefzoo.get_loss("apo-zero-unpaired", beta=0.5)(b)
    torch.testing.assert_close(out.losses.detach(), torch.tensor([0.25, 0.75], dtype=F64), atol=1e-14, rtol=0)
    out.losses.sum().backward()
    torch.testing.assert_close(b.policy_logps.grad, torch.tensor([-3 / 32, 3 / 32], dtype=F64), atol=1e-14, rtol=0)
    torch.testing.assert_close(out.rejected_rewards, torch.zeros(2, dtype=F64), atol=0, rtol=0)


def _bco_batch(rewards, labels):
    """β = 1 and log π_ref = −3: ρ = the given rewards."""
    r = torch.tensor(rewards, dtype=F64)
    return prefzoo.UnpairedBatch(policy_logps=(r - 3.0).requires_grad_(), ref_logps=torch.full_like(r, -3.0),
                                 labels=torch.tensor(labels))


def test_bco_hand_derived_running_delta():
    """β = 1.  Step 1: rewards (2, 0) → δ = 1; losses −log σ(2 − 1) and −log σ(−(0 − 1)), both log(1 + e⁻¹).
    Step 2: rewards (4, 4) → δ = (2·1 + 2·4)/4 = 2.5; desirable −log σ(1.5) = log(1 + e^−1.5), undesirable
    −log σ(−1.5) = log(1 + e^1.5); ∂L/∂ρ = −σ(−1.5), +σ(1.5).  An evaluation call (under no_grad) with rewards
    (100, 100) reads δ = 2.5 and does not move it."""
    loss = prefzoo.get_loss("bco", beta=1.0)
    assert loss.state is not None and float(loss.state["delta"]) == 0.0
    out1 = loss(_bco_batch([2.0, 0.0], [True, False]))
    c = math.log1p(math.exp(-1))
    torch.testing.assert_close(out1.losses.detach(), torch.tensor([c, c], dtype=F64), atol=1e-14, rtol=0)
    assert float(out1.metrics["bco/delta"]) == pytest.approx(1.0, abs=1e-15)
    b2 = _bco_batch([4.0, 4.0], [True, False])
    out2 = loss(b2)
    want = torch.tensor([math.log1p(math.exp(-1.5)), math.log1p(math.exp(1.5))], dtype=F64)
    torch.testing.assert_close(out2.losses.detach(), want, atol=1e-14, rtol=0)
    out2.losses.sum().backward()
    s = 1 / (1 + math.exp(-1.5))
    torch.testing.assert_close(b2.policy_logps.grad, torch.tensor([-(1 - s), s], dtype=F64), atol=1e-14, rtol=0)
    torch.testing.assert_close(out2.rejected_rewards, torch.full((2,), 2.5, dtype=F64), atol=1e-14, rtol=0)
    with torch.no_grad():
        out3 = loss(_bco_batch([100.0, 100.0], [True, False]))
    assert float(out3.metrics["bco/delta"]) == pytest.approx(2.5, abs=1e-15)
    assert float(loss.state["delta"]) == pytest.approx(2.5, abs=1e-15) and float(loss.state["count"]) == 4


@pytest.mark.parametrize("name", ["kto", "apo-zero-unpaired", "bco"])
def test_only_desirable_batch_follows_the_formula(name):
    """Every example desirable: each loss is its desirable branch, the undesirable weight plays no part, and every
    gradient is ≤ 0 (training raises every completion's likelihood)."""
    x = random_inputs(5, n=6)
    x["labels"] = torch.ones(6, dtype=torch.bool)
    params = {"beta": 0.4} if name == "bco" else {"beta": 0.4, "desirable_weight": 1.5, "undesirable_weight": 7.0}
    b = unpaired(x)
    _, got, grad = prefzoo_side(name, params, b)
    rho = (x["policy"] - x["ref"]) * 0.4
    z0 = float((x["kl_policy"] - x["kl_ref"]).mean().clamp(min=0)) * 0.4
    want = {
        "kto": 1.5 * torch.sigmoid(-(rho - z0)),
        "apo-zero-unpaired": 1.5 * (1 - torch.sigmoid(rho)),
        "bco": torch.nn.functional.softplus(-(rho - rho.mean())),  # δ after one batch: the batch's mean reward
    }[name]
    torch.testing.assert_close(got, want, atol=1e-12, rtol=1e-12)
    assert bool((grad <= 0).all()), grad
    if name != "bco":  # the undesirable weight does not enter
        other = {**params, "undesirable_weight": 0.01}
        torch.testing.assert_close(prefzoo_side(name, other, unpaired(x))[1], got, atol=0, rtol=0)


@pytest.mark.parametrize("name", ["kto", "bco"])
def test_gathered_batch_on_uneven_simulated_ranks_equals_one_process(name):
    """Shards (1, 3, 5) on three threads joined by an all-gather: z₀ / δ and every per-example loss equal the
    single-process ones; a rank that normalised alone would see a different z₀ / δ."""
    x = random_inputs(7, n=9, kl_shift=2.0)
    whole = prefzoo.get_loss(name, beta=0.5)(unpaired(x))
    sizes, starts = [1, 3, 5], [0, 1, 4]
    key = "kto/z0" if name == "kto" else "bco/delta"

    def rank(r: int, ex) -> prefzoo.LossOutput:
        sl = slice(starts[r], starts[r] + sizes[r])
        part = {k: v[sl] for k, v in x.items()}
        return prefzoo.get_loss(name, beta=0.5)(unpaired(part), gather=lambda t: ex.gather(r, t))

    outs = run_threads(rank, 3)
    for o in outs:
        torch.testing.assert_close(o.metrics[key], whole.metrics[key], atol=1e-14, rtol=0)
    torch.testing.assert_close(torch.cat([o.losses.detach() for o in outs]), whole.losses.detach(), atol=1e-14,
                               rtol=0)
    alone = prefzoo.get_loss(name, beta=0.5)(unpaired({k: v[:1] for k, v in x.items()}))
    assert abs(float(alone.metrics[key]) - float(whole.metrics[key])) > 1e-3


def test_kto_needs_the_kl_completions():
    x = random_inputs(0)
    with pytest.raises(prefzoo.PreferenceBatchError, match="kl_policy_logps"):
        prefzoo.get_loss("kto")(unpaired(x, kl=False))
    prefzoo.get_loss("apo-zero-unpaired")(unpaired(x, kl=False))  # the zero anchor does not


@pytest.mark.parametrize("name", ["kto", "apo-zero-unpaired", "bco"])
def test_pairs_are_refused_with_a_hint(name):
    pb = prefzoo.PreferenceBatch(torch.zeros(2, dtype=F64), torch.zeros(2, dtype=F64), torch.zeros(2, dtype=F64),
                                 torch.zeros(2, dtype=F64))
    with pytest.raises(prefzoo.PreferenceBatchError, match="UnpairedBatch"):
        prefzoo.get_loss(name)(pb)


@pytest.mark.parametrize("key", ["beta", "desirable_weight", "undesirable_weight"])
def test_params_out_of_range_name_the_field(key):
    with pytest.raises(prefzoo.LossParamError, match=key):
        prefzoo.get_loss("kto", **{key: 0.0})
