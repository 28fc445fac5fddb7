"""prefzoo.nn's fused head + DPO against Liger-Kernel's LigerFusedLinearDPOLoss and the unfused computation.

    python benchmarks/bench_nn_vs_liger.py            # 1k, 2k, 4k and 8k completion tokens, V 49,152, H 192
    python benchmarks/bench_nn_vs_liger.py --quick    # smoke: 256 and 512 tokens, V 8,192, H 64, 1 repeat

One step is forward + backward of the DPO loss of B pairs (rows of a 128-token prompt and a 256-token completion,
chosen rows over rejected rows, -100 on the prompt), gradients for the head weight and the hidden states, the
reference from its own hidden states under its own weight.  Sides:

- ``prefzoo``: ``prefzoo.nn.FusedLinearPreferenceLoss("dpo", beta=0.1, keep_bytes=None)`` (the trainer's budget);
  ``prefzoo-lean`` (``--sides``): the module's default ``keep_bytes=0``, recomputing the logits in backward instead
  of keeping anything of size vocabulary;
- ``liger``: ``liger_kernel.chunked_loss.LigerFusedLinearDPOLoss(beta=0.1)``, compiled as Liger's default unless
  ``--liger-eager`` (left out when liger-kernel is not installed);
- ``unfused``: every position's logits (R, T, V) → float32 log-softmax → gather → prefzoo's ``dpo``.

Peak memory: each side and length in a fresh process after a warm-up step (Liger's compilation), the largest
allocation above the step's start (CUDA: ``max_memory_allocated``; CPU: resident memory sampled every millisecond,
with glibc returning freed blocks at once).  Time: median seconds of a step, all sides in one process with the
order reversed every other round.  Results: a markdown table and JSON under ``--out``, with versions and machine.
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
SIDES = ("prefzoo", "prefzoo-lean", "liger", "unfused")
DEFAULT_SIDES = ("prefzoo", "liger", "unfused")


def _inputs(tokens: int, vocab: int, hidden: int, completion: int, device: str) -> dict[str, Any]:
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
    return {k: v.to(device).detach().requires_grad_(v.requires_grad) for k, v in out.items()}


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


def side_fn(side: str, compiled: bool) -> Any:
    """(w, x, target, ref_x, ref_w) -> the DPO loss, for one side."""
    if side.startswith("prefzoo"):
        from prefzoo.nn import FusedLinearPreferenceLoss

        m = FusedLinearPreferenceLoss("dpo", beta=0.1, keep_bytes=0 if side == "prefzoo-lean" else None)
        return lambda w, x, t, rx, rw: m(w, x, t, None, rx, rw)[0]
    if side == "liger":
        from liger_kernel.chunked_loss import LigerFusedLinearDPOLoss

        lg = LigerFusedLinearDPOLoss(beta=0.1, compiled=compiled)
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


def child_memory(side: str, tokens: int, cfg: dict[str, Any]) -> dict[str, Any]:
    """Peak bytes of one step above its start, after a warm-up step, in this (fresh) process."""
    d = _inputs(tokens, cfg["vocab"], cfg["hidden"], cfg["completion"], cfg["device"])
    fn = side_fn(side, cfg["compiled"])
    loss = _step(fn, d)  # warm-up: compilation, lazy allocations
    gc.collect()
    if cfg["device"].startswith("cuda"):
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
        _step(fn, d)
        torch.cuda.synchronize()
        return {"peak_bytes": torch.cuda.max_memory_allocated() - base, "loss": loss}
    sampler = _PeakRSS()
    base = sampler.peak
    sampler.start()
    _step(fn, d)
    return {"peak_bytes": sampler.stop() - base, "loss": loss}


def child_times(tokens: int, sides: list[str], cfg: dict[str, Any]) -> dict[str, Any]:
    """Median seconds of a step per side, the sides alternating, after one warm-up step each."""
    d = _inputs(tokens, cfg["vocab"], cfg["hidden"], cfg["completion"], cfg["device"])
    fns = {s: side_fn(s, cfg["compiled"]) for s in sides}
    losses = {s: _step(fns[s], d) for s in sides}
    times: dict[str, list[float]] = {s: [] for s in sides}
    for r in range(cfg["repeats"]):
        for s in sides if r % 2 == 0 else sides[::-1]:
            if cfg["device"].startswith("cuda"):
                torch.cuda.synchronize()
            t0 = time.perf_counter()
            _step(fns[s], d)
            if cfg["device"].startswith("cuda"):
                torch.cuda.synchronize()
            times[s].append(time.perf_counter() - t0)
    return {"seconds": {s: statistics.median(v) for s, v in times.items()}, "losses": losses}


def _run_child(what: dict[str, Any]) -> dict[str, Any]:
    env = dict(os.environ, MALLOC_MMAP_THRESHOLD_="65536")  # freed blocks go back to the OS: RSS follows the peak
    out = subprocess.run([sys.executable, __file__, "--child", json.dumps(what)], env=env, capture_output=True,
                         text=True, check=False)  # fmt: skip
    if out.returncode != 0:
        return {"error": (out.stderr.strip().splitlines() or ["?"])[-1]}
    return json.loads(out.stdout.strip().splitlines()[-1])


def _liger_version() -> str | None:
    try:
        from importlib.metadata import version

        import liger_kernel.chunked_loss  # noqa: F401

        return version("liger-kernel")
    except Exception:  # not installed, or it does not import here
        return None


def environment(cfg: dict[str, Any]) -> dict[str, Any]:
    """Versions, machine and date of this run."""
    from importlib.metadata import version

    device = torch.cuda.get_device_name() if cfg["device"].startswith("cuda") else platform.processor() or "CPU"
    return {
        "date": datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC"), "torch": torch.__version__,
        "prefzoo": version("prefzoo"), "liger_kernel": _liger_version(), "python": platform.python_version(),
        "machine": f"{device}, {os.cpu_count()} logical cores, {platform.system()} {platform.release()}",
        "threads": torch.get_num_threads(), "load_average": os.getloadavg(),
    }  # fmt: skip


def _ratio(a: float | None, b: float | None) -> str:
    return f"{a / b:.2f}" if a and b else "–"


def table(rows: list[dict[str, Any]], sides: list[str]) -> list[str]:
    """Markdown: seconds and peak MB per side, and prefzoo's ratios to the others (< 1: prefzoo less)."""
    ours = [s for s in sides if s.startswith("prefzoo")]
    pairs = [(p, o) for p in ours for o in sides if not o.startswith("prefzoo")]
    head = ["completion tokens", *(f"{s} s" for s in sides), *(f"{p} / {o} time" for p, o in pairs),
            *(f"{s} MB" for s in sides), *(f"{p} / {o} memory" for p, o in pairs)]  # fmt: skip
    lines = ["| " + " | ".join(head) + " |", "|" + " --- |" * len(head)]
    for r in rows:
        sec, mb = r["seconds"], r["peak_mb"]
        cells = [f"{r['tokens']:,}", *(f"{sec[s]:.3f}" if sec.get(s) else "–" for s in sides),
                 *(_ratio(sec.get(p), sec.get(o)) for p, o in pairs),
                 *(f"{mb[s]:,.0f}" if mb.get(s) is not None else "–" for s in sides),
                 *(_ratio(mb.get(p), mb.get(o)) for p, o in pairs)]  # fmt: skip
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def measure(tokens: int, sides: list[str], cfg: dict[str, Any]) -> dict[str, Any]:
    """Memory (a fresh process per side) and time (one process, sides alternating) at one length."""
    row: dict[str, Any] = {"tokens": tokens, "peak_mb": {}, "losses": {}, "errors": {}}
    for s in sides:
        m = _run_child({"kind": "memory", "side": s, "tokens": tokens, "cfg": cfg})
        if "error" in m:
            row["errors"][s] = m["error"]
            continue
        row["peak_mb"][s], row["losses"][s] = m["peak_bytes"] / 2**20, m["loss"]
    ok = [s for s in sides if s not in row["errors"]]
    t = _run_child({"kind": "time", "sides": ok, "tokens": tokens, "cfg": cfg})
    row["seconds"] = t.get("seconds", {})
    if "error" in t:
        row["errors"]["time"] = t["error"]
    print(json.dumps(row), flush=True)
    return row


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="smoke: 256 and 512 tokens, V 8,192, H 64, 1 repeat")
    p.add_argument("--tokens", type=int, nargs="+", default=[1024, 2048, 4096, 8192], help="completion tokens a step")
    p.add_argument("--vocab", type=int, default=49152)
    p.add_argument("--hidden", type=int, default=192)
    p.add_argument("--repeats", type=int, default=3, help="timed steps per side (after one warm-up)")
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--liger-eager", action="store_true", help="Liger without torch.compile (its compiled=False)")
    p.add_argument("--sides", nargs="+", choices=SIDES, default=list(DEFAULT_SIDES), help="what to measure")
    p.add_argument("--out", type=Path, default=Path("benchmarks/results/nn_vs_liger"), help="writes OUT.md, OUT.json")
    p.add_argument("--child", help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    if a.child:
        job = json.loads(a.child)
        torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", torch.get_num_threads())))
        res = (child_memory(job["side"], job["tokens"], job["cfg"]) if job["kind"] == "memory"
               else child_times(job["tokens"], job["sides"], job["cfg"]))  # fmt: skip
        print(json.dumps(res))
        return 0
    tokens, vocab, hidden, completion, repeats = (
        ([256, 512], 8192, 64, COMPLETION // 2, 1) if a.quick else (a.tokens, a.vocab, a.hidden, COMPLETION, a.repeats)
    )
    cfg = {"vocab": vocab, "hidden": hidden, "completion": completion, "repeats": repeats, "device": a.device,
           "compiled": not a.liger_eager}  # fmt: skip
    sides = [s for s in SIDES if s in a.sides and (s != "liger" or _liger_version())]
    rows = [measure(n, sides, cfg) for n in tokens]
    env = environment(cfg)
    lines = [f"DPO, V = {vocab:,}, H = {hidden}, {PROMPT}-token prompts, {completion}-token completions, "
             f"{a.device}, {env['threads']} thread(s); {env['machine']}; torch {env['torch']}, prefzoo "
             f"{env['prefzoo']}, liger-kernel {env['liger_kernel'] or 'not installed'} "
             f"({'compiled' if cfg['compiled'] else 'eager'}); {env['date']}", "", *table(rows, sides)]  # fmt: skip
    print("\n".join(lines))
    a.out.parent.mkdir(parents=True, exist_ok=True)
    a.out.with_suffix(".md").write_text("\n".join(lines) + "\n")
    a.out.with_suffix(".json").write_text(json.dumps({"config": cfg, "environment": env, "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
