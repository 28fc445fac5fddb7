"""The conformance kit on an unpaired plugin loss: every unpaired property runs, and a broken loss fails one."""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass

import torch
import torch.nn.functional as F

import prefzoo
from prefzoo.testing import check_loss


@dataclass(frozen=True, kw_only=True)
class _Beta(prefzoo.LossParams):
    beta: float = prefzoo.param(0.1, "β", gt=0.0)


def _toy(sign: float):
    """−log σ(±β·(log π − log π_ref)): + for desirable, − for undesirable (sign = −1 breaks the desirable side)."""

    def fn(b, p, ctx):
        r = p.beta * (b.policy_logps - b.ref_logps.detach())  # (N,)
        z = torch.where(b.labels, sign * r, -r)
        rd = r.detach()
        return prefzoo.LossOutput(-F.logsigmoid(z), rd, torch.zeros_like(rd), rewards=rd)

    spec = prefzoo.LossSpec(name="toy-unpaired", fn=fn, params_cls=_Beta, family="t", formula="", paper="",
                            scores="", needs=frozenset({prefzoo.Need.REFERENCE}), shift_invariant=True,
                            shapes=frozenset({prefzoo.Shape.UNPAIRED}), plugin="tests")
    return spec


def test_an_unpaired_loss_gets_the_unpaired_properties_and_passes():
    report = check_loss(_toy(1.0), max_examples=15, derandomize=True)
    ran = {r.name for r in report.results if r.status != "n/a"}
    assert {"unpaired-finite", "unpaired-permutation", "unpaired-sharded-gather", "unpaired-monotone",
            "unpaired-low-precision"} <= ran, ran
    assert not any(n.startswith(("list-", "finite")) for n in ran)  # no pair or list property on an unpaired loss
    assert report.passed, report.table() + report.failures_text()


def test_a_wrong_sign_on_desirable_completions_fails_unpaired_monotone():
    report = check_loss(_toy(-1.0), properties=["unpaired-monotone"], max_examples=30, derandomize=True)
    assert not report.passed and "desirable completion" in report.results[0].message, report.table()


def test_unpaired_monotone_sees_a_float64_sized_wrong_sign():
    """+1e-8·log π(y) on every completion: ∂L/∂log π = +1e-8 for desirable ones, far above float64's tolerance
    (64·u₆₄·scale ≈ 1e-14·scale) but below float32's (≈ 4e-6·scale), so only the float64 tolerance catches it."""
    spec = _toy(1.0)
    sound = spec.fn

    def fn(b, p, ctx):
        out = sound(b, p, ctx)
        return prefzoo.LossOutput(out.losses.detach() + 1e-8 * b.policy_logps, out.chosen_rewards,
                                  out.rejected_rewards, rewards=out.rewards)

    broken = dataclasses.replace(spec, name="toy-wrong-sign", fn=fn, monotone=True)
    report = check_loss(broken, properties=["unpaired-monotone"], dtypes=["float64"], max_examples=10,
                        derandomize=True)
    (res,) = report.results
    assert res.status == "failed" and re.search(r"^toy-wrong-sign: ∂L/∂log π\(y\) = 1e-08 for a desirable completion",
                                                res.message), report.table() + report.failures_text()


def test_unpaired_sharded_gather_catches_a_local_batch_mean():
    """Declared batch-coupled, adds 0.01·tanh(mean reward of the local shard) without the gather hook: an error of
    about 1e-3, far above the property's 1e-9 tolerance."""
    spec = _toy(1.0)
    sound = spec.fn

    def fn(b, p, ctx):
        out = sound(b, p, ctx)
        return prefzoo.LossOutput(out.losses + 0.01 * torch.tanh(out.rewards.mean() + 1), out.chosen_rewards,
                                  out.rejected_rewards, rewards=out.rewards)

    broken = dataclasses.replace(spec, name="toy-local-mean", fn=fn, batch_coupled=True)
    report = check_loss(broken, properties=["unpaired-sharded-gather"], dtypes=["float64"], max_examples=20,
                        derandomize=True)
    (res,) = report.results
    assert res.status == "failed" and res.message.startswith("toy-local-mean: losses sharded as"), report.table()
