"""The final model is the same whatever the engine: DDP, FSDP2, ZeRO-2 and ZeRO-3 write the keys ``save_pretrained``
of the unwrapped model writes (one of a tied embedding / LM head pair), and their finals load to the same values.

Each engine trains a tiny Llama with tied embeddings one step with ``torchrun --nproc_per_node 2 -m prefzoo train``
(gloo, as a user runs it), with the same batch layout everywhere (fast paths off), so the weights agree to float
rounding: DDP and FSDP2 within 1e-5 (tests/distributed/test_fsdp.py), ZeRO within 1e-4
(tests/train/engines/test_deepspeed.py).
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
import torch

from tests.support.launch import torchrun_prefzoo
from tests.train.helpers import max_param_diff, params_of

pytestmark = [pytest.mark.distributed, pytest.mark.slow]

_DEEPSPEED = pytest.mark.skipif(importlib.util.find_spec("deepspeed") is None, reason="needs deepspeed")
ENGINES = {
    "ddp": [],
    "fsdp": ["--fsdp"],
    "zero2": ["--deepspeed", "zero2"],
    "zero3": ["--deepspeed", "zero3"],
}


@pytest.fixture(scope="module")
def tied_dir(tmp_path_factory):
    from tests.support.tiny import make_model_dir

    torch.set_num_threads(1)
    return make_model_dir(tmp_path_factory.mktemp("model"), tied=True)


@pytest.fixture(scope="module")
def finals(tmp_path_factory, tied_dir, pairs_file):
    """engine -> its ``final/`` folder, each trained once per module."""
    done: dict[str, Path] = {}

    def final(engine: str) -> Path:
        if engine not in done:
            out = tmp_path_factory.mktemp(f"final-{engine}")
            _train(tied_dir, pairs_file, out, ENGINES[engine])
            done[engine] = out / "final"
        return done[engine]

    return final


def _train(model: Path, data: Path, out: Path, flags: list[str]) -> None:
    torchrun_prefzoo("train", "--loss", "dpo", "--model", str(model), "--dataset", str(data), "--output-dir", str(out),
                     "--max-steps", "1", "--per-device-batch-size", "4", "--lr", "1e-2", "--warmup-ratio", "0",
                     "--eval-fraction", "0", "--report-to", "none", "--no-progress", "--share-prompt", "off",
                     "--packing", "off", "--group-by-length", "off", *flags)  # fmt: skip


def _saved_keys(folder: Path) -> set[str]:
    from safetensors import safe_open

    with safe_open(str(folder / "model.safetensors"), "pt") as f:
        return set(f.keys())


@pytest.mark.parametrize(
    "engine", ["ddp", "fsdp", pytest.param("zero2", marks=[pytest.mark.deepspeed, _DEEPSPEED]),
               pytest.param("zero3", marks=[pytest.mark.deepspeed, _DEEPSPEED])],
)  # fmt: skip
def test_final_has_the_keys_and_values_of_every_engine(finals, tied_dir, tmp_path, engine):
    from transformers import AutoModelForCausalLM

    start = AutoModelForCausalLM.from_pretrained(tied_dir)
    start.save_pretrained(tmp_path / "plain")
    plain = _saved_keys(tmp_path / "plain")
    assert "lm_head.weight" not in plain and "model.embed_tokens.weight" in plain  # the tied pair, saved once
    assert _saved_keys(finals(engine)) == plain

    loaded = AutoModelForCausalLM.from_pretrained(finals(engine))
    assert loaded.lm_head.weight.data_ptr() == loaded.model.embed_tokens.weight.data_ptr()
    trained = params_of(loaded)
    assert max_param_diff(trained, params_of(start)) > 1e-3  # one step moved the weights
    reference = params_of(AutoModelForCausalLM.from_pretrained(finals("ddp")))
    diff = max_param_diff(trained, reference)
    assert diff <= (1e-4 if engine.startswith("zero") else 1e-5), (engine, diff)
