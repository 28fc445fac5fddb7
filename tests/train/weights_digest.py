"""A fixed-seed, default-ish run and the sha256 of its final weights (the refactor-invariance check's generator).

``python -m tests.train.weights_digest`` (from the repo root) prints the digest;
``tests/train/loop/test_same_weights.py`` compares it with the ones stored from the trainer before it was restructured.
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any


def run_config(model_dir: Path, data: Path, out: Path) -> dict[str, Any]:
    """The defaults (mmpo, cosine warm-up, eval split, accumulation) at a size that runs in seconds."""
    return {
        "model": str(model_dir),
        "dataset": str(data),
        "lr": 1e-3,  # large enough that every step moves the weights visibly
        "max_steps": 4,
        "per_device_batch_size": 2,
        "grad_accum": 4,  # 2 pairs × 4 micro-steps = 8 pairs per step
        "save_steps": 2,
        "eval_at_start": True,
        "output_dir": str(out),
        "report_to": "none",
        "progress": False,
        "seed": 0,
        **dict.fromkeys(("share_prompt", "packing", "group_by_length"), "off"),  # the digests predate "auto"
    }


VARIANTS: dict[str, dict[str, Any]] = {  # the default run, and the two other reference kinds
    "default": {},
    "lora-dpo-shared-prompt": {"loss": "dpo", "lora": True, "lora_r": 4, "lora_alpha": 8, "share_prompt": True},
    "precomputed-reference-dpo": {"loss": "dpo", "precompute_ref": True, "group_by_length": True},
}


def weights_digest(state: dict[str, Any]) -> str:
    """sha256 over every tensor's name, dtype, shape and bytes, in name order."""
    import torch

    h = hashlib.sha256()
    for name in sorted(state):
        t = state[name].detach().cpu().contiguous()
        h.update(f"{name}|{t.dtype}|{tuple(t.shape)}".encode())
        h.update(t.view(-1).view(dtype=torch.uint8).numpy().tobytes())
    return h.hexdigest()


def final_digest(root: Path, variant: str = "default") -> str:
    import torch
    from safetensors.torch import load_file

    from prefzoo.train.config import TrainConfig
    from prefzoo.train.loop import train
    from tests.support.tiny import make_model_dir, make_pairs, write_jsonl

    torch.set_num_threads(1)
    model_dir = make_model_dir(root / "model")
    data = write_jsonl(root / "pairs.jsonl", make_pairs(64))
    extra = {**VARIANTS[variant], "ref_cache_dir": str(root / "refcache")}
    train(TrainConfig.from_dict({**run_config(model_dir, data, root / "out"), **extra}))
    files = sorted((root / "out" / "final").glob("*.safetensors"))  # model, or the LoRA adapter
    return weights_digest({f"{f.name}/{k}": v for f in files for k, v in load_file(str(f)).items()})


if __name__ == "__main__":
    import tempfile

    for name in VARIANTS:
        with tempfile.TemporaryDirectory() as tmp:
            print(name, final_digest(Path(tmp), name))
