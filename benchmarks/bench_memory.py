"""Memory per rank and step time: DDP, FSDP2 (full / shard_grad_op) and DeepSpeed ZeRO-2 / ZeRO-3 on N CPU ranks.

    nice -n 19 python benchmarks/bench_memory.py --write-page docs/results/performance-memory.md  # ~110M-param Llama
    python benchmarks/bench_memory.py --quick                                              # CI smoke, tiny model

Every engine trains the same random-init Llama on the same synthetic pairs with the same global batch (N ranks ×
``--per-device-batch-size`` pairs, accumulation 1, fp32 AdamW) for a few steps; each engine is one ``torchrun``
launch of benchmarks/memorybench_child.py, one engine at a time, and each rank measures itself (RSS sampled every
5 ms during the steps, its parameter and optimizer-state bytes).  Step time is the median over the steps after the
first.  Nothing here is asserted: memory and time are measured and printed.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from trainbench_setup import (
    TINY_SHAPE,
    ModelShape,
    Workload,
    build_model_dir,
    machine,
    make_pairs,
    replace_block,
    versions,
)

HERE = Path(__file__).resolve().parent
BEGIN, END = "<!-- bench-memory:begin -->", "<!-- bench-memory:end -->"
MB = 2**20

# ≈110M parameters: 24.6M tied embedding (32,000 × 768) + 12 layers × 7.08M (GPT-2-small / Llama proportions)
FULL_SHAPE = ModelShape(
    vocab_size=32000, hidden_size=768, intermediate_size=2048, num_hidden_layers=12, num_attention_heads=12
)
WORKLOAD = Workload("short", prompt=(16, 32), completion=(16, 32))  # short pairs: the model's state dominates
TINY_WORKLOAD = Workload("tiny", prompt=(4, 12), completion=(3, 9))

ENGINES: dict[str, dict[str, Any]] = {  # name -> TrainConfig options
    "ddp": {},
    "fsdp2-full": {"fsdp": True, "fsdp_sharding": "full"},
    "fsdp2-shard_grad_op": {"fsdp": True, "fsdp_sharding": "shard_grad_op"},
    "zero2": {"deepspeed": "zero2"},
    "zero3": {"deepspeed": "zero3"},
    # ZeRO-3 with buckets and live-parameter limits below this model's size (DeepSpeed's defaults, 5e8 / 1e9
    # elements, are sized for billion-parameter models: at 110M they gather every layer and bucket every gradient)
    "zero3-small-buckets": {"deepspeed": {
        "zero_optimization": {"stage": 3, "overlap_comm": False, "contiguous_gradients": True,
                              "reduce_bucket_size": 10**7, "stage3_prefetch_bucket_size": 10**7,
                              "stage3_max_live_parameters": 10**7, "stage3_max_reuse_distance": 10**7,
                              "stage3_gather_16bit_weights_on_model_save": True},  # the final model folder
        "zero_allow_untested_optimizer": True}},
}  # fmt: skip


def _env(tmp: Path, mmap_threshold: int) -> dict[str, str]:
    return {
        **os.environ,
        # glibc returns a freed block to the OS only if it was mmapped; its default threshold grows (up to 32 MiB) as
        # large blocks are freed, so per-layer buffers (FSDP2's all-gathers, ZeRO-3's) end up kept in the heap and
        # RSS shows the allocator's high-water mark rather than live tensors.  A fixed threshold stops the growth.
        **({"MALLOC_MMAP_THRESHOLD_": str(mmap_threshold)} if mmap_threshold > 0 else {}),
        "OMP_NUM_THREADS": "1",
        "MKL_NUM_THREADS": "1",
        "TOKENIZERS_PARALLELISM": "false",
        "PREFZOO_DISABLE_PLUGIN_AUTOLOAD": "1",
        "DS_ACCELERATOR": "cpu",
        "HF_HUB_OFFLINE": "1",
        "HF_DATASETS_OFFLINE": "1",
        "TQDM_DISABLE": "1",
        "HF_DATASETS_CACHE": str(tmp / "hfds"),
        "PYTHONPATH": os.pathsep.join([str(HERE), str(HERE.parent)]),  # this checkout, not an install
    }


def run_engine(
    name: str, spec: dict[str, Any], nproc: int, tmp: Path, timeout: float, mmap_threshold: int = 0
) -> list[dict[str, Any]]:
    """One torchrun launch of ``nproc`` ranks training with engine ``name``; each rank's measurements, by rank."""
    out = tmp / name
    out.mkdir(parents=True)
    spec_path = out / "spec.json"
    options = dict(ENGINES[name])
    if isinstance(options.get("deepspeed"), dict):  # a DeepSpeed config of its own: --deepspeed path/to.json
        (out / "ds_config.json").write_text(json.dumps(options["deepspeed"]))
        options["deepspeed"] = str(out / "ds_config.json")
    spec_path.write_text(json.dumps({**spec, "options": options}))
    cmd = [sys.executable, "-m", "torch.distributed.run", f"--nproc_per_node={nproc}", "--standalone",
           str(HERE / "memorybench_child.py"), str(spec_path), str(out)]  # fmt: skip
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, env=_env(tmp, mmap_threshold), capture_output=True, text=True, timeout=timeout)
    files = [out / f"rank-{r}.json" for r in range(nproc)]
    if proc.returncode != 0 or not all(f.is_file() for f in files):
        raise RuntimeError(f"{name} failed (exit {proc.returncode}):\n{proc.stdout[-2000:]}\n{proc.stderr[-4000:]}")
    ranks = [json.loads(f.read_text()) for f in files]
    for r in ranks:
        r["wall_s"] = time.perf_counter() - t0
    return ranks


def summarize(name: str, ranks: list[dict[str, Any]]) -> dict[str, Any]:
    """Per-engine row: the largest rank's memory figures, the median step time after the first step."""
    steps = [statistics.median(r["step_s"][1:] or r["step_s"]) for r in ranks]
    worst = {k: max(r[k] for r in ranks) for k in
             ("import_rss_mb", "setup_rss_mb", "step_peak_rss_mb", "process_peak_rss_mb", "params_mb",
              "optim_state_mb", "master_mb")}  # fmt: skip
    return {
        "engine": name,
        **worst,
        "params": ranks[0]["params"],
        "median_step_s": max(steps),
        "steps": len(ranks[0]["step_s"]),
        "final_loss": statistics.fmean(r["losses"][-1] for r in ranks),
        "wall_s": ranks[0]["wall_s"],
        "ranks": ranks,
    }


def expected_mb(engine: str, params: int, world: int) -> float:
    """The model-state formula (fp32 AdamW, Ψ parameters, N ranks): bytes per rank of params + grads + moments.

    DDP and ZeRO-2 keep all 4Ψ of parameters on every rank; DDP also all 4Ψ of gradients and 8Ψ of moments;
    ZeRO-2 partitions gradients, moments and its fp32 master copy (4Ψ + 16Ψ/N); FSDP2 and ZeRO-3 partition all
    of it (16Ψ/N; ZeRO-3 20Ψ/N with its master copy), plus, transiently, the largest gathered unit.
    """
    per = {"ddp": 16.0, "zero2": 4 + 16 / world}.get(engine, 20 / world if engine.startswith("zero3") else 16 / world)
    return per * params / MB


def _versions() -> dict[str, str]:
    return versions("torch", "transformers", "accelerate", "deepspeed", "prefzoo")


_machine = machine


def _mb(x: float) -> str:
    return f"{x:.0f} MB" if abs(x) >= 10 else f"{x:.2f} MB"  # the --quick model's state is well under 1 MB


def markdown(results: dict[str, Any]) -> str:
    meta, rows = results["meta"], results["rows"]
    lines = [
        f"Run {meta['date']} on {meta['machine']}; {meta['world']} gloo ranks, 1 thread each; "
        f"Llama with {meta['params'] / 1e6:.1f}M parameters ({meta['shape']}); loss `{meta['loss']}`; fp32 AdamW; "
        f"{meta['world']} × {meta['per_device_batch_size']} = {meta['global_batch']} pairs per step, "
        f"{meta['steps']} steps, step time the median after the first; glibc MALLOC_MMAP_THRESHOLD_="
        f"{meta.get('mmap_threshold') or 'dynamic (default)'}.",
        "",
        "Versions: " + ", ".join(f"{k} {v}" for k, v in meta["versions"].items()),
        "",
        f"Command: `{meta['command']}`",
        "",
        "Per rank (the larger of the ranks); MB = 2^20 bytes.",
        "",
        "| engine | peak RSS in steps | RSS after setup | RSS after imports | peak − imports | params held "
        "| AdamW moments | master copy | formula (params+grads+moments+master) | s/step | final loss |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        peak, imports = r["step_peak_rss_mb"], r["import_rss_mb"]
        formula = expected_mb(r["engine"], meta["params"], meta["world"])
        mbs = [
            peak,
            r["setup_rss_mb"],
            imports,
            peak - imports,
            r["params_mb"],
            r["optim_state_mb"],
            r["master_mb"],
            formula,
        ]
        cells = " | ".join(_mb(x) for x in mbs)
        lines.append(f"| {r['engine']} | {cells} | {r['median_step_s']:.2f} | {r['final_loss']:.6f} |")
    return "\n".join(lines) + "\n"


def write_page(path: Path, table: str) -> None:
    """Replace the text between this benchmark's markers in ``path`` (or append a marked block) with ``table``."""
    text = path.read_text() if path.is_file() else ""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(replace_block(text, BEGIN, END, table))


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="CI smoke: a tiny Llama, 2 steps (about 30 s per engine)")
    p.add_argument("--engines", nargs="+", default=list(ENGINES), choices=list(ENGINES))
    p.add_argument("--nproc", type=int, default=2, help="gloo ranks (torchrun --nproc_per_node)")
    p.add_argument("--steps", type=int, default=None, help="optimizer steps (default 4; --quick 2)")
    p.add_argument("--per-device-batch-size", type=int, default=2, help="pairs per rank and step")
    p.add_argument("--loss", default="simpo", help="a reference-free loss keeps the table to the policy's state")
    p.add_argument("--cache", default=str(Path(tempfile.gettempdir()) / "prefzoo-bench-memory"), help="model cache")
    p.add_argument("--out", default=None, help="write the results as JSON here")
    p.add_argument("--write-page", default=None, help="replace this benchmark's block of a markdown page")
    p.add_argument(
        "--mmap-threshold",
        type=int,
        default=2**20,
        help="glibc MALLOC_MMAP_THRESHOLD_ of the ranks (0: glibc's dynamic default)",
    )
    p.add_argument("--timeout", type=float, default=1800.0, help="seconds per engine")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    for name in args.engines:
        if ENGINES[name].get("deepspeed") and importlib.util.find_spec("deepspeed") is None:
            raise SystemExit(
                f"bench_memory: {name} needs deepspeed: pip install 'prefzoo[deepspeed]', or drop it from --engines"
            )
    shape, workload = (TINY_SHAPE, TINY_WORKLOAD) if args.quick else (FULL_SHAPE, WORKLOAD)
    steps = args.steps or (2 if args.quick else 4)
    model_dir = build_model_dir(Path(args.cache) / ("tiny-llama" if args.quick else "llama-110m"), shape)
    global_batch = args.nproc * args.per_device_batch_size
    with tempfile.TemporaryDirectory(prefix="bench-memory-") as tmp_name:
        tmp = Path(tmp_name)
        data = tmp / "pairs.jsonl"  # one more step's worth than trained: no epoch end (no checkpoint) in the window
        pairs = make_pairs(workload, global_batch * (steps + 1), shape.vocab_size, seed=1)
        data.write_text("".join(json.dumps(p) + "\n" for p in pairs))
        spec = {"model_dir": str(model_dir), "dataset": str(data), "loss": args.loss, "steps": steps,
                "per_device_batch_size": args.per_device_batch_size}  # fmt: skip
        meta = {
            "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
            "machine": _machine(),
            "versions": _versions(),
            "command": "python benchmarks/bench_memory.py " + " ".join(argv if argv is not None else sys.argv[1:]),
            "world": args.nproc,
            "per_device_batch_size": args.per_device_batch_size,
            "global_batch": global_batch,
            "steps": steps,
            "loss": args.loss,
            "mmap_threshold": args.mmap_threshold,
            "shape": f"hidden {shape.hidden_size}, {shape.num_hidden_layers} layers, vocabulary {shape.vocab_size}",
        }
        results: dict[str, Any] = {"rows": [], "meta": meta}
        for name in args.engines:
            row = summarize(name, run_engine(name, spec, args.nproc, tmp, args.timeout, args.mmap_threshold))
            results["rows"].append(row)
            meta["params"] = row["params"]
            print(f"{name}: peak {row['step_peak_rss_mb']:.0f} MB/rank, {row['median_step_s']:.2f} s/step",
                  file=sys.stderr, flush=True)  # fmt: skip
            if args.out:  # after every engine: a stopped run keeps what it measured
                Path(args.out).write_text(json.dumps(results, indent=1))
    table = markdown(results)
    print(table)
    if args.write_page:
        write_page(Path(args.write_page), table)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
