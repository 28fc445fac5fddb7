"""How cost grows, prefzoo and TRL 1.16 side by side: step time and peak memory against completion length and batch
size, tokenisation time and disk cache against dataset size, and the fitted growth time ∝ tokens^a.

    python benchmarks/bench_growth.py --quick                      # CI smoke: tiny model, 2 lengths, 1 dataset size
    python benchmarks/bench_growth.py --curves length batch data   # the docs tables and plot (the 12M-param Llama)

Step curves (``length``, ``batch``): each point is one whole training run per side in its own process
(``trainbench_child.py``, as ``bench_train_throughput.py`` runs them: prefzoo's trainer with its default flags,
TRL's ``DPOTrainer`` in its fastest CPU setting), ``dpo`` with a frozen reference, random-word pairs with a
128-token prompt and chosen / rejected completions of exactly the given length (eos included); step time is the
median of the steps after the warm-up, peak memory the process's peak RSS, sides alternating point by point.
``data`` curve: N generated pairs written as JSON lines, loaded with ``datasets.load_dataset("json")``, then each
side's own preparation timed in its own process (prefzoo's ``prepare_datasets``, TRL's ``DPOTrainer._prepare_dataset``)
twice: first from scratch, then again (the ``datasets`` cache); the disk cache is what the preparation added to the
``datasets`` cache folder.  The exponent a is the least-squares slope of log time against log tokens (or pairs).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_train_throughput import TRL_FAST, _run_child
from trainbench_setup import TINY_SHAPE, ModelShape, Workload, build_model_dir, machine, make_pairs, versions

HERE = Path(__file__).resolve().parent
PROMPT = 128  # prompt tokens of every pair in the step curves
DATA_WORKLOAD = Workload("data", prompt=(20, 80), completion=(20, 120))  # dataset-size curve: ~50 / ~70 words


def fit_exponent(tokens: list[float], seconds: list[float]) -> float:
    """Least-squares slope a of log(seconds) = a·log(tokens) + c."""
    x = [math.log(t) for t in tokens]
    y = [math.log(s) for s in seconds]
    mx, my = sum(x) / len(x), sum(y) / len(y)
    den = sum((xi - mx) ** 2 for xi in x)
    return float("nan") if den == 0 else sum((xi - mx) * (yi - my) for xi, yi in zip(x, y, strict=True)) / den


def fixed_pairs(n: int, completion: int, vocab_size: int, prompt: int = PROMPT) -> list[dict[str, Any]]:
    """``n`` pairs: ``prompt`` words, completions of ``completion - 1`` words (+ eos = ``completion`` tokens)."""
    return make_pairs(Workload("fixed", (prompt, prompt), (completion - 1, completion - 1)), n, vocab_size, seed=1)


def step_point(
    side: str, model_dir: Path, shape: ModelShape, completion: int, batch: int, steps: int, timeout: float
) -> dict[str, Any]:
    """One whole ``dpo`` run of ``side`` (1 warm-up + ``steps`` timed): median step time, tokens, peak RSS."""
    spec = {
        "side": side, "case": "dpo", "model_dir": str(model_dir), "threads": 1, "batch": batch,
        "pairs": fixed_pairs(batch * (1 + steps), completion, shape.vocab_size), "max_steps": 1 + steps,
        "epochs": 1, "loss": "dpo", "loss_params": {}, "lora": False, "precompute": False, "trl_trainer": "dpo",
        "trl_loss": {}, "trl_options": {**TRL_FAST, "max_length": PROMPT + completion + 8},
        "prefzoo_options": {"max_prompt_length": PROMPT, "max_completion_length": completion},
    }  # fmt: skip
    try:
        run = _run_child(spec, 1, timeout)
    except subprocess.TimeoutExpired:
        return {"side": side, "completion": completion, "batch": batch, "error": f"over {timeout:.0f} s"}
    except RuntimeError as e:
        return {"side": side, "completion": completion, "batch": batch, "error": str(e).splitlines()[0]}
    timed = run["step_s"][1:] or run["step_s"]
    tokens = run["tokens"][1:] or run["tokens"]
    return {
        "side": side, "completion": completion, "batch": batch, "tokens": statistics.median(tokens),
        "step_s": statistics.median(timed), "peak_mb": run["peak_rss_mb"],
        "peak_steps_mb": run.get("peak_steps_mb"), "import_mb": run["rss_after_import_mb"],
    }  # fmt: skip


def _du(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


def _data_child(spec: dict[str, Any]) -> dict[str, Any]:
    """Load the JSON lines; time ``side``'s preparation and the MB it adds to the ``datasets`` cache; time it again."""
    import datasets
    from transformers import AutoTokenizer

    cache = Path(spec["hf_cache"])
    ds = datasets.load_dataset("json", data_files=spec["jsonl"], split="train", cache_dir=str(cache))
    tok = AutoTokenizer.from_pretrained(spec["model_dir"])
    before = _du(cache)
    if spec["side"] == "prefzoo":
        from prefzoo.train import TrainConfig
        from prefzoo.train.setup.splits import SplitSettings, prepare_datasets

        run = TrainConfig(model=spec["model_dir"], eval_fraction=0.0, report_to="none", progress=False)
        cfg = SplitSettings(run.data, run.evaluation, run.seed, run.progress)
        t0 = time.perf_counter()
        prepare_datasets(cfg, tok, train=ds)
        first_s, cache_mb = time.perf_counter() - t0, (_du(cache) - before) / 2**20
        t0 = time.perf_counter()
        rows = len(prepare_datasets(cfg, tok, train=ds)[0])
    else:
        from trl import DPOConfig, DPOTrainer

        calls: list[tuple[Any, Any, float]] = []  # (args, kwargs, seconds) of each call TRL's constructor makes
        original = DPOTrainer._prepare_dataset

        def record(*a: Any, **k: Any) -> Any:
            t0 = time.perf_counter()
            out = original(*a, **k)
            calls.append((a, k, time.perf_counter() - t0))
            return out

        DPOTrainer._prepare_dataset = record  # type: ignore[method-assign]
        args = DPOConfig(output_dir=str(Path(spec["workdir"]) / "out"), bf16=False, use_cpu=True, report_to="none",
                         max_length=1024, disable_tqdm=True)  # fmt: skip
        DPOTrainer(model=spec["model_dir"], args=args, train_dataset=ds, processing_class=tok)
        a, k, first_s = calls[0]
        cache_mb = (_du(cache) - before) / 2**20
        t0 = time.perf_counter()
        rows = len(original(*a, **k))
    return {"first_s": first_s, "cached_s": time.perf_counter() - t0, "cache_mb": cache_mb, "rows": rows}


def data_point(side: str, model_dir: Path, jsonl: Path, n: int, timeout: float) -> dict[str, Any]:
    """``side``'s tokenisation of ``n`` pairs from ``jsonl`` in a fresh process with an empty ``datasets`` cache."""
    with tempfile.TemporaryDirectory(prefix="growth-data-") as tmp:
        spec = {"side": side, "model_dir": str(model_dir), "jsonl": str(jsonl), "hf_cache": f"{tmp}/hf",
                "workdir": tmp}  # fmt: skip
        env = {**os.environ, "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false", "HF_HUB_OFFLINE": "1",
               "HF_DATASETS_OFFLINE": "1", "TQDM_DISABLE": "1", "HF_DATASETS_CACHE": f"{tmp}/hf",
               "PREFZOO_DISABLE_PLUGIN_AUTOLOAD": "1",
               "PYTHONPATH": os.pathsep.join([str(HERE), str(HERE.parent)])}  # fmt: skip
        try:
            out = subprocess.run([sys.executable, __file__, "--data-child", json.dumps(spec)], env=env,
                                 capture_output=True, text=True, timeout=timeout, check=False)  # fmt: skip
        except subprocess.TimeoutExpired:
            return {"side": side, "pairs": n, "error": f"over {timeout:.0f} s"}
        if out.returncode != 0:
            return {"side": side, "pairs": n, "error": out.stderr.strip().splitlines()[-1][:300]}
        return {"side": side, "pairs": n, **json.loads(out.stdout.strip().splitlines()[-1])}


def write_jsonl(path: Path, n: int, vocab_size: int) -> Path:
    if not path.is_file():
        path.parent.mkdir(parents=True, exist_ok=True)
        rows = make_pairs(DATA_WORKLOAD, n, vocab_size, seed=2)
        path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def _fits(rows: list[dict[str, Any]], x: str, y: str) -> dict[str, float]:
    """Per side, the exponent of ``y`` against ``x`` over the points that ran."""
    out = {}
    for side in ("prefzoo", "trl"):
        ok = [r for r in rows if r["side"] == side and "error" not in r]
        if len(ok) >= 2:
            out[side] = fit_exponent([r[x] for r in ok], [r[y] for r in ok])
    return out


def _steps_peak(r: dict[str, Any]) -> float | None:
    """Peak RSS of the steps alone where measured (TRL loads nothing big before its steps: its process peak)."""
    return r.get("peak_steps_mb") or (r["peak_mb"] if r["side"] == "trl" else None)


def step_table(rows: list[dict[str, Any]], key: str) -> list[str]:
    """Side-by-side markdown rows of a step curve over ``key`` (completion or batch)."""
    lines = [f"| {key} | tokens / step | prefzoo s/step | TRL s/step | speed ×TRL | prefzoo peak MB: process (steps) | "
             "TRL peak MB | memory ×TRL: process (steps) |",
             "| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]  # fmt: skip
    for v in dict.fromkeys(r[key] for r in rows):
        missing: dict[str, Any] = {"error": "not run"}
        ran = sorted(rows, key=lambda r: "error" in r)  # a measured point before a skipped one (merged files)
        pz = next((r for r in ran if r[key] == v and r["side"] == "prefzoo"), missing)
        trl = next((r for r in ran if r[key] == v and r["side"] == "trl"), missing)
        tok = pz.get("tokens", trl.get("tokens", "-"))

        def cell(r: dict[str, Any], k: str, fmt: str) -> str:
            return format(r[k], fmt) if k in r else f"({r['error']})"

        ok = "error" not in pz and "error" not in trl
        speed = f"{trl['step_s'] / pz['step_s']:.2f}×" if ok else "-"
        pz_steps = _steps_peak(pz) if "error" not in pz else None
        mem = f"{pz['peak_mb'] / trl['peak_mb']:.2f}" if ok else "-"
        if ok and pz_steps:
            mem += f" ({pz_steps / trl['peak_mb']:.2f})"
        pz_mem = cell(pz, "peak_mb", ".0f") + (f" ({pz_steps:.0f})" if pz_steps else "")
        lines.append(f"| {v} | {tok:.0f} | {cell(pz, 'step_s', '.2f')} | {cell(trl, 'step_s', '.2f')} | {speed} | "
                     f"{pz_mem} | {cell(trl, 'peak_mb', '.0f')} | {mem} |")  # fmt: skip
    lines.append(_fit_line(rows, "tokens", "step_s", "step time"))
    return lines


def _fit_line(rows: list[dict[str, Any]], x: str, y: str, what: str) -> str:
    """The fitted growth exponent of ``y`` against ``x`` per side, as a sentence after a table ("" when none)."""
    fits = _fits(rows, x, y)
    if not fits:
        return ""
    return f"\nFitted {what} ∝ {x}^a: " + ", ".join(f"{s} a = {a:.2f}" for s, a in fits.items()) + "."


def data_table(rows: list[dict[str, Any]]) -> list[str]:
    lines = ["| pairs | side | first tokenisation (s) | again, cached (s) | disk cache (MB) |",
             "| ---: | --- | ---: | ---: | ---: |"]  # fmt: skip
    for r in rows:
        if "error" in r:
            lines.append(f"| {r['pairs']} | {r['side']} | ({r['error']}) | - | - |")
        else:
            lines.append(f"| {r['pairs']} | {r['side']} | {r['first_s']:.2f} | {r['cached_s']:.2f} | "
                         f"{r['cache_mb']:.1f} |")  # fmt: skip
    lines.append(_fit_line(rows, "pairs", "first_s", "tokenisation time"))
    return lines


def plot(results: dict[str, Any], path: Path) -> bool:
    """Log-log plot of every measured curve (both sides) into ``path``; False when matplotlib is missing."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    panels = [(c, x, y, lab) for c, x, y, lab in (
        ("length", "completion", "step_s", "step time (s)"), ("length", "completion", "peak_mb", "peak RSS (MB)"),
        ("batch", "batch", "step_s", "step time (s)"), ("batch", "batch", "peak_mb", "peak RSS (MB)"),
        ("data", "pairs", "first_s", "tokenisation (s)"), ("data", "pairs", "cache_mb", "disk cache (MB)"),
    ) if results.get(c)]  # fmt: skip
    if not panels:
        return False
    plt.rcParams.update({"font.size": 9, "axes.spines.top": False, "axes.spines.right": False})
    colors = {"prefzoo": "#0072B2", "trl": "#D55E00", "steps": "#009E73"}  # Okabe-Ito: colour-blind-safe
    from matplotlib.ticker import FuncFormatter

    plain = FuncFormatter(lambda v, _pos: f"{v:,.0f}" if v >= 1 else f"{v:g}")
    # label the minor ticks 2-5 of a decade only where a decade holds few major ticks (a short axis)
    minor = FuncFormatter(lambda v, _pos: f"{v:,.0f}" if v >= 1 and f"{v:.1e}"[0] in "25" else "")
    cols = min(len(panels), 3)  # three panels a row: each ~2.6 in wide at page width (8 in)
    rows = -(-len(panels) // cols)
    fig, axes = plt.subplots(rows, cols, figsize=(8.0, 0.6 + 2.6 * rows), squeeze=False, layout="constrained")
    for ax, (curve, x, y, label) in zip(axes.flat, panels, strict=False):
        for side, style in (("prefzoo", "o-"), ("trl", "s--")):
            pts = sorted((r[x], r[y]) for r in results[curve] if r["side"] == side and "error" not in r)
            name = "TRL 1.16" if side == "trl" else "prefzoo"  # the whole process: one entry with the time curves
            if pts:
                ax.plot(*zip(*pts, strict=True), style, color=colors[side], label=name)
            steps = sorted(
                (r[x], r["peak_steps_mb"]) for r in results[curve] if r["side"] == "prefzoo" and r.get("peak_steps_mb")
            )
            if y == "peak_mb" and side == "prefzoo" and steps:
                ax.plot(*zip(*steps, strict=True), "o:", color=colors["steps"], label="prefzoo, steps only")
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        for axis in (ax.xaxis, ax.yaxis):  # plain numbers (4, 10, 60; 256, 1024), not 4×10⁰ or 2⁸
            axis.set_major_formatter(plain)
            axis.set_minor_formatter(minor)
        ax.set_xlabel({"completion": "completion tokens", "batch": "pairs per step", "pairs": "pairs"}[x])
        ax.set_ylabel(label)
        ax.grid(True, which="both", alpha=0.3)
    for ax in list(axes.flat)[len(panels):]:
        ax.set_visible(False)
    labels: dict[str, object] = {}
    for ax in axes.flat:
        for h, lab in zip(*ax.get_legend_handles_labels(), strict=True):
            labels.setdefault(lab, h)
    fig.legend(list(labels.values()), list(labels), loc="outside lower center", ncol=len(labels), frameon=False)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=192)  # 2 × 96 dpi for a PNG
    return True


def run_curves(a: argparse.Namespace, argv: list[str] | None) -> tuple[dict[str, Any], dict[str, Any]]:
    """Measure every curve of ``a.curves``: (rows per curve, meta)."""
    if a.quick:
        shape, lengths, batches, sizes = replace(TINY_SHAPE, max_position_embeddings=512), [32, 64], [1, 2], [200]
        a.curves = ["length", "data"] if a.curves == ["length"] else a.curves
    else:  # 8192 positions (rope: no extra parameters) so that every curve loads the same model folder
        shape, lengths, batches, sizes = (
            replace(ModelShape(), max_position_embeddings=8192),
            a.lengths,
            a.batches,
            a.sizes,
        )
    model_dir = build_model_dir(Path(a.cache) / f"growth-{shape.vocab_size}-{shape.max_position_embeddings}", shape)
    results: dict[str, Any] = {}
    for curve in a.curves:
        rows: list[dict[str, Any]] = []
        if curve == "data":
            for k, n in enumerate(sizes):
                jsonl = write_jsonl(Path(a.cache) / f"growth-pairs-{n}.jsonl", n, shape.vocab_size)
                for side in a.sides if k % 2 == 0 else list(reversed(a.sides)):
                    rows.append(data_point(side, model_dir, jsonl, n, a.timeout))
                    print(json.dumps(rows[-1]), flush=True)
        else:
            points = (
                [(n, a.length_batch) for n in lengths] if curve == "length" else [(a.batch_length, b) for b in batches]
            )
            for k, (n, b) in enumerate(points):
                for side in a.sides if k % 2 == 0 else list(reversed(a.sides)):
                    if side == "trl" and a.trl_max_completion is not None and n > a.trl_max_completion:
                        rows.append({"side": side, "completion": n, "batch": b, "error": "not run: time"})
                    else:
                        rows.append(step_point(side, model_dir, shape, n, b, a.steps, a.timeout))
                    print(json.dumps(rows[-1]), flush=True)
        results[curve] = rows
    meta = {
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "machine": machine(), "threads": 1,
        "versions": versions("torch", "transformers", "datasets", "trl"), "shape": asdict(shape), "prompt": PROMPT,
        "steps": a.steps, "command": " ".join(["python", "benchmarks/bench_growth.py", *(argv or sys.argv[1:])]),
    }  # fmt: skip
    return results, meta


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="CI smoke: tiny model, completions 32 and 64, 200 pairs")
    p.add_argument("--curves", nargs="+", default=["length"], choices=["length", "batch", "data"])
    p.add_argument("--sides", nargs="+", default=["prefzoo", "trl"], choices=["prefzoo", "trl"])
    p.add_argument("--lengths", type=int, nargs="+", default=[256, 512, 1024, 2048, 4096], help="completion tokens")
    p.add_argument("--length-batch", type=int, default=1, help="pairs per step of the length curve")
    p.add_argument("--batches", type=int, nargs="+", default=[1, 2, 4, 8], help="pairs per step (batch curve)")
    p.add_argument("--batch-length", type=int, default=256, help="completion tokens of the batch curve")
    p.add_argument("--sizes", type=int, nargs="+", default=[1000, 10000, 100000], help="pairs (data curve)")
    p.add_argument("--steps", type=int, default=1, help="timed steps per run (after one warm-up step)")
    p.add_argument("--timeout", type=float, default=900, help="seconds per run; a run past it is reported, not kept")
    p.add_argument("--cache", default=str(HERE / ".cache"), help="where the model folder and data are built once")
    p.add_argument("--out", default=str(HERE / "results" / "growth"), help="results .json/.md prefix")
    p.add_argument("--plot", default=None, help="image file for the log-log plot (png or svg)")
    p.add_argument("--trl-max-completion", type=int, default=None, help="TRL runs only up to this completion length")
    p.add_argument("--from-json", nargs="+", default=None, metavar="JSON", help="run nothing: merge earlier results")
    p.add_argument("--data-child", default=None, help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    if a.data_child:
        print(json.dumps(_data_child(json.loads(a.data_child))))
        return 0
    if a.from_json:
        loaded = [json.loads(Path(f).read_text()) for f in a.from_json]
        results = {c: [r for d in loaded for r in d.get(c, [])] for c in ("length", "batch", "data")}
        results = {c: rows for c, rows in results.items() if rows}
        meta = {**loaded[0]["meta"], "command": "; ".join(d["meta"]["command"] for d in loaded),
                "date": ", ".join(dict.fromkeys(d["meta"]["date"] for d in loaded))}  # fmt: skip
    else:
        results, meta = run_curves(a, argv)
    lines = [f"Run {meta['date']} on {meta['machine']}; 1 thread; " + json.dumps(meta["versions"]), ""]
    for curve, rows in results.items():
        if curve == "data":
            lines += ["**Dataset size**", "", *data_table(rows), ""]
        else:
            key = "completion" if curve == "length" else "batch"
            fixed = (
                f"{rows[0]['batch']} pair(s) per step"
                if curve == "length"
                else f"{rows[0]['completion']}-token completions"
            )
            lines += [f"**{'Completion length' if curve == 'length' else 'Batch size'}** ({fixed})", ""]
            lines += [*step_table(rows, key), ""]
    print("\n".join(lines))
    out = Path(a.out + ("-quick" if a.quick else ""))
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".json").write_text(json.dumps({"meta": meta, **results}, indent=1))
    out.with_suffix(".md").write_text("\n".join(lines) + "\n")
    if a.plot and plot(results, Path(a.plot)):
        print(f"plot: {a.plot}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
