"""prefzoo vs TRL 1.16 training throughput and peak memory, same model, data, batch, optimizer, alternating in one run.

    python benchmarks/bench_train_throughput.py --quick            # CI smoke: ultrafeedback, dpo + simpo, 1 repeat
    python benchmarks/bench_train_throughput.py --write-page docs/results/performance.md   # the full results page

Each run is its own subprocess (so peak RSS is per run); within a repeat the two sides run back to back, and the
side that goes first alternates between repeats.  Ratios are prefzoo / TRL per repeat: median and min–max.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from trainbench_setup import (
    TINY_SHAPE,
    WORKLOADS,
    ModelShape,
    build_model_dir,
    flop_bound,
    machine,
    make_pairs,
    replace_block,
    versions,
)

HERE = Path(__file__).resolve().parent
BEGIN, END = "<!-- bench:begin -->", "<!-- bench:end -->"

# case -> how each side runs it.  TRL's fastest CPU settings: fp32 (bf16=False) and gradient checkpointing off.
TRL_FAST = {"bf16": False, "gradient_checkpointing": False}
CASES: dict[str, dict[str, Any]] = {
    "dpo": {"loss": "dpo", "trl_trainer": "dpo", "reference": "forward"},
    "dpo-precompute-3ep": {
        "loss": "dpo",
        "trl_trainer": "dpo",
        "reference": "precomputed",
        "precompute": True,
        "epochs": 3,
    },
    "dpo-lora": {"loss": "dpo", "trl_trainer": "dpo", "reference": "forward", "lora": True},
    "simpo": {
        "loss": "simpo",
        "loss_params": {"beta": 2.0, "gamma_beta_ratio": 0.5},
        "trl_trainer": "cpo",
        "reference": "none",
        "trl_loss": {"loss_type": "simpo", "cpo_alpha": 0.0, "beta": 2.0, "simpo_gamma": 1.0},
    },
    "mmpo": {"loss": "mmpo", "trl_trainer": "dpo", "reference": "forward"},
    "dpo-trl-defaults": {"loss": "dpo", "trl_trainer": "dpo", "reference": "forward", "trl_defaults": True},
}
TARGETS = {  # (min tokens/s ratio, max peak-memory ratio): issue 17's goals, with the default flags
    "dpo": (5.0, 0.4),
    "dpo-lora": (5.0, 0.4),
    "simpo": (3.0, 0.4),
    "mmpo": (5.0, 0.4),
    "dpo-precompute-3ep": (2.0, None),  # issue 6's
    "dpo-trl-defaults": (None, None),
}
MIN_EFFICIENCY = 0.6  # issue 17: prefzoo at ≥ 60% of the FLOP lower bound in every case


def _run_child(spec: dict[str, Any], threads: int, timeout: float) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="trainbench-spec-") as tmp:
        spec_path, out_path = Path(tmp) / "spec.json", Path(tmp) / "result.json"
        spec_path.write_text(json.dumps(spec))
        env = {
            **os.environ,
            "OMP_NUM_THREADS": str(threads),
            "MKL_NUM_THREADS": str(threads),
            "TOKENIZERS_PARALLELISM": "false",
            "PREFZOO_DISABLE_PLUGIN_AUTOLOAD": "1",
            "HF_HUB_OFFLINE": "1",
            "HF_DATASETS_OFFLINE": "1",
            "TQDM_DISABLE": "1",
            "HF_DATASETS_CACHE": str(Path(tmp) / "hfds"),
            "PYTHONPATH": os.pathsep.join([str(HERE), str(HERE.parent)]),  # this checkout, not an install
        }
        proc = subprocess.run(
            [sys.executable, str(HERE / "trainbench_child.py"), str(spec_path), str(out_path)],
            env=env,
            capture_output=True,
            text=True,
            timeout=timeout,
        )
        if proc.returncode != 0 or not out_path.is_file():
            raise RuntimeError(f"{spec['side']} {spec['case']} failed (exit {proc.returncode}):\n{proc.stderr[-4000:]}")
        return json.loads(out_path.read_text())


def _summarize(
    run: dict[str, Any], case: dict[str, Any], shape: ModelShape, warmup: int, pairs: list[dict[str, Any]]
) -> dict[str, Any]:
    """Median step time, tokens/s, and the FLOP bound of the timed steps for one run."""
    steps, tokens, batches = run["step_s"], run["tokens"], run["batches"]
    lora = bool(case.get("lora"))
    precompute = bool(case.get("precompute"))  # whole multi-epoch run: precomputation + every step
    timed = range(len(steps)) if precompute else range(min(warmup, len(steps) - 1), len(steps))
    total_s = run["precompute_s"] + sum(steps) if precompute else sum(steps[k] for k in timed)

    def bound_of(attention: bool) -> float:
        if not precompute:
            return sum(flop_bound(shape, batches[k], case["reference"], lora, attention=attention) for k in timed)
        plain = [{"prompt": p["prompt"], "chosen": p["chosen"], "rejected": p["rejected"]} for p in pairs]
        ref_once = flop_bound(shape, plain, "forward", lora, attention=attention) - flop_bound(
            shape, plain, "none", lora, attention=attention
        )
        return sum(flop_bound(shape, batches[k], "none", lora, attention=attention) for k in timed) + ref_once

    bound, bound_no_attention = bound_of(True), bound_of(False)
    n_tokens = sum(tokens[k] for k in timed)
    return {
        "median_step_s": statistics.median(steps[k] for k in timed),
        "tokens_per_s": n_tokens / total_s,
        "total_s": total_s,
        "peak_rss_mb": run["peak_rss_mb"],
        "bound_s": bound / run["matmul_flops"],
        "efficiency": bound / run["matmul_flops"] / total_s,
        "efficiency_no_attention": bound_no_attention / run["matmul_flops"] / total_s,
        "matmul_gflops": run["matmul_flops"] / 1e9,
        "precompute_s": run["precompute_s"],
        "steps": len(timed),
    }


def _spread(values: list[float]) -> dict[str, float]:
    return {"median": statistics.median(values), "min": min(values), "max": max(values)}


def _entry(workload: str, case: str, per_side: dict[str, list[dict[str, Any]]]) -> dict[str, Any]:
    """Per-side spreads of every run summary and, with both sides, the per-repeat prefzoo / TRL ratios."""
    entry: dict[str, Any] = {"workload": workload, "case": case, "sides": {}}
    for side, runs in per_side.items():
        entry["sides"][side] = {k: _spread([x[k] for x in runs]) for k in runs[0] if k != "steps"}
        entry["sides"][side]["runs"] = runs
    if set(per_side) == {"prefzoo", "trl"}:
        pairs_ = list(zip(per_side["prefzoo"], per_side["trl"], strict=True))
        entry["speed_ratio"] = _spread([a["tokens_per_s"] / b["tokens_per_s"] for a, b in pairs_])
        entry["memory_ratio"] = _spread([a["peak_rss_mb"] / b["peak_rss_mb"] for a, b in pairs_])
    return entry


def run_benchmark(args: argparse.Namespace) -> dict[str, Any]:
    shape = TINY_SHAPE if args.tiny else ModelShape()
    model_dir = build_model_dir(Path(args.cache) / ("tiny-llama" if args.tiny else "llama-12m"), shape)
    results: dict[str, Any] = {"cases": []}
    for wl_name in args.workloads:
        wl = WORKLOADS[wl_name]
        for case_name in args.cases:
            case = CASES[case_name]
            if case.get("precompute"):
                n_pairs, max_steps = args.batch * 2, None  # 2 steps per epoch × 3 epochs
            else:
                n_pairs, max_steps = args.batch * (args.warmup + args.steps), args.warmup + args.steps
            pairs = make_pairs(wl, n_pairs, shape.vocab_size, seed=1)
            lengths = [
                {
                    "prompt": len(p["prompt"].split()),
                    "chosen": len(p["chosen"].split()) + 1,
                    "rejected": len(p["rejected"].split()) + 1,
                }
                for p in pairs
            ]  # + eos
            per_side: dict[str, list[dict[str, Any]]] = {s: [] for s in args.sides}
            raw: dict[str, list[dict[str, Any]]] = {s: [] for s in args.sides}
            for r in range(args.repeats):
                order = list(args.sides) if r % 2 == 0 else list(reversed(args.sides))
                for side in order:
                    spec = {
                        "side": side,
                        "case": case_name,
                        "model_dir": str(model_dir),
                        "threads": args.threads,
                        "batch": args.batch,
                        "pairs": pairs,
                        "max_steps": max_steps,
                        "epochs": case.get("epochs", 1),
                        "loss": case["loss"],
                        "loss_params": case.get("loss_params", {}),
                        "lora": case.get("lora", False),
                        "precompute": case.get("precompute", False),
                        "trl_trainer": case["trl_trainer"],
                        "trl_loss": case.get("trl_loss", {}),
                        "trl_options": {"bf16": False} if case.get("trl_defaults") else TRL_FAST,
                        "prefzoo_options": args.prefzoo_options,
                    }
                    t0 = time.time()
                    run = _run_child(spec, args.threads, args.timeout)
                    summ = _summarize(run, case, shape, args.warmup, lengths)
                    per_side[side].append(summ)
                    raw[side].append(run)
                    print(
                        f"[{wl_name} {case_name} r{r} {side}] {summ['median_step_s']:.2f} s/step "
                        f"{summ['tokens_per_s']:.0f} tok/s peak {summ['peak_rss_mb']:.0f} MB "
                        f"eff {summ['efficiency']:.0%} (wall {time.time() - t0:.0f} s)",
                        flush=True,
                    )
            results["cases"].append(_entry(wl_name, case_name, per_side))
    return results


def _versions() -> dict[str, str]:
    return versions("torch", "transformers", "accelerate", "trl", "peft", "prefzoo")


_machine = machine


def _verdict(entry: dict[str, Any]) -> str:
    lo_speed, hi_mem = TARGETS.get(entry["case"], (None, None))
    if "speed_ratio" not in entry:
        return ""
    notes = []
    if lo_speed is not None:
        s = entry["speed_ratio"]["median"]
        notes.append(f"speed {'met' if s >= lo_speed else f'MISSED ({s / lo_speed:.0%} of {lo_speed:g}×)'}")
    if hi_mem is not None:
        m = entry["memory_ratio"]["median"]
        notes.append(f"memory {'met' if m <= hi_mem else f'MISSED ({m:.2f} > {hi_mem:g})'}")
    e = entry["sides"]["prefzoo"]["efficiency"]["median"]
    notes.append(f"FLOP bound {'met' if e >= MIN_EFFICIENCY else f'MISSED ({e:.0%} < {MIN_EFFICIENCY:.0%})'}")
    return "; ".join(notes)


def markdown(results: dict[str, Any]) -> str:
    meta = results["meta"]
    lines = [
        f"Run {meta['date']} on {meta['machine']}; {meta['threads']} threads; fp32; "
        f"{meta['batch']} pairs per step, accumulation 1, AdamW; {meta['warmup']} warm-up step(s) excluded, "
        f"{meta['steps']} timed; {meta['repeats']} repeat(s) per side, alternating.",
        "",
        "Versions: " + ", ".join(f"{k} {v}" for k, v in meta["versions"].items()),
        "",
        f"Command: `{meta['command']}`",
        "",
        "| workload | case | prefzoo s/step | prefzoo tok/s | prefzoo peak RSS | TRL s/step | TRL tok/s | TRL peak RSS "
        "| speed ×TRL (min–max) | memory ×TRL (min–max) | eff. prefzoo / TRL | targets |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for e in results["cases"]:
        pz, trl = e["sides"].get("prefzoo"), e["sides"].get("trl")

        def cell(side: dict[str, Any] | None, key: str, fmt: str) -> str:
            return format(side[key]["median"], fmt) if side else "-"

        sr, mr = e.get("speed_ratio"), e.get("memory_ratio")
        speed = f"{sr['median']:.2f}× ({sr['min']:.2f}–{sr['max']:.2f})" if sr else "-"
        mem = f"{mr['median']:.2f} ({mr['min']:.2f}–{mr['max']:.2f})" if mr else "-"
        eff = f"{cell(pz, 'efficiency', '.0%')} / {cell(trl, 'efficiency', '.0%')}"
        if pz and "efficiency_no_attention" in pz:  # results written before 2026-11-27 have the looser bound only
            eff += f" ({cell(pz, 'efficiency_no_attention', '.0%')} without attention)"
        lines.append(
            f"| {e['workload']} | {e['case']} | {cell(pz, 'median_step_s', '.2f')} | {cell(pz, 'tokens_per_s', '.0f')} "
            f"| {cell(pz, 'peak_rss_mb', '.0f')} MB | {cell(trl, 'median_step_s', '.2f')} "
            f"| {cell(trl, 'tokens_per_s', '.0f')} | {cell(trl, 'peak_rss_mb', '.0f')} MB | {speed} | {mem} "
            f"| {eff} | {_verdict(e)} |"
        )
    gf = [r["matmul_gflops"] for e in results["cases"] for s in e["sides"].values() for r in s["runs"]]
    lines += [
        "",
        f"fp32 matmul rate measured in each run: median {statistics.median(gf):.0f} GFLOP/s "
        f"(min {min(gf):.0f}, max {max(gf):.0f}); efficiency = FLOP lower bound / rate / measured time; the bound "
        "counts the causal attention's minimum (trainbench_setup.flop_bound), in parentheses the bound without it.",
    ]
    return "\n".join(lines) + "\n"


def write_page(path: Path, table: str) -> None:
    """Replace the text between the bench markers of ``path`` (or create the page) with ``table``."""
    text = path.read_text() if path.is_file() else f"# Training performance\n\n{BEGIN}\n{END}\n"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(replace_block(text, BEGIN, END, table))


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="CI smoke: ultrafeedback, dpo and simpo, 1 repeat, 1+1 steps")
    p.add_argument("--tiny", action="store_true", help="a tiny model and workload (the test suite's smoke run)")
    p.add_argument("--workloads", nargs="+", default=None, choices=sorted(WORKLOADS))
    p.add_argument("--cases", nargs="+", default=None, choices=list(CASES))
    p.add_argument("--sides", nargs="+", default=["prefzoo", "trl"], choices=["prefzoo", "trl"])
    p.add_argument("--repeats", type=int, default=3, help="runs per side (alternating)")
    p.add_argument("--warmup", type=int, default=1, help="steps excluded from the timing")
    p.add_argument("--steps", type=int, default=3, help="timed steps per run")
    p.add_argument("--batch", type=int, default=4, help="pairs per step (per device)")
    p.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    p.add_argument("--timeout", type=float, default=1800, help="seconds per run before it is killed")
    p.add_argument(
        "--prefzoo-option",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="extra TrainConfig field for the prefzoo side (repeatable), e.g. logp_chunk_size=512",
    )
    p.add_argument("--cache", default=str(HERE / ".cache"), help="where the model folder is built once")
    p.add_argument("--out", default=str(HERE / "results" / "train_throughput"), help="results .json/.md prefix")
    p.add_argument("--write-page", default=None, help="markdown page whose bench block is replaced")
    p.add_argument(
        "--merge",
        nargs="+",
        default=None,
        metavar="JSON",
        help="run nothing: render (and --write-page) the union of earlier results files",
    )
    args = p.parse_args(argv)
    if args.quick:
        args.workloads = args.workloads or ["ultrafeedback"]
        args.cases = args.cases or ["dpo", "simpo"]
        args.repeats, args.warmup, args.steps = 1, 1, 1
    if args.tiny:
        args.workloads = args.workloads or ["tiny"]
    args.workloads = args.workloads or ["ultrafeedback", "orca"]
    args.cases = args.cases or [c for c in CASES if c != "dpo-trl-defaults"]
    args.prefzoo_options = {}
    for kv in args.prefzoo_option:
        k, _, v = kv.partition("=")
        args.prefzoo_options[k] = _parse_value(v)
    return args


def _parse_value(text: str) -> Any:
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return text


def merge_results(paths: list[str]) -> dict[str, Any]:
    """The cases of several results files in order; meta of the first, with each file's command and date."""
    loaded = [json.loads(Path(p).read_text()) for p in paths]
    meta = dict(loaded[0]["meta"])
    meta["command"] = "`; `".join(r["meta"]["command"] for r in loaded)
    meta["date"] = ", ".join(dict.fromkeys(r["meta"]["date"] for r in loaded))
    meta["repeats"] = "/".join(str(r["meta"]["repeats"]) for r in loaded)
    meta["steps"] = "/".join(str(r["meta"]["steps"]) for r in loaded)
    grouped: dict[tuple[str, str], dict[str, list[dict[str, Any]]]] = {}
    for r in loaded:  # the same (workload, case) from several files: its repeats are pooled
        for c in r["cases"]:
            sides = grouped.setdefault((c["workload"], c["case"]), {})
            for side, data in c["sides"].items():
                sides.setdefault(side, []).extend(data["runs"])
    return {"cases": [_entry(wl, case, sides) for (wl, case), sides in grouped.items()], "meta": meta}


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.merge:
        results = merge_results(args.merge)
        table = markdown(results)
        print(table)
        if args.write_page:
            write_page(Path(args.write_page), table)
        return 0
    results = run_benchmark(args)
    results["meta"] = {
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "machine": _machine(),
        "threads": args.threads,
        "batch": args.batch,
        "warmup": args.warmup,
        "steps": args.steps,
        "repeats": args.repeats,
        "versions": _versions(),
        "command": " ".join(["python", "benchmarks/bench_train_throughput.py", *sys.argv[1:]]),
        "shape": asdict(TINY_SHAPE if args.tiny else ModelShape()),
    }
    table = markdown(results)
    print(table)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".json").write_text(json.dumps(results, indent=1))
    out.with_suffix(".md").write_text(table)
    if args.write_page:
        write_page(Path(args.write_page), table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
