"""The cost of prefzoo's loss inside TRL's DPOTrainer: step time and peak memory of the adapter vs TRL's own loss.

    python benchmarks/bench_trl_adapter.py --quick                 # CI smoke: a tiny model, dpo, 1 repeat, 1+2 steps
    python benchmarks/bench_trl_adapter.py --write-page docs/results/performance.md   # the recorded row

Both sides are TRL 1.16's DPOTrainer on the same model, data, batch and optimizer (trainbench_child.run_trl); the
adapter side changes one import and passes ``loss=`` (``dpo`` against TRL's ``loss_type="sigmoid"``; ``mmpo``, a
batch-coupled loss with a gather, against the same).  Each run is its own subprocess (peak RSS per run); the side
that goes first alternates between repeats.  Ratios are adapter / TRL per repeat: median and min–max.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_train_throughput import TRL_FAST, _machine, _run_child, _versions
from trainbench_setup import TINY_SHAPE, WORKLOADS, ModelShape, build_model_dir, make_pairs

HERE = Path(__file__).resolve().parent
BEGIN, END = "<!-- trl-adapter:begin -->", "<!-- trl-adapter:end -->"
CASES = {"dpo": "dpo", "mmpo": "mmpo"}  # case -> the adapter's loss=; TRL's side is always loss_type="sigmoid"


def _summary(run: dict[str, Any], warmup: int) -> dict[str, float]:
    steps = run["step_s"][min(warmup, len(run["step_s"]) - 1) :]
    return {"step_s": statistics.median(steps), "peak_rss_mb": run["peak_rss_mb"], "steps": len(steps)}


def run(args: argparse.Namespace) -> dict[str, Any]:
    shape = TINY_SHAPE if args.quick else ModelShape()
    model_dir = build_model_dir(Path(args.cache) / ("tiny-llama" if args.quick else "llama-12m"), shape)
    pairs = make_pairs(WORKLOADS[args.workload], args.batch * (args.warmup + args.steps), shape.vocab_size, seed=1)
    rows = []
    for case in args.cases:
        per_side: dict[str, list[dict[str, float]]] = {"trl": [], "adapter": []}
        for r in range(args.repeats):
            for side in ("trl", "adapter") if r % 2 == 0 else ("adapter", "trl"):
                spec = {
                    "side": "trl",
                    "case": f"{case}-{side}",
                    "model_dir": str(model_dir),
                    "threads": args.threads,
                    "batch": args.batch,
                    "pairs": pairs,
                    "max_steps": args.warmup + args.steps,
                    "trl_trainer": "dpo",
                    "trl_options": TRL_FAST,
                    "adapter_loss": CASES[case] if side == "adapter" else None,
                }
                t0 = time.time()
                s = _summary(_run_child(spec, args.threads, args.timeout), args.warmup)
                per_side[side].append(s)
                print(f"[{case} r{r} {side}] {s['step_s']:.3f} s/step, peak {s['peak_rss_mb']:.0f} MB "
                      f"(wall {time.time() - t0:.0f} s)", flush=True)  # fmt: skip
        pairs_ = list(zip(per_side["adapter"], per_side["trl"], strict=True))
        rows.append(
            {
                "case": case,
                "sides": per_side,
                "time_ratio": [a["step_s"] / b["step_s"] for a, b in pairs_],
                "memory_ratio": [a["peak_rss_mb"] / b["peak_rss_mb"] for a, b in pairs_],
            }
        )
    return {
        "rows": rows,
        "meta": {
            "date": datetime.now(timezone.utc).strftime("%Y-%m-%d"),
            "machine": _machine(),
            "versions": _versions(),
            "model": "tiny (smoke)" if args.quick else "12.1M-parameter Llama (trainbench_setup.ModelShape)",
            "workload": args.workload,
            "batch": args.batch,
            "warmup": args.warmup,
            "steps": args.steps,
            "repeats": args.repeats,
            "threads": args.threads,
        },
    }


def _cell(values: list[float], fmt: str) -> str:
    med = statistics.median(values)
    return f"{med:{fmt}}" if len(values) == 1 else f"{med:{fmt}} ({min(values):{fmt}}–{max(values):{fmt}})"


def markdown(res: dict[str, Any]) -> str:
    m = res["meta"]
    v = m["versions"]
    out = [
        f"{m['date']}, {m['machine']}, {m['threads']} thread(s); {m['model']}, {m['workload']} pairs, "
        f"{m['batch']} pairs/step, {m['warmup']} warm-up + {m['steps']} timed steps, {m['repeats']} repeat(s) per "
        f"side, alternating; torch {v.get('torch', '?')}, transformers {v.get('transformers', '?')}, "
        f"trl {v.get('trl', '?')}.",
        "",
        "| adapter loss= | vs TRL | TRL s/step | adapter s/step | time adapter/TRL | TRL peak MB | adapter peak MB "
        "| memory adapter/TRL |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for row in res["rows"]:
        t, a = row["sides"]["trl"], row["sides"]["adapter"]
        out.append(
            f'| `{row["case"]}` | `loss_type="sigmoid"` | {_cell([x["step_s"] for x in t], ".3f")} '
            f"| {_cell([x['step_s'] for x in a], '.3f')} | {_cell(row['time_ratio'], '.3f')} "
            f"| {_cell([x['peak_rss_mb'] for x in t], '.0f')} | {_cell([x['peak_rss_mb'] for x in a], '.0f')} "
            f"| {_cell(row['memory_ratio'], '.3f')} |"
        )
    return "\n".join(out) + "\n"


def write_page(path: Path, table: str) -> None:
    """Replace the block between BEGIN and END in ``path`` (append it when absent)."""
    block = f"{BEGIN}\n{table}{END}"
    text = path.read_text() if path.is_file() else ""
    if BEGIN in text and END in text:
        text = text[: text.index(BEGIN)] + block + text[text.index(END) + len(END) :]
    else:
        text += "\n" + block + "\n"
    path.write_text(text)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument(
        "--quick", action="store_true", help="CI smoke: tiny model and workload, dpo only, 1 repeat, 1+2 steps"
    )
    p.add_argument("--cases", nargs="+", default=list(CASES), choices=list(CASES))
    p.add_argument("--workload", default="ultrafeedback", choices=sorted(WORKLOADS))
    p.add_argument("--repeats", type=int, default=3, help="runs per side (alternating)")
    p.add_argument("--warmup", type=int, default=1, help="steps excluded from the timing")
    p.add_argument("--steps", type=int, default=3, help="timed steps per run")
    p.add_argument("--batch", type=int, default=4, help="pairs per step")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--timeout", type=float, default=1800, help="seconds per run before it is killed")
    p.add_argument("--cache", default=str(HERE / ".cache"), help="where the model folder is built once")
    p.add_argument("--out", default=str(HERE / "results" / "trl_adapter"), help="results .json/.md prefix")
    p.add_argument("--write-page", default=None, help="markdown page whose trl-adapter block is replaced")
    args = p.parse_args(argv)
    if args.quick:
        args.workload, args.repeats, args.warmup, args.steps = "tiny", 1, 1, 2
        args.cases = args.cases if argv and "--cases" in argv else ["dpo"]
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    res = run(args)
    table = markdown(res)
    print(table)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".json").write_text(json.dumps(res, indent=1))
    out.with_suffix(".md").write_text(table)
    if args.write_page:
        write_page(Path(args.write_page), table)
    return 0


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    raise SystemExit(main())
