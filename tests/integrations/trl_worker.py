"""One process of the 2-process test: ``torchrun --nproc_per_node N trl_worker.py SPEC_JSON`` (gloo on CPU).

Trains through the adapter (``kind``: dpo or kto) with the spec's loss and per-device batch, sequential order, and
rank 0 saves the trained parameters and the log history to ``SPEC["out"]/result.pt``.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))


def main() -> None:
    import torch

    torch.set_num_threads(1)
    from tests.integrations.trl_support import make_pairs, make_unpaired, train

    spec = json.loads(sys.argv[1])
    out = Path(spec["out"])
    kind = spec.get("kind", "dpo")
    params, log, trainer = train(
        Path(spec["model_dir"]),
        out,
        (make_unpaired if kind == "kto" else make_pairs)(spec["pairs"], seed=3),
        adapter=True,
        loss=spec["loss"],
        kind=kind,
        per_device_train_batch_size=spec["per_device"],
        train_sampling_strategy="sequential",  # the global batch of step k: pairs [kG, (k+1)G) whatever the world
        ddp_backend="gloo",
    )
    if trainer.accelerator.is_main_process:
        world = trainer.accelerator.num_processes
        torch.save({"params": params, "log": log, "world": world}, out / "result.pt")
    sys.stdout.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
