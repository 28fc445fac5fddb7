"""LoRA work the FLOP bound does not count: the reference pass runs no LoRA branch, zero dropout runs no kernel."""

from __future__ import annotations

import pytest
from torch import nn

from prefzoo.model.loading import apply_lora
from prefzoo.model.logps import PolicyLogps
from prefzoo.scoring import AdapterDisabledReference
from tests.train.setup.test_lora import _batch


def _lora_policy(dropout: float):
    from tests.support.tiny import build_model, build_tokenizer

    tok = build_tokenizer()
    lm = apply_lora(build_model(tok, seed=3), r=4, alpha=8, dropout=dropout, target_modules=["q_proj", "v_proj"])
    return PolicyLogps(lm), _batch(tok)


def _count_calls(model: nn.Module, pick) -> list[int]:
    calls = [0]
    for m in model.modules():
        if pick(m):
            m.register_forward_hook(lambda *_: calls.__setitem__(0, calls[0] + 1))
    return calls


def test_the_reference_pass_runs_no_lora_branch():
    policy, b = _lora_policy(0.0)
    lora_a = _count_calls(policy, lambda m: isinstance(m, nn.Linear) and ".lora_A." in _name_of(policy, m))
    AdapterDisabledReference(policy)(b)
    assert lora_a[0] == 0  # peft's disable_adapter(): each LoRA layer runs its base layer only
    policy(b["input_ids"], b["attention_mask"], b["completion_mask"])
    assert lora_a[0] == 4  # the policy pass does run them: 2 layers × (q_proj, v_proj)


@pytest.mark.parametrize(("dropout", "runs"), [(0.0, False), (0.05, True)])
def test_zero_lora_dropout_runs_no_dropout_module(dropout, runs):
    policy, b = _lora_policy(dropout)
    policy.train()
    dropouts = _count_calls(policy, lambda m: isinstance(m, nn.Dropout))
    policy(b["input_ids"], b["attention_mask"], b["completion_mask"]).logps.sum().backward()
    assert (dropouts[0] > 0) == runs


def _name_of(root: nn.Module, module: nn.Module) -> str:
    return next(n for n, m in root.named_modules() if m is module)


def test_lora_defaults_are_the_papers():
    """mmpo-paper.tex, appendix: LoRA r = 64, α = 64, dropout 0.01; prefzoo keeps them (docs/training.md says why)."""
    from prefzoo.cli.main import build_parser
    from prefzoo.train.config import TrainConfig

    cfg = TrainConfig(model="m", lora=True)
    assert (cfg.lora_r, cfg.lora_alpha, cfg.lora_dropout) == (64, 64, 0.01)
    args = build_parser().parse_args(["train", "--lora"])
    assert "lora_dropout" not in vars(args)  # the CLI leaves it unset: TrainConfig's default applies
