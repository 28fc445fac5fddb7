"""One lever at a time: prefzoo's DPO step (policy + frozen reference + AdamW) timed in-process per configuration.

    python benchmarks/bench_levers.py --workloads ultrafeedback orca --reps 3

Each configuration runs in its own subprocess (so peak RSS is per configuration); within a round the
configurations run back to back in a rotating order, and the medians over rounds are reported.  Each run is
prefzoo's real trainer (DPO, AdamW, fp32) with the lever as a TrainConfig option, a model-folder variant (eager
attention) or a callback (torch.compile); a step-timer callback times each optimizer step.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from trainbench_setup import WORKLOADS, ModelShape, build_model_dir, make_pairs, step_timer

HERE = Path(__file__).resolve().parent
CONFIGS: dict[str, dict[str, Any]] = {  # TrainConfig options, plus attn / threads / compile handled below
    "plain autograd head": {"fused_head": False},
    "fused head (default)": {},
    "fused head + shared prompt": {"share_prompt": True},
    "fused + shared + eager attention": {"share_prompt": True, "attn": "eager"},
    "fused + shared, 1 thread": {"share_prompt": True, "threads": 1},
    "fused + shared + length-grouped batches": {"share_prompt": True, "group_by_length": True},
    "fused + shared, precomputed reference": {"share_prompt": True, "precompute_ref": True},
    "fused + shared + torch.compile": {"share_prompt": True, "compile": True},
}


def model_variant(model_dir: str, attn: str | None, workdir: Path) -> str:
    """``model_dir``, or a copy whose config.json selects attention implementation ``attn`` (policy and reference)."""
    if attn is None:
        return model_dir
    import shutil

    out = workdir / f"model-{attn}"
    shutil.copytree(model_dir, out)
    cfg = json.loads((out / "config.json").read_text())
    (out / "config.json").write_text(json.dumps({**cfg, "attn_implementation": attn}))
    return str(out)


def compile_callback() -> Any:
    """A trainer callback that compiles the policy's decoder with torch.compile before the first step."""
    import torch

    from prefzoo.train import Callback

    class Compile(Callback):
        def on_train_begin(self, state: Any) -> None:
            lm = state.accelerator.unwrap_model(state.model).lm
            lm.model = torch.compile(lm.model, dynamic=True)

    return Compile()


def child(spec: dict[str, Any]) -> dict[str, Any]:
    """Time ``spec['steps']`` DPO steps (after one warm-up) of prefzoo's trainer in one configuration (JSON out)."""
    import datasets
    import torch

    from prefzoo.train import TrainConfig, train

    opts = dict(spec["options"])
    torch.set_num_threads(opts.pop("threads", spec["threads"]))
    timer = step_timer()
    callbacks = [timer, *([compile_callback()] if opts.pop("compile", False) else [])]
    with tempfile.TemporaryDirectory(prefix="levers-") as tmp:
        cfg = TrainConfig(
            model=model_variant(spec["model_dir"], opts.pop("attn", None), Path(tmp)),
            loss="dpo",
            lr=1e-5,
            max_steps=spec["steps"] + 1,  # the first step is warm-up
            per_device_batch_size=spec["batch"],
            grad_accum=1,
            warmup_ratio=0.0,
            eval_fraction=0.0,
            max_prompt_length=4096,
            max_completion_length=4096,
            ref_cache_dir=str(Path(tmp) / "ref"),
            output_dir=str(Path(tmp) / "out"),
            progress=False,
            report_to="none",
            seed=0,
            **opts,
        )
        train(cfg, train_dataset=datasets.Dataset.from_list(spec["pairs"]), callbacks=callbacks)
    times = timer.step_seconds()[1:]
    tokens = sum(2 * p["prompt"] + p["chosen"] + p["rejected"] for step in timer.batches[1:] for p in step)
    return {"step_s": times, "tokens": tokens, "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--workloads", nargs="+", default=["ultrafeedback", "orca"], choices=sorted(WORKLOADS))
    p.add_argument("--configs", nargs="+", default=list(CONFIGS), choices=list(CONFIGS))
    p.add_argument("--rounds", type=int, default=2, help="rounds over all configurations (rotating order)")
    p.add_argument("--steps", type=int, default=3, help="timed steps per run (one warm-up step is added)")
    p.add_argument("--batch", type=int, default=4)
    p.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    p.add_argument("--cache", default=str(HERE / ".cache"))
    p.add_argument("--out", default=str(HERE / "results" / "levers"))
    p.add_argument("--child", default=None, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.child:
        print(json.dumps(child(json.loads(Path(args.child).read_text()))))
        return 0
    model_dir = build_model_dir(Path(args.cache) / "llama-12m", ModelShape())
    rows = []
    for wl in args.workloads:
        pairs = make_pairs(WORKLOADS[wl], args.batch * (args.steps + 1), ModelShape().vocab_size, seed=2)
        runs: dict[str, list[dict[str, Any]]] = {c: [] for c in args.configs}
        for r in range(args.rounds):
            order = args.configs[r % len(args.configs) :] + args.configs[: r % len(args.configs)]
            for name in order:
                spec = {
                    "model_dir": str(model_dir),
                    "pairs": pairs,
                    "steps": args.steps,
                    "batch": args.batch,
                    "threads": args.threads,
                    "options": CONFIGS[name],
                }
                with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
                    json.dump(spec, f)
                env = {
                    **os.environ,
                    "OMP_NUM_THREADS": str(CONFIGS[name].get("threads", args.threads)),
                    "PREFZOO_DISABLE_PLUGIN_AUTOLOAD": "1",
                    "PYTHONPATH": os.pathsep.join([str(HERE), str(HERE.parent)]),  # this checkout, not an install
                    "HF_HUB_OFFLINE": "1",
                    "HF_DATASETS_OFFLINE": "1",
                    "TOKENIZERS_PARALLELISM": "false",
                }
                proc = subprocess.run(
                    [sys.executable, __file__, "--child", f.name], capture_output=True, text=True, env=env, timeout=1800
                )
                os.unlink(f.name)
                if proc.returncode != 0:
                    print(f"[{wl}] {name}: FAILED\n{proc.stderr[-2000:]}", flush=True)
                    continue
                res = json.loads(proc.stdout.strip().splitlines()[-1])
                runs[name].append(res)
                print(
                    f"[{wl} r{r}] {name}: {statistics.median(res['step_s']):.2f} s/step, "
                    f"peak {res['peak_rss_mb']:.0f} MB",
                    flush=True,
                )
        base = None
        for name in args.configs:
            if not runs[name]:
                continue
            med = statistics.median(statistics.median(x["step_s"]) for x in runs[name])
            tps = statistics.median(x["tokens"] / sum(x["step_s"]) for x in runs[name])
            rss = statistics.median(x["peak_rss_mb"] for x in runs[name])
            base = base or med
            rows.append(
                {
                    "workload": wl,
                    "config": name,
                    "step_s": med,
                    "tokens_per_s": tps,
                    "peak_rss_mb": rss,
                    "speedup_vs_first": base / med,
                }
            )
    lines = [
        "| workload | configuration | s/step | tokens/s | peak RSS | speed-up vs plain |",
        "|---|---|---|---|---|---|",
    ]
    lines += [
        f"| {r['workload']} | {r['config']} | {r['step_s']:.2f} | {r['tokens_per_s']:.0f} | "
        f"{r['peak_rss_mb']:.0f} MB | {r['speedup_vs_first']:.2f}× |"
        for r in rows
    ]
    table = "\n".join(lines) + "\n"
    print(table)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".json").write_text(
        json.dumps({"rows": rows, "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())}, indent=1)
    )
    out.with_suffix(".md").write_text(table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
