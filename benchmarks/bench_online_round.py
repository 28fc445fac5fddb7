"""Where one on-policy round's time goes: sampling, judging, building the round's batches, the optimizer steps.

    OMP_NUM_THREADS=1 nice -n 19 python benchmarks/bench_online_round.py            # 20 rounds of online mml n=2
    OMP_NUM_THREADS=1 python benchmarks/bench_online_round.py --steps 6 --profile   # + cProfile of the batch phase

The default task's warmed-up policy, its addition prompts and the exact oracle, as in ``bench_online.py``'s
``online mml n=2`` arm (8 prompts per step, ``--online-every 1``: one round per step).  A callback reads the clock at
the hooks a round passes (``on_generation_begin`` → ``on_generation_end`` → ``on_judged`` → ``on_step_begin`` →
``on_step_end``); "batches" is the time from judged to the first step (rows → tokenized, collated micro-batches).
Prints the per-round median of each phase over the rounds after the first (which also runs the log-prob self-check).
"""

from __future__ import annotations

import argparse
import contextlib
import cProfile
import io
import os
import pstats
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

os.environ.setdefault("OMP_NUM_THREADS", "1")
sys.path.insert(0, str(Path(__file__).resolve().parent))

PHASES = ("generation", "judging", "batches", "steps", "round")


def run(steps: int, n: int, loss: str, profile: bool) -> list[dict[str, float]]:
    import torch

    torch.set_num_threads(1)
    from _sweep_run import SweepConfig, _task

    from prefzoo.train import Callback, TrainConfig, train

    task, _, _ = _task(SweepConfig(eval_prompts=1))
    rounds: list[dict[str, float]] = []
    prof = cProfile.Profile() if profile else None

    class Clock(Callback):
        def on_generation_begin(self, state: Any) -> None:
            self.t = {"begin": time.perf_counter()}

        def on_generation_end(self, state: Any) -> None:
            self.t["generated"] = time.perf_counter()

        def on_judged(self, state: Any) -> None:
            self.t["judged"] = time.perf_counter()
            if prof is not None:
                prof.enable()

        def on_step_begin(self, state: Any) -> None:
            if prof is not None:
                prof.disable()
            self.t.setdefault("stepping", time.perf_counter())

        def on_step_end(self, state: Any) -> None:
            t, now = self.t, time.perf_counter()
            rounds.append({"generation": t["generated"] - t["begin"], "judging": t["judged"] - t["generated"],
                           "batches": t["stepping"] - t["judged"], "steps": now - t["stepping"],
                           "round": now - t["begin"]})  # fmt: skip

    with tempfile.TemporaryDirectory(prefix="prefzoo-online-round-") as out:
        tc = TrainConfig(
            loss=loss, loss_params={"beta": 0.05}, model=str(task.model_dir), max_steps=steps,
            per_device_batch_size=8, grad_accum=1, lr=3e-4, eval_fraction=0.0, seed=0, output_dir=out,
            save_steps=10_000, save_total_limit=1, progress=False, report_to="none", cpu=True, online=True,
            samples_per_prompt=n, max_new_tokens=6, judge="oracle",
            max_prompt_length=int(task.recommended["max_prompt_length"]),
            max_completion_length=int(task.recommended["max_completion_length"]),
        )  # fmt: skip
        with contextlib.redirect_stdout(io.StringIO()):
            train(tc, task.train, None, callbacks=[Clock()])
    if prof is not None:
        pstats.Stats(prof).sort_stats("cumulative").print_stats(25)
    return rounds


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=20, help="optimizer steps = rounds (default 20)")
    ap.add_argument("--n", type=int, default=2, help="samples per prompt (default 2)")
    ap.add_argument("--loss", default="mml", help="a list loss (default mml)")
    ap.add_argument("--profile", action="store_true", help="cProfile the batch-building phase of every round")
    args = ap.parse_args()
    rounds = run(args.steps, args.n, args.loss, args.profile)
    later = rounds[1:] or rounds
    print(f"online {args.loss} n={args.n}, {len(rounds)} rounds of 8 prompts; median seconds per round (rounds 2+):")
    for k in PHASES:
        print(f"  {k:<11} {statistics.median(r[k] for r in later):.4f}")


if __name__ == "__main__":
    main()
