"""How prefzoo's step cost grows with completion length: step time and peak memory, and the fitted time ∝ tokens^a.

    python benchmarks/bench_growth.py --quick      # CI smoke: tiny model, completions 64 and 128 tokens, 1 repeat
    python benchmarks/bench_growth.py              # the docs table: the 12M-parameter Llama, 256 → 2048 tokens

Each point is its own subprocess (so peak RSS is per point): one pair-batch step of the policy (forward + backward
through :func:`prefzoo.sequence_logps` with the fused head) plus the frozen reference's no-grad pass, on random
pairs with a 128-token prompt and chosen/rejected completions of the given length.  Times are medians over
``--repeats`` after one warm-up step; the exponent a is the least-squares slope of log time against log tokens.
TRL's side of the curve is not measured here (bench_train_throughput.py runs TRL at one length).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import resource
import statistics
import subprocess
import sys
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from trainbench_setup import TINY_SHAPE, ModelShape

HERE = Path(__file__).resolve().parent
PROMPT = 128


def _child(shape: dict[str, Any], completion: int, batch: int, repeats: int) -> dict[str, Any]:
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    from prefzoo.data.collate import PreferenceCollator
    from prefzoo.train.logps import PolicyLogps

    torch.manual_seed(0)
    cfg = LlamaConfig(
        vocab_size=shape["vocab_size"], hidden_size=shape["hidden_size"], intermediate_size=shape["intermediate_size"],
        num_hidden_layers=shape["num_hidden_layers"], num_attention_heads=shape["num_attention_heads"],
        tie_word_embeddings=True,
        max_position_embeddings=PROMPT + completion + 8,
    )  # fmt: skip
    cfg._attn_implementation = "sdpa"
    lm = LlamaForCausalLM(cfg)
    policy, reference = PolicyLogps(lm), PolicyLogps(LlamaForCausalLM(cfg).eval())
    g = torch.Generator().manual_seed(1)

    def ids(n: int) -> list[int]:
        return torch.randint(3, cfg.vocab_size, (n,), generator=g).tolist()

    pairs = [{"id": str(i), "prompt_ids": ids(PROMPT), "chosen_ids": ids(completion), "rejected_ids": ids(completion)}
             for i in range(batch)]  # fmt: skip
    b = PreferenceCollator(0)(pairs)
    args = (b["input_ids"], b["attention_mask"], b["completion_mask"])
    times = []
    for _ in range(repeats + 1):
        t0 = time.perf_counter()
        with torch.no_grad():
            reference(*args)
        policy(*args).logps.sum().backward()
        times.append(time.perf_counter() - t0)
    peak_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux: KiB
    tokens = int(b["attention_mask"].sum())
    return {"completion": completion, "tokens": tokens, "step_s": statistics.median(times[1:]), "peak_mb": peak_mb}


def fit_exponent(tokens: list[int], seconds: list[float]) -> float:
    """Least-squares slope a of log(seconds) = a·log(tokens) + c."""
    x = [math.log(t) for t in tokens]
    y = [math.log(s) for s in seconds]
    mx, my = sum(x) / len(x), sum(y) / len(y)
    den = sum((xi - mx) ** 2 for xi in x)
    return float("nan") if den == 0 else sum((xi - mx) * (yi - my) for xi, yi in zip(x, y, strict=True)) / den


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="CI smoke: tiny model, completions 64 and 128, 1 repeat")
    p.add_argument("--lengths", type=int, nargs="+", default=[256, 512, 1024, 2048], help="completion tokens")
    p.add_argument("--batch", type=int, default=2, help="pairs per step")
    p.add_argument("--repeats", type=int, default=2, help="timed steps per point (after one warm-up)")
    p.add_argument("--out", default=str(HERE / "results" / "growth"), help="results .json/.md prefix")
    p.add_argument("--child", default=None, help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    if a.child:
        spec = json.loads(a.child)
        print(json.dumps(_child(spec["shape"], spec["completion"], spec["batch"], spec["repeats"])))
        return 0
    shape = TINY_SHAPE if a.quick else ModelShape()
    lengths, repeats = ([64, 128], 1) if a.quick else (a.lengths, a.repeats)
    env = {**os.environ, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1")}
    rows = []
    for n in lengths:
        spec = {"shape": asdict(shape), "completion": n, "batch": a.batch, "repeats": repeats}
        out = subprocess.run([sys.executable, __file__, "--child", json.dumps(spec)], env=env, capture_output=True,
                             text=True, check=False)  # fmt: skip
        if out.returncode != 0:
            print(out.stderr[-3000:], file=sys.stderr)
            return 1
        rows.append(json.loads(out.stdout.strip().splitlines()[-1]))
        r = rows[-1]
        print(f"completion {n:>5}: {r['tokens']:>6} tokens  {r['step_s']:.3f} s  {r['peak_mb']:.0f} MB")
    a_time = fit_exponent([r["tokens"] for r in rows], [r["step_s"] for r in rows])
    import torch
    import transformers

    meta = {
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "machine": platform.machine(),
        "cpus": os.cpu_count(), "threads": env["OMP_NUM_THREADS"], "python": platform.python_version(),
        "torch": torch.__version__, "transformers": transformers.__version__, "shape": asdict(shape),
        "batch": a.batch, "prompt": PROMPT, "repeats": repeats,
    }  # fmt: skip
    lines = ["| completion tokens | tokens per step | step time (s) | peak RSS (MB) |", "| ---: | ---: | ---: | ---: |"]
    lines += [f"| {r['completion']} | {r['tokens']} | {r['step_s']:.3f} | {r['peak_mb']:.0f} |" for r in rows]
    lines.append(f"\nFitted step time ∝ tokens^{a_time:.2f}.")
    print("\n".join(lines))
    out_path = Path(a.out + ("-quick" if a.quick else ""))
    out_path.parent.mkdir(parents=True, exist_ok=True)
    out_path.with_suffix(".json").write_text(json.dumps({"meta": meta, "rows": rows, "exponent": a_time}, indent=1))
    out_path.with_suffix(".md").write_text("\n".join(lines) + "\n\n" + json.dumps(meta) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
