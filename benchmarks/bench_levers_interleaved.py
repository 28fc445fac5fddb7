"""Lever timings robust to a loaded machine: one process, the configurations' training runs interleaved.

    python benchmarks/bench_levers_interleaved.py --workload orca --rounds 4

Every round runs prefzoo's real trainer once per configuration (DPO, AdamW, fp32; two optimizer steps on the same
batch, the second timed by a step-timer callback), in a rotating order, so background load falls on every
configuration alike; the ratio of each configuration's median step time to the baseline's is reported.  Levers:
the fused head, the shared-prompt layout, the attention implementation (a model-folder variant), the thread
count, a precomputed reference (no reference forward in the step).  Peak memory cannot be separated here (one
process): ``bench_levers.py`` measures it per configuration in its own process.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from trainbench_setup import WORKLOADS, ModelShape, build_model_dir, make_pairs, step_timer

HERE = Path(__file__).resolve().parent
CONFIGS: dict[str, dict[str, Any]] = {  # TrainConfig options, plus attn / threads handled in step()
    "plain autograd head": {"fused_head": False},
    "fused head (default)": {},
    "fused + shared prompt": {"share_prompt": True},
    "fused + shared + eager attention": {"share_prompt": True, "attn": "eager"},
    "fused + shared, 2 threads": {"share_prompt": True, "threads": 2},
    "fused + shared, precomputed reference": {"share_prompt": True, "precompute_ref": True},
}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--workload", default="ultrafeedback", choices=sorted(WORKLOADS))
    p.add_argument("--rounds", type=int, default=4, help="rounds (the first is warm-up and not counted)")
    p.add_argument("--batch", type=int, default=4)
    p.add_argument("--threads", type=int, default=1, help="threads of every configuration but the '2 threads' one")
    p.add_argument("--cache", default=str(HERE / ".cache"))
    p.add_argument("--out", default=None, help="results .json/.md prefix (default results/levers_interleaved_<wl>)")
    args = p.parse_args(argv)

    import contextlib
    import io
    import tempfile

    import datasets
    import torch
    from bench_levers import model_variant

    from prefzoo.train import TrainConfig, train

    model_dir = build_model_dir(Path(args.cache) / "llama-12m", ModelShape())
    pairs = make_pairs(WORKLOADS[args.workload], args.batch, ModelShape().vocab_size, seed=3)
    twice = datasets.Dataset.from_list([{**p, "id": f"{p['id']}-{k}"} for k in (0, 1) for p in pairs])
    work = Path(tempfile.mkdtemp(prefix="levers-interleaved-"))
    models = {a: model_variant(str(model_dir), a, work) for a in (None, "eager")}

    def step(cfg: dict[str, Any]) -> float:
        """One training run of two steps on the same pairs; the second step's seconds."""
        opts = dict(cfg)
        torch.set_num_threads(opts.pop("threads", args.threads))
        timer = step_timer()
        tc = TrainConfig(
            model=models[opts.pop("attn", None)], loss="dpo", lr=1e-7, max_steps=2, per_device_batch_size=args.batch,
            grad_accum=1, warmup_ratio=0.0, eval_fraction=0.0, max_prompt_length=4096, max_completion_length=4096,
            ref_cache_dir=str(work / "ref"), output_dir=str(work / "out"), save_total_limit=1,
            overwrite_output_dir=True,  # every round trains again in the same folder
            progress=False, report_to="none", seed=0, **opts,
        )  # fmt: skip
        with contextlib.redirect_stdout(io.StringIO()):
            train(tc, train_dataset=twice, callbacks=[timer])
        return timer.step_seconds()[1]

    names = list(CONFIGS)
    times: dict[str, list[float]] = {n: [] for n in names}
    for r in range(args.rounds):
        order = names[r % len(names) :] + names[: r % len(names)]
        for n in order:
            dt = step(CONFIGS[n])
            if r > 0:
                times[n].append(dt)
            print(f"[{args.workload} r{r}] {n}: {dt:.2f} s", flush=True)
    base = statistics.median(times[names[0]])
    rows = [
        {
            "config": n,
            "median_s": statistics.median(times[n]),
            "speedup": base / statistics.median(times[n]),
            "min_s": min(times[n]),
            "max_s": max(times[n]),
        }
        for n in names
    ]
    lines = [
        f"Workload {args.workload}, {args.rounds - 1} counted rounds, {args.threads} threads, interleaved in one "
        "process.",
        "",
        "| configuration | median s/step (min–max) | speed-up vs plain autograd head |",
        "|---|---|---|",
    ]
    lines += [
        f"| {r['config']} | {r['median_s']:.2f} ({r['min_s']:.2f}–{r['max_s']:.2f}) | {r['speedup']:.2f}× |"
        for r in rows
    ]
    table = "\n".join(lines) + "\n"
    print(table)
    out = Path(args.out or HERE / "results" / f"levers_interleaved_{args.workload}")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".json").write_text(
        json.dumps({"rows": rows, "times": times, "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())}, indent=1)
    )
    out.with_suffix(".md").write_text(table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
