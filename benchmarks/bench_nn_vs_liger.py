"""prefzoo.nn's Liger-named DPO class against Liger-Kernel's LigerFusedLinearDPOLoss (compiled and eager).

    python benchmarks/bench_nn_vs_liger.py                   # SmolLM-135M and Qwen2.5-0.5B shapes, 1k and 4k tokens
    python benchmarks/bench_nn_vs_liger.py --quick           # smoke: V 8,192, H 64, 256 and 512 tokens, 1 round

One step is forward + backward of the DPO loss of B pairs (rows of a 128-token prompt and a 256-token completion,
chosen rows over rejected rows, -100 on the prompt), gradients for the head weight and the hidden states, the
reference from its own hidden states under its own weight.  Sides:

- ``prefzoo``: ``prefzoo.nn.LigerFusedLinearDPOLoss(beta=0.1)``, the one-import switch (the fused module's default,
  ``keep_bytes=0``: nothing of size vocabulary kept for backward); ``prefzoo-fast`` (``--sides``): the fused module
  with ``keep_bytes=None`` (the trainer's 512 MiB budget);
- ``liger``: ``liger_kernel.chunked_loss.LigerFusedLinearDPOLoss(beta=0.1)``, compiled (Liger's default);
  ``liger-eager``: the same with ``compiled=False`` (both left out when liger-kernel is not installed);
- ``unfused`` (``--sides``): every position's logits (R, T, V) → float32 log-softmax → gather → prefzoo's ``dpo``.

Each side runs in its own process, the sides one after another in a round, the order reversed every other round.  A
process builds the inputs, takes ``--warmup`` steps (Liger's compilation happens there), then times ``--steps``
steps while a thread samples its resident memory every millisecond (glibc returning freed blocks at once): the
step's seconds (median), its peak RSS and the growth of RSS above the step's start.  A side's number is the median
over rounds.  The table adds each side's head FLOPs: prefzoo multiplies only the completion positions, 5 times per
step (policy and reference forward, the backward's recomputed logits, the two input gradients), Liger every
position, prompt included, 4 times (its forward computes the gradients).  Results: markdown and JSON under ``--out``.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import platform
import statistics
import subprocess
import sys
import threading
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import torch

PROMPT, COMPLETION = 128, 256  # tokens per row (the quick mode halves the completion)
SHAPES = {"smollm-135m": (49152, 576), "qwen2.5-0.5b": (151936, 896), "quick": (8192, 64)}  # (V, H)
SIDES = ("prefzoo", "prefzoo-fast", "liger", "liger-eager", "unfused")
DEFAULT_SIDES = ("prefzoo", "liger", "liger-eager")
HEAD_PASSES = {"prefzoo": 5, "prefzoo-fast": 4, "liger": 4, "liger-eager": 4, "unfused": 4}  # (M, V, H) GEMMs a step


def _inputs(tokens: int, vocab: int, hidden: int, completion: int) -> dict[str, Any]:
    """B = tokens / (2 · completion) pairs: (2B, T, H) hidden states, weights, (2B, T) targets."""
    g = torch.Generator().manual_seed(0)
    rows, t = max(2, tokens // completion), PROMPT + completion
    target = torch.randint(0, vocab, (rows, t), generator=g)
    target[:, :PROMPT] = -100
    out = {
        "w": (torch.randn(vocab, hidden, generator=g) * hidden**-0.5).requires_grad_(),
        "x": torch.randn(rows, t, hidden, generator=g).requires_grad_(),
        "ref_x": torch.randn(rows, t, hidden, generator=g),
        "ref_w": torch.randn(vocab, hidden, generator=g) * hidden**-0.5,
        "target": target,
    }
    return out


def _unfused_dpo(beta: float) -> Any:
    from prefzoo.registry import get_loss
    from prefzoo.types import PreferenceBatch

    loss = get_loss("dpo", beta=beta)

    def logps(w: torch.Tensor, x: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        logp = torch.log_softmax((x @ w.t()).float(), dim=-1)  # (R, T, V): every position
        keep = target != -100
        return (logp.gather(-1, target.clamp(min=0).unsqueeze(-1)).squeeze(-1) * keep).sum(1)  # (R,)

    def step(w: torch.Tensor, x: torch.Tensor, target: torch.Tensor, ref_x: torch.Tensor, ref_w: torch.Tensor) -> Any:
        with torch.no_grad():
            ref = logps(ref_w, ref_x, target)
        pol, b = logps(w, x, target), x.shape[0] // 2
        batch = PreferenceBatch(policy_chosen_logps=pol[:b], policy_rejected_logps=pol[b:], ref_chosen_logps=ref[:b],
                                ref_rejected_logps=ref[b:])  # fmt: skip
        return loss(batch).losses.mean()

    return step


def side_fn(side: str) -> Any:
    """(w, x, target, ref_x, ref_w) -> the DPO loss, for one side."""
    if side == "prefzoo":
        from prefzoo.nn import LigerFusedLinearDPOLoss as Ours

        ours = Ours(beta=0.1)
        return lambda w, x, t, rx, rw: ours(w, x, t, None, rx, rw)[0]
    if side == "prefzoo-fast":
        from prefzoo.nn import FusedLinearPreferenceLoss

        m = FusedLinearPreferenceLoss("dpo", beta=0.1, keep_bytes=None)
        return lambda w, x, t, rx, rw: m(w, x, t, None, rx, rw)[0]
    if side.startswith("liger"):
        from liger_kernel.chunked_loss import LigerFusedLinearDPOLoss

        lg = LigerFusedLinearDPOLoss(beta=0.1, compiled=side == "liger")
        return lambda w, x, t, rx, rw: lg(w, x, t, None, rx, rw)[0]
    return _unfused_dpo(0.1)


def _step(fn: Any, d: dict[str, Any]) -> float:
    loss = fn(d["w"], d["x"], d["target"], d["ref_x"], d["ref_w"])
    loss.backward()
    d["w"].grad = d["x"].grad = None
    return float(loss)


class _PeakRSS(threading.Thread):
    def __init__(self) -> None:
        import psutil

        super().__init__(daemon=True)
        self.proc, self.done = psutil.Process(), threading.Event()
        self.peak = self.proc.memory_info().rss

    def run(self) -> None:
        while not self.done.is_set():
            self.peak = max(self.peak, self.proc.memory_info().rss)
            time.sleep(0.001)

    def stop(self) -> int:
        self.done.set()
        self.join()
        return max(self.peak, self.proc.memory_info().rss)


def child(side: str, tokens: int, cfg: dict[str, Any]) -> dict[str, Any]:
    """In a fresh process: warm-up steps, then the timed steps' median seconds, peak RSS and RSS growth."""
    d = _inputs(tokens, cfg["vocab"], cfg["hidden"], cfg["completion"])
    fn = side_fn(side)
    loss = 0.0
    for _ in range(cfg["warmup"]):
        loss = _step(fn, d)  # compilation, lazy allocations
    gc.collect()
    sampler = _PeakRSS()
    base = sampler.peak
    sampler.start()
    seconds = []
    for _ in range(cfg["steps"]):
        t0 = time.perf_counter()
        loss = _step(fn, d)
        seconds.append(time.perf_counter() - t0)
    peak = sampler.stop()
    return {"seconds": statistics.median(seconds), "peak_rss": peak, "growth": peak - base, "loss": loss}


def _run_child(side: str, tokens: int, cfg: dict[str, Any]) -> dict[str, Any]:
    env = dict(os.environ, MALLOC_MMAP_THRESHOLD_="65536")  # freed blocks go back to the OS: RSS follows the peak
    job = json.dumps({"side": side, "tokens": tokens, "cfg": cfg})
    out = subprocess.run([sys.executable, __file__, "--child", job], env=env, capture_output=True, text=True,
                         check=False)  # fmt: skip
    if out.returncode != 0:
        return {"error": (out.stderr.strip().splitlines() or ["?"])[-1]}
    return json.loads(out.stdout.strip().splitlines()[-1])


def head_gflop(side: str, tokens: int, cfg: dict[str, Any]) -> float:
    """GFLOP of a step's (positions × V × H) GEMMs: completion positions for prefzoo, every position for the rest."""
    rows = max(2, tokens // cfg["completion"])
    positions = tokens if side.startswith("prefzoo") else rows * (PROMPT + cfg["completion"])
    return 2 * HEAD_PASSES[side] * positions * cfg["vocab"] * cfg["hidden"] / 1e9


def measure(shape: str, tokens: int, sides: list[str], cfg: dict[str, Any]) -> dict[str, Any]:
    """Every side in its own process per round, the order reversed every other round; medians over rounds."""
    runs: dict[str, list[dict[str, Any]]] = {s: [] for s in sides}
    errors: dict[str, str] = {}
    for r in range(cfg["rounds"]):
        for s in sides if r % 2 == 0 else sides[::-1]:
            res = _run_child(s, tokens, cfg)
            if "error" in res:
                errors[s] = res["error"]
            else:
                runs[s].append(res)
    row: dict[str, Any] = {"shape": shape, "tokens": tokens, "errors": errors, "runs": runs}
    for key in ("seconds", "peak_rss", "growth", "loss"):
        row[key] = {s: statistics.median(x[key] for x in v) for s, v in runs.items() if v}
    row["gflop"] = {s: head_gflop(s, tokens, cfg) for s in sides}
    print(json.dumps({k: v for k, v in row.items() if k != "runs"}), flush=True)
    return row


def environment() -> dict[str, Any]:
    """Versions, machine, load and date of this run."""
    from importlib.metadata import PackageNotFoundError, version

    def _version(name: str) -> str | None:
        try:
            return version(name)
        except PackageNotFoundError:
            return None

    liger = _version("liger-kernel")
    return {
        "date": datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC"), "torch": torch.__version__,
        "prefzoo": _version("prefzoo") or "(source tree)", "liger_kernel": liger, "python": platform.python_version(),
        "machine": f"{platform.processor() or 'CPU'}, {os.cpu_count()} logical cores, {platform.system()} "
                   f"{platform.release()}",
        "threads": int(os.environ.get("OMP_NUM_THREADS", torch.get_num_threads())), "load_average": os.getloadavg(),
    }  # fmt: skip


def _ratio(a: float | None, b: float | None) -> str:
    return f"{a / b:.2f}" if a and b else "–"


def table(rows: list[dict[str, Any]], sides: list[str]) -> list[str]:
    """Markdown: seconds, peak RSS and RSS growth per side, prefzoo's ratios to each other side (< 1: prefzoo less)."""
    ours = "prefzoo" if "prefzoo" in sides else sides[0]
    others = [s for s in sides if s != ours]
    head = ["shape", "completion tokens", *(f"{s} s" for s in sides), *(f"{ours} / {o} time" for o in others),
            *(f"{s} GFLOP" for s in sides), *(f"{s} peak / growth MB" for s in sides),
            *(f"{ours} / {o} growth" for o in others)]  # fmt: skip
    lines = ["| " + " | ".join(head) + " |", "|" + " --- |" * len(head)]
    mb = 2**20
    for r in rows:
        sec, peak, grow = r["seconds"], r["peak_rss"], r["growth"]
        cells = [r["shape"], f"{r['tokens']:,}", *(f"{sec[s]:.2f}" if s in sec else "–" for s in sides),
                 *(_ratio(sec.get(ours), sec.get(o)) for o in others),
                 *(f"{r['gflop'][s]:,.0f}" for s in sides),
                 *(f"{peak[s] / mb:,.0f} / {grow[s] / mb:,.0f}" if s in peak else "–" for s in sides),
                 *(_ratio(grow.get(ours), grow.get(o)) for o in others)]  # fmt: skip
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="smoke: V 8,192, H 64, 256 and 512 tokens, 1 round")
    p.add_argument("--shapes", nargs="+", choices=[s for s in SHAPES if s != "quick"],
                   default=["smollm-135m", "qwen2.5-0.5b"], help="model shapes (V, H)")  # fmt: skip
    p.add_argument("--tokens", type=int, nargs="+", default=[1024, 4096], help="completion tokens a step")
    p.add_argument("--rounds", type=int, default=2, help="processes per side (the order reversed every other round)")
    p.add_argument("--warmup", type=int, default=1, help="untimed steps in each process")
    p.add_argument("--steps", type=int, default=1, help="timed steps in each process")
    p.add_argument("--sides", nargs="+", choices=SIDES, default=list(DEFAULT_SIDES), help="what to measure")
    p.add_argument("--out", type=Path, default=Path("benchmarks/results/nn_vs_liger"), help="writes OUT.md, OUT.json")
    p.add_argument("--child", help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    if a.child:
        job = json.loads(a.child)
        torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", torch.get_num_threads())))
        print(json.dumps(child(job["side"], job["tokens"], job["cfg"])))
        return 0
    shapes, tokens, rounds = (["quick"], [256, 512], 1) if a.quick else (a.shapes, a.tokens, a.rounds)
    env = environment()
    sides = [s for s in a.sides if not s.startswith("liger") or env["liger_kernel"]]
    rows = []
    for shape in shapes:
        vocab, hidden = SHAPES[shape]
        cfg = {"vocab": vocab, "hidden": hidden, "completion": COMPLETION // 2 if a.quick else COMPLETION,
               "rounds": rounds, "warmup": a.warmup, "steps": a.steps}  # fmt: skip
        rows += [measure(shape, n, sides, cfg) for n in tokens]
    env["load_average_end"] = os.getloadavg()
    title = (f"DPO, {PROMPT}-token prompts, {COMPLETION // 2 if a.quick else COMPLETION}-token completions, cpu, "
             f"{env['threads']} thread(s); {env['machine']}; torch {env['torch']}, prefzoo {env['prefzoo']}, "
             f"liger-kernel {env['liger_kernel'] or 'not installed'}; load average {env['load_average'][0]:.1f} at "
             f"the start, {env['load_average_end'][0]:.1f} at the end; {env['date']}")  # fmt: skip
    lines = [title, "", *table(rows, sides)]
    print("\n".join(lines))
    a.out.parent.mkdir(parents=True, exist_ok=True)
    a.out.with_suffix(".md").write_text("\n".join(lines) + "\n")
    a.out.with_suffix(".json").write_text(json.dumps({"environment": env, "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
