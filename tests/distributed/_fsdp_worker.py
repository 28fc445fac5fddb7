"""torchrun entry for the FSDP2 tests: train, then write the full parameters (gathered) and each rank's shard shapes.

The gather runs in ``on_train_end``, while the process group still exists (accelerate's end_training closes it).
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")


def main() -> None:
    import torch
    from torch.distributed.tensor import DTensor

    from prefzoo.train.callbacks import Callback
    from prefzoo.train.config import TrainConfig
    from prefzoo.train.loop import train

    torch.set_num_threads(1)
    cfg = TrainConfig.from_dict(json.loads(sys.argv[1]))

    class Gather(Callback):
        def on_train_end(self, state):  # type: ignore[no-untyped-def]
            named = list(state.accelerator.unwrap_model(state.model).lm.named_parameters())
            shards = {  # what this rank holds: class, local shape, global shape, placements on the mesh
                n: [type(p).__name__, list(p.to_local().shape if isinstance(p, DTensor) else p.shape), list(p.shape),
                    [str(x) for x in p.placements] if isinstance(p, DTensor) else []]
                for n, p in named
            }  # fmt: skip
            Path(cfg.output_dir, f"shards-{state.accelerator.process_index}.json").write_text(json.dumps(shards))
            full = {n: (p.full_tensor() if isinstance(p, DTensor) else p).detach().cpu().float() for n, p in named}
            if state.accelerator.is_main_process:
                out = {"params": full, "step": state.global_step}
                torch.save(out, os.path.join(cfg.output_dir, "worker_result.pt"))

    train(cfg, callbacks=[Gather()])
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
