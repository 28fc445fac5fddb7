"""The new pairwise losses and the nll_reduction option against TRL 1.16's own loss code, in value and gradient.

TRL's ``DPOTrainer._compute_loss`` (rpo = ['sigmoid', 'sft'], sft), ``CPOTrainer.cpo_loss`` (cpo, cpo-simpo,
cpo-hinge, cpo-ipo) and ``ORPOTrainer.odds_ratio_loss`` (orpo) run unbound on a stand-in trainer: only the
model's forward (which would give the per-token log-probs) and the NLL's cross-entropy over the chosen tokens
(TRL: ``nn.CrossEntropyLoss()`` over the chosen labels, a mean over every chosen token of the batch) are
rebuilt here.  TRL sees the inputs rounded to each dtype, in float64; prefzoo sees them in that dtype.
"""

from __future__ import annotations

import os
from collections import defaultdict
from types import SimpleNamespace

import pytest
import torch

import prefzoo
from tests.losses.test_formulas import GRAD_TOL, TOL, random_inputs

os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
pytest.importorskip("trl")
from trl.experimental.cpo import CPOTrainer
from trl.experimental.orpo import ORPOTrainer
from trl.trainer.dpo_trainer import DPOTrainer

F64 = torch.float64
DTYPES = [F64, torch.float32, torch.bfloat16]
_ACC = SimpleNamespace(device=torch.device("cpu"), gather_for_metrics=lambda t: t, gather=lambda t: t)


def _token_logps(total: torch.Tensor, lengths: torch.Tensor, t: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-token log-probs (B, T) whose masked sum is ``total`` (each token gets total/|y|), and the mask."""
    mask = torch.arange(t)[None, :] < lengths[:, None]  # (B, T)
    return (total / lengths)[:, None] * mask, mask


def trl_dpo(loss_types: list[str], weights: list[float], beta: float, x: dict) -> torch.Tensor:
    """TRL 1.16's DPOTrainer._compute_loss on a stand-in model whose forward returns these log-probs."""
    t = int(max(x["lw"].max(), x["ll"].max()))
    tw, mw = _token_logps(x["pw"], x["lw"], t)
    tl, ml = _token_logps(x["pl"], x["ll"], t)
    log_probs = torch.cat([tw, tl])  # (2B, T): TRL's batch is [chosen; rejected]
    shift_mask = torch.cat([mw, ml]).long()
    completion_mask = torch.cat([torch.zeros(2 * len(x["pw"]), 1, dtype=torch.long), shift_mask], dim=1)
    zeros = torch.zeros_like(log_probs)
    outputs = SimpleNamespace(log_probs=log_probs, entropy=zeros, mean_logits=zeros, is_top1=zeros.bool())
    trainer = SimpleNamespace(
        model=SimpleNamespace(training=True), accelerator=_ACC, ld_alpha=None, precompute_ref_logps=True,
        aux_loss_enabled=False, f_divergence_type="reverse_kl", loss_types=loss_types, loss_weights=weights,
        beta=beta, use_weighting=False, _metrics=defaultdict(lambda: defaultdict(list)), _total_train_tokens=0,
        _tp_size=1, args=SimpleNamespace(discopop_tau=0.05),
    )  # fmt: skip
    inputs = {"input_ids": torch.zeros_like(completion_mask), "attention_mask": torch.ones_like(completion_mask),
              "completion_mask": completion_mask, "ref_chosen_logps": x["rw"], "ref_rejected_logps": x["rl"]}
    return DPOTrainer._compute_loss(trainer, lambda **kw: outputs, inputs, return_outputs=False)


def _trl_nll(x: dict) -> torch.Tensor:
    """nn.CrossEntropyLoss() over the chosen labels: minus the mean log-prob over every chosen token of the batch."""
    t = int(x["lw"].max())
    tw, mw = _token_logps(x["pw"], x["lw"], t)
    return -tw[mw].mean()


def trl_cpo(loss_type: str, beta: float, cpo_alpha: float, x: dict, simpo_gamma: float = 0.5) -> torch.Tensor:
    """TRL 1.16's CPOTrainer.cpo_loss + cpo_alpha·NLL (get_batch_loss_metrics), averaged log-probs for ipo/simpo."""
    trainer = SimpleNamespace(alpha=0.0, loss_type=loss_type, beta=beta, label_smoothing=0.0,
                              simpo_gamma=simpo_gamma, accelerator=_ACC)  # fmt: skip
    average = loss_type in ("ipo", "simpo")  # TRL: average_log_prob=self.loss_type in ["ipo", "simpo"]
    cw, cl = (x["pw"] / x["lw"], x["pl"] / x["ll"]) if average else (x["pw"], x["pl"])
    losses, _, _ = CPOTrainer.cpo_loss(trainer, cw, cl)
    return losses.mean() + cpo_alpha * _trl_nll(x)


def trl_orpo(beta: float, x: dict) -> torch.Tensor:
    """TRL 1.16's ORPOTrainer: policy_nll_loss − odds_ratio_loss(average log-probs).mean()."""
    trainer = SimpleNamespace(beta=beta, accelerator=_ACC)
    losses, *_ = ORPOTrainer.odds_ratio_loss(trainer, x["pw"] / x["lw"], x["pl"] / x["ll"])
    return _trl_nll(x) - losses.mean()


# (prefzoo name, prefzoo params, TRL call); prefzoo's mean over the batch must equal TRL's scalar loss
CASES = [
    ("rpo", {}, lambda x: trl_dpo(["sigmoid", "sft"], [1.0, 1.0], 0.1, x)),
    ("rpo", {"beta": 0.5, "alpha": 0.3}, lambda x: trl_dpo(["sigmoid", "sft"], [1.0, 0.3], 0.5, x)),
    ("sft", {"nll_reduction": "batch-tokens"}, lambda x: trl_dpo(["sft"], [1.0], 0.1, x)),
    ("cpo", {"nll_reduction": "batch-tokens"}, lambda x: trl_cpo("sigmoid", 0.1, 1.0, x)),
    ("cpo-hinge", {"nll_reduction": "batch-tokens"}, lambda x: trl_cpo("hinge", 0.1, 1.0, x)),
    ("cpo-hinge", {"beta": 0.05, "alpha": 0.5, "nll_reduction": "batch-tokens"},
     lambda x: trl_cpo("hinge", 0.05, 0.5, x)),
    ("cpo-ipo", {"nll_reduction": "batch-tokens"}, lambda x: trl_cpo("ipo", 0.1, 1.0, x)),
    ("cpo-ipo", {"beta": 0.5, "alpha": 0.2, "nll_reduction": "batch-tokens"}, lambda x: trl_cpo("ipo", 0.5, 0.2, x)),
    ("cpo-simpo", {"nll_reduction": "batch-tokens"}, lambda x: trl_cpo("simpo", 2.0, 1.0, x, simpo_gamma=1.0)),
    ("cpo-simpo", {"beta": 2.5, "gamma_beta_ratio": 0.4, "alpha": 0.1, "nll_reduction": "batch-tokens"},
     lambda x: trl_cpo("simpo", 2.5, 0.1, x, simpo_gamma=1.0)),  # TRL's simpo_gamma = γ = β·(γ/β)
    ("orpo", {"nll_reduction": "batch-tokens"}, lambda x: trl_orpo(0.1, x)),
    ("orpo", {"beta": 0.5, "nll_reduction": "batch-tokens"}, lambda x: trl_orpo(0.5, x)),
]  # fmt: skip


def _prefzoo(name: str, params: dict, x: dict, dtype: torch.dtype) -> tuple[torch.Tensor, ...]:
    pw, pl = x["pw"].to(dtype).requires_grad_(), x["pl"].to(dtype).requires_grad_()
    batch = prefzoo.PreferenceBatch(pw, pl, x["rw"].to(dtype), x["rl"].to(dtype), x["lw"], x["ll"])
    mean = prefzoo.get_loss(name, **params)(batch).losses.mean()
    gw, gl = torch.autograd.grad(mean, (pw, pl), allow_unused=True, materialize_grads=True)
    return mean.detach().double(), gw.double(), gl.double()


def _trl(call, x: dict, dtype: torch.dtype) -> tuple[torch.Tensor, ...]:
    r = {k: (v.to(dtype).double() if v.is_floating_point() else v) for k, v in x.items()}
    r["pw"].requires_grad_()
    r["pl"].requires_grad_()
    loss = call(r)
    gw, gl = torch.autograd.grad(loss, (r["pw"], r["pl"]), allow_unused=True, materialize_grads=True)
    return loss.detach(), gw, gl


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize(("name", "params", "call"), CASES, ids=[f"{n}-{i}" for i, (n, _, _) in enumerate(CASES)])
def test_matches_trl_code(name, params, call, dtype):
    for seed in range(3):
        x = random_inputs(seed)
        got, want = _prefzoo(name, params, x, dtype), _trl(call, x, dtype)
        for what, g, w in zip(("loss", "dL/dlogπ_w", "dL/dlogπ_l"), got, want, strict=True):
            # TRL's odds_ratio_loss casts its inputs to float32 (.float()): hold orpo to float32's tolerance
            tol_dtype = torch.float32 if name == "orpo" and dtype == F64 else dtype
            atol, rtol = (TOL if what == "loss" else GRAD_TOL)[tol_dtype]
            torch.testing.assert_close(g, w, atol=atol, rtol=rtol, msg=lambda m, what=what: f"{name} {what}: {m}")


def test_example_reduction_differs_from_trl_when_lengths_vary():
    """The comparison bites: with prefzoo's default per-example NLL, cpo is not TRL's value on varied lengths."""
    x = random_inputs(0)
    got, want = _prefzoo("cpo", {}, x, torch.float64), _trl(lambda r: trl_cpo("sigmoid", 0.1, 1.0, r), x, torch.float64)
    assert not torch.allclose(got[0], want[0], rtol=1e-6)
