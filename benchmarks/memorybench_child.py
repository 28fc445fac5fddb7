"""One rank of a memory-benchmark run (a torchrun worker): train, measure this rank's memory, write ``rank-R.json``.

Usage: ``torchrun --nproc_per_node N memorybench_child.py spec.json outdir`` (the parent writes the spec; see
bench_memory).  prefzoo's trainer runs unmodified; a callback measures, on this rank:

- ``import_rss_mb``: resident memory after importing torch, transformers, accelerate (and deepspeed) and prefzoo,
  before anything is built: the floor every rank pays whatever the engine;
- ``setup_rss_mb``: resident memory at ``on_train_begin`` (model loaded and wrapped/sharded, optimizer built; its
  AdamW moments are allocated lazily at the first step);
- ``step_peak_rss_mb``: the largest resident memory seen by a sampling thread (every 5 ms) from ``on_train_begin``
  to the end of the last step; ``process_peak_rss_mb``: ``getrusage`` high-water mark at that point (setup included);
- ``params_mb``: bytes of the policy's parameters this rank holds (a DTensor's local shard, a ZeRO-3 partition);
- ``optim_state_mb``: bytes of the AdamW moments this rank holds; ``master_mb``: bytes of the parameters the torch
  optimizer steps that are not the model's own (DeepSpeed's flat fp32 partition), both after the last step;
- ``step_s``: each optimizer step, ``on_step_begin`` → ``on_step_end``; ``losses``: this rank's loss per step.
"""

from __future__ import annotations

import gc
import json
import os
import resource
import sys
import threading
import time
from pathlib import Path
from typing import Any

os.environ.setdefault("OMP_NUM_THREADS", "1")
MB = 2**20


def _rss() -> int:
    import psutil

    return int(psutil.Process().memory_info().rss)


class _Sampler(threading.Thread):
    """The largest RSS of this process seen every ``interval`` seconds until :meth:`stop`."""

    def __init__(self, interval: float = 0.005) -> None:
        super().__init__(daemon=True)
        self.interval, self.peak, self._stop_event = interval, _rss(), threading.Event()

    def run(self) -> None:
        while not self._stop_event.is_set():
            self.peak = max(self.peak, _rss())
            time.sleep(self.interval)

    def stop(self) -> int:
        self._stop_event.set()
        self.join()
        return max(self.peak, _rss())


def _local_numel(p: Any) -> int:
    """Elements of parameter ``p`` held on this rank: DTensor's local shard, ZeRO-3's partition, or the whole."""
    from torch.distributed.tensor import DTensor

    if isinstance(p, DTensor):
        return int(p.to_local().numel())
    if hasattr(p, "ds_tensor"):  # DeepSpeed ZeRO-3: p.data is empty, the partition lives in ds_tensor
        return int(p.ds_tensor.numel())
    return int(p.numel())


def _tensor_bytes(t: Any) -> int:
    from torch.distributed.tensor import DTensor

    t = t.to_local() if isinstance(t, DTensor) else t
    return int(t.numel() * t.element_size())


def _optimizer_bytes(model_params: set[int]) -> tuple[int, int]:
    """(AdamW moments, optimizer-owned master parameters) in bytes, over every live torch optimizer of this rank.

    The optimizers are found with ``gc`` (callbacks are not handed the optimizer; DeepSpeed hides the torch AdamW
    inside its ZeRO optimizer).
    """
    import torch

    state = master = 0
    # accelerate's AcceleratedOptimizer is an Optimizer too, whose .state is the wrapped one's: count each state once
    optimizers = {id(o.state): o for o in gc.get_objects() if isinstance(o, torch.optim.Optimizer)}
    for opt in optimizers.values():
        for s in opt.state.values():
            state += sum(_tensor_bytes(v) for v in s.values() if torch.is_tensor(v) and v.dim() > 0)
        # ZeRO-3 empties its param groups between steps: the state's keys still name the parameters stepped
        stepped = {id(p): p for group in opt.param_groups for p in group["params"]} | {id(p): p for p in opt.state}
        master += sum(_tensor_bytes(p) for i, p in stepped.items() if i not in model_params)
    return state, master


def main() -> None:
    spec_path, out_dir = Path(sys.argv[1]), Path(sys.argv[2])
    spec = json.loads(spec_path.read_text())
    import accelerate  # noqa: F401
    import torch
    import transformers  # noqa: F401

    if spec["options"].get("deepspeed"):
        import deepspeed  # noqa: F401
    from prefzoo.train import Callback, TrainConfig, train

    torch.set_num_threads(1)
    import_rss = _rss()

    class MemoryProbe(Callback):
        def __init__(self) -> None:
            self.record: dict[str, Any] = {"import_rss_mb": import_rss / MB, "step_s": [], "losses": []}
            self.sampler = _Sampler()
            self.t0 = 0.0

        def on_train_begin(self, state: Any) -> None:
            self.record["setup_rss_mb"] = _rss() / MB
            self.sampler.start()

        def on_step_begin(self, state: Any) -> None:
            self.t0 = time.perf_counter()

        def on_step_end(self, state: Any) -> None:
            self.record["step_s"].append(time.perf_counter() - self.t0)
            self.record["losses"].append(state.loss)
            if state.global_step < state.total_steps:
                return
            self.record["step_peak_rss_mb"] = self.sampler.stop() / MB
            self.record["process_peak_rss_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 / MB
            lm = state.accelerator.unwrap_model(state.model)
            params = list(lm.parameters())
            self.record["params"] = sum(int(p.ds_numel) if hasattr(p, "ds_numel") else p.numel() for p in params)
            self.record["params_mb"] = sum(_local_numel(p) * p.element_size() for p in params) / MB
            moments, master = _optimizer_bytes({id(p) for p in params})
            self.record["optim_state_mb"], self.record["master_mb"] = moments / MB, master / MB
            rank = state.accelerator.process_index
            (out_dir / f"rank-{rank}.json").write_text(json.dumps({"rank": rank, **self.record}))

    cfg = TrainConfig(
        model=spec["model_dir"],
        dataset=spec["dataset"],
        loss=spec["loss"],
        lr=1e-4,
        max_steps=spec["steps"],
        per_device_batch_size=spec["per_device_batch_size"],
        grad_accum=1,
        warmup_ratio=0.0,
        eval_fraction=0.0,
        output_dir=str(out_dir / "run"),
        progress=False,
        report_to="none",
        seed=0,
        cpu=True,
        **spec["options"],
    )
    train(cfg, callbacks=[MemoryProbe()])
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)  # ZeRO-3 teardown sometimes aborts after a finished run (docs: PLATFORM DeepSpeed notes)


if __name__ == "__main__":
    main()
