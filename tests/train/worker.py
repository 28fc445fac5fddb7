"""Subprocess entry for multi-process tests: train with a JSON TrainConfig, save the final parameters (rank 0)."""

from __future__ import annotations

import json
import os
import sys

os.environ.setdefault("OMP_NUM_THREADS", "1")


def main() -> None:
    import torch

    torch.set_num_threads(1)
    from prefzoo.train.config import TrainConfig
    from prefzoo.train.loop import train

    cfg = TrainConfig.from_dict(json.loads(sys.argv[1]))
    result = train(cfg)
    from accelerate import PartialState

    if PartialState().is_main_process:
        sd = {k: v.detach().cpu().float() for k, v in result.model.state_dict().items()}
        torch.save(
            {"params": sd, "history": result.history, "step": result.global_step},
            os.path.join(cfg.output_dir, "worker_result.pt"),
        )
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)  # avoids the rare teardown SIGABRT seen with ZeRO-3 (PLATFORM.md)


if __name__ == "__main__":
    main()
