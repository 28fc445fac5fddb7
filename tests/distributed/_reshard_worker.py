"""torchrun entry for the resharding tests: train (or resume), then write the full parameters and the example ids
each optimizer step trained on this rank.

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

    class Record(Callback):
        def __init__(self) -> None:
            self.ids: dict[int, list[str]] = {}

        def on_batch(self, state, fields):  # type: ignore[no-untyped-def]
            self.ids.setdefault(state.global_step + 1, []).extend(str(i) for i in state.batch["ids"])

        def on_train_end(self, state):  # type: ignore[no-untyped-def]
            rank = state.accelerator.process_index
            Path(cfg.output_dir, f"ids-{rank}.json").write_text(json.dumps(self.ids))
            named = list(state.accelerator.unwrap_model(state.model).lm.named_parameters())
            full = {n: (p.full_tensor() if isinstance(p, DTensor) else p).detach().cpu().float() for n, p in named}
            if state.accelerator.is_main_process:
                torch.save({"params": full, "step": state.global_step}, os.path.join(cfg.output_dir, "result.pt"))

    train(cfg, callbacks=[Record()])
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
