"""The TRL integration tests need TRL (the `trl` extra) and the train extra; they share one saved tiny model."""

from __future__ import annotations

import pytest

pytest.importorskip("trl")
pytest.importorskip("peft")


@pytest.fixture(scope="session")
def trl_model_dir(tmp_path_factory):
    from tests.integrations.trl_support import model_dir

    return model_dir(tmp_path_factory.mktemp("trl-model"))


@pytest.fixture(scope="session")
def start_params(trl_model_dir):
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(trl_model_dir, dtype=torch.float64)
    return {n: p.detach().clone() for n, p in model.named_parameters()}
