"""The KTO transcription in tests/losses/trl_unpaired.py is TRL 1.16's own code: run the installed
``KTOTrainer._compute_loss`` on a stand-in model whose per-token log-probs are given, and compare value and gradient.

Skipped where TRL 1.16 is not installed (the ``unit`` env has no TRL; the ``trl`` and ``bench`` extras do).
"""

from __future__ import annotations

from collections import defaultdict
from types import SimpleNamespace

import pytest
import torch

from tests.losses.trl_unpaired import kto_trl

F64 = torch.float64


def _trl_kto_trainer():
    trl = pytest.importorskip("trl")
    if not trl.__version__.startswith("1.16."):
        pytest.skip(f"the transcription is of TRL 1.16; installed: {trl.__version__}")
    kto = pytest.importorskip("trl.trainer.kto_trainer")
    return kto.KTOTrainer


class _Accelerator:
    device = torch.device("cpu")

    @staticmethod
    def gather_for_metrics(t):  # one process: the identity, as accelerate's
        return t


def run_trl_kto(policy, ref, labels, kl_policy, kl_ref, **cfg):
    """TRL's KTOTrainer._compute_loss with precomputed reference log-probs; the model returns ``policy`` as the
    summed completion log-probs (one completion token per row), the KL forward returns ``kl_policy``."""
    trainer = _trl_kto_trainer()
    n = policy.shape[0]

    def model(**kwargs):
        assert kwargs["fused_lm_head"] is True
        return SimpleNamespace(log_probs=policy[:, None], entropy=torch.zeros(n, 1, dtype=F64),
                               mean_logits=torch.zeros(n, 1, dtype=F64))

    model.training = True  # type: ignore[attr-defined]
    loss_type = cfg.get("loss_type", "kto")
    fake = SimpleNamespace(
        model=model, accelerator=_Accelerator(), precompute_ref_logps=True,
        calculate_KL=loss_type != "apo_zero_unpaired", loss_type=loss_type, beta=cfg.get("beta", 0.1),
        desirable_weight=cfg.get("desirable_weight", 1.0), undesirable_weight=cfg.get("undesirable_weight", 1.0),
        aux_loss_enabled=False, _metrics={"train": defaultdict(list)}, _total_train_tokens=0, _tp_size=1,
        _compute_kl_logps=lambda m, b: kl_policy,
    )
    batch = {
        "input_ids": torch.ones(n, 2, dtype=torch.long), "attention_mask": torch.ones(n, 2, dtype=torch.long),
        "completion_mask": torch.tensor([[0, 1]] * n), "label": labels, "ref_logps": ref,
        "ref_KL_logps": kl_ref,
    }
    loss = trainer._compute_loss(fake, model, batch, return_outputs=False)
    return loss, fake._metrics["train"]["kl"][-1]


@pytest.mark.parametrize("cfg", [{}, {"beta": 0.7, "desirable_weight": 1.33, "undesirable_weight": 0.6},
                                 {"loss_type": "apo_zero_unpaired", "beta": 0.3, "undesirable_weight": 2.0}])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_transcription_is_trl_116_kto(cfg, seed):
    g = torch.Generator().manual_seed(seed)
    n = 7
    labels = torch.rand(n, generator=g) < 0.5
    labels[0], labels[1] = True, False
    policy = (-torch.rand(n, generator=g, dtype=F64) * 40).requires_grad_()
    ref = -torch.rand(n, generator=g, dtype=F64) * 40
    kl_policy = -torch.rand(n, generator=g, dtype=F64) * 40
    kl_ref = kl_policy - torch.randn(n, generator=g, dtype=F64) * 3 - (1.0 if seed == 1 else -1.0)  # z0 > 0 or clamped
    want, kl = run_trl_kto(policy, ref, labels, kl_policy, kl_ref, **cfg)
    (gw,) = torch.autograd.grad(want, policy)
    p2 = policy.detach().clone().requires_grad_()
    losses, _, _, kl2 = kto_trl(p2, ref, labels, kl_policy, kl_ref, **cfg)
    got = losses.nanmean()
    (gg,) = torch.autograd.grad(got, p2)
    torch.testing.assert_close(got, want, atol=0, rtol=1e-15)
    torch.testing.assert_close(gg, gw, atol=0, rtol=1e-15)
    assert float(kl2) == pytest.approx(kl, abs=1e-12)
