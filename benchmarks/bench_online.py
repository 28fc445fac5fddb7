"""On-policy vs offline on the embedded default task: does sampling from the policy change what MMPO learns?

    python benchmarks/bench_online.py            # full: 5 seeds × 9 arms, 150 steps each -> docs/results/online.md
    python benchmarks/bench_online.py --quick    # CI smoke: 1 seed, 3 arms, 4 steps -> the out dir

Arms (the same optimizer steps, prompts per step, learning rate and oracle judge for all):

- offline ``mmpo`` and ``dpo`` on the task's dataset pairs (the paper's setting);
- online ``mml`` and ``mmpo-list`` with n = 2, 4, 8 samples per prompt (the paper's estimator as defined: Eq. 4 with
  z_i ~ π_θ), ranked by the exact oracle (round-robin Borda scores);
- online ``dpo`` on the best-vs-worst pair of n = 4 samples (the iterative / online DPO baseline).

Every ``--eval-every`` steps the policy is scored against the starting policy (oracle win-rate, retention of the
reversal skill; greedy decoding).  Wall time is split into generation, judging, evaluation and the rest (training).
Finished runs are appended to ``OUT/runs.jsonl`` and skipped when rerun (``--fresh`` starts over).
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

os.environ.setdefault("OMP_NUM_THREADS", "1")
sys.path.insert(0, str(Path(__file__).resolve().parent))

from _sweep_run import SweepConfig, _task  # the default task, its tokenizer and the starting policy, loaded once

ROOT = Path(__file__).resolve().parents[1]


@dataclass(frozen=True)
class Arm:
    name: str
    loss: str
    online: bool
    n: int = 2
    pairs_from_lists: str | None = None


ARMS = (
    Arm("offline mmpo", "mmpo", False),
    Arm("offline dpo", "dpo", False),
    *(Arm(f"online mml n={n}", "mml", True, n) for n in (2, 4, 8)),
    *(Arm(f"online mmpo-list n={n}", "mmpo-list", True, n) for n in (2, 4, 8)),
    Arm("online dpo best-worst n=4", "dpo", True, 4, "best-worst"),
)
QUICK_ARMS = ("offline mmpo", "online mml n=2", "online dpo best-worst n=4")


@dataclass(frozen=True)
class Study:
    steps: int = 150  # optimizer steps per run (2 passes over the 600 train prompts at 8 per step)
    batch_size: int = 8  # prompts (online) or pairs (offline) per step
    eval_every: int = 30
    eval_prompts: int = 200
    seeds: tuple[int, ...] = (0, 1, 2, 3, 4)
    lr: float = 3e-4
    beta: float = 0.05
    max_new_tokens: int = 6
    arms: tuple[str, ...] = tuple(a.name for a in ARMS)

    @classmethod
    def quick(cls) -> Study:
        return cls(steps=4, eval_every=2, eval_prompts=20, seeds=(0,), arms=QUICK_ARMS)


def run_arm(arm: Arm, seed: int, st: Study) -> list[dict[str, Any]]:
    """Train one arm with one seed; one row per evaluation (step 0 = the starting policy)."""
    import torch

    torch.set_num_threads(1)
    from prefzoo.eval.default_task import evaluate_policy
    from prefzoo.train import Callback, TrainConfig, train

    task, tokenizer, baseline = _task(SweepConfig(eval_prompts=st.eval_prompts))
    rows: list[dict[str, Any]] = []
    spent = {"eval": 0.0, "generation": 0.0, "judging": 0.0}
    t0 = time.perf_counter()

    def record(step: int, model: Any) -> None:
        t = time.perf_counter()
        m = evaluate_policy(task, model, tokenizer, baseline_model=baseline)
        spent["eval"] += time.perf_counter() - t
        wall = time.perf_counter() - t0
        rows.append({"arm": arm.name, "loss": arm.loss, "online": arm.online, "n": arm.n if arm.online else 2,
                     "seed": seed, "step": step, "win_rate": m["win_rate"], "retention": m["retention"],
                     "addition_accuracy": m["addition_accuracy"], "malformed": m["malformed"],
                     "wall_s": round(wall, 2), "generation_s": round(spent["generation"], 2),
                     "judging_s": round(spent["judging"], 2), "eval_s": round(spent["eval"], 2),
                     "train_s": round(wall - spent["eval"] - spent["generation"] - spent["judging"], 2)})  # fmt: skip

    class Probe(Callback):
        def on_step_end(self, state: Any) -> None:
            if state.global_step % st.eval_every == 0 or state.global_step == st.steps:
                record(state.global_step, state.accelerator.unwrap_model(state.model).lm)

    class Rounds(Callback):  # generation / judging seconds of each round, from the hooks' clock
        def on_generation_begin(self, state: Any) -> None:
            self.t = time.perf_counter()

        def on_generation_end(self, state: Any) -> None:
            spent["generation"] += time.perf_counter() - self.t
            self.t = time.perf_counter()

        def on_judged(self, state: Any) -> None:
            spent["judging"] += time.perf_counter() - self.t

    record(0, task.load_model())
    with tempfile.TemporaryDirectory(prefix="prefzoo-online-") as out:
        extra: dict[str, Any] = {}
        if arm.online:
            extra = dict(online=True, samples_per_prompt=arm.n, max_new_tokens=st.max_new_tokens, judge="oracle",
                         pairs_from_lists=arm.pairs_from_lists)  # fmt: skip
        tc = TrainConfig(
            loss=arm.loss, loss_params={"beta": st.beta}, model=str(task.model_dir), max_steps=st.steps,
            per_device_batch_size=st.batch_size, grad_accum=1, lr=st.lr,
            warmup_ratio=float(task.recommended["warmup_ratio"]),
            max_prompt_length=int(task.recommended["max_prompt_length"]),
            max_completion_length=int(task.recommended["max_completion_length"]),
            eval_fraction=0.0, seed=seed, output_dir=out, save_total_limit=1, progress=False, report_to="none",
            cpu=True, **extra,
        )  # fmt: skip
        t0 = time.perf_counter()
        spent["eval"] = 0.0
        with contextlib.redirect_stdout(io.StringIO()):
            train(tc, task.train, None, callbacks=[Probe(), Rounds()])
    return rows


def write_page(rows: list[dict[str, Any]], st: Study, path: Path, cmd: str) -> None:
    """A table of the last evaluation per arm (mean ± sd over seeds), the time split, and a plot beside it."""
    import statistics

    by: dict[str, list[dict[str, Any]]] = {}
    for r in rows:
        if r["step"] == st.steps:
            by.setdefault(r["arm"], []).append(r)

    def ms(vals: list[float]) -> str:
        return f"{statistics.mean(vals):.3f} ± {statistics.stdev(vals):.3f}" if len(vals) > 1 else f"{vals[0]:.3f}"

    lines = [
        "# On-policy MML vs offline MMPO on the default task",
        "",
        f"Measured with `{cmd}` ({len({r['seed'] for r in rows})} seed(s), {st.steps} optimizer steps of "
        f"{st.batch_size} prompts or pairs, lr {st.lr:g}, β {st.beta:g}, oracle judge). Win-rate and retention "
        "against the starting policy, greedy decoding, at the last step; seconds per run.",
        "",
        "| arm | win-rate | retention | addition accuracy | generation s | judging s | training s |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    for arm in st.arms:
        rs = by.get(arm, [])
        if not rs:
            continue
        lines.append(
            f"| {arm} | {ms([r['win_rate'] for r in rs])} | {ms([r['retention'] for r in rs])} | "
            f"{ms([r['addition_accuracy'] for r in rs])} | {statistics.mean(r['generation_s'] for r in rs):.1f} | "
            f"{statistics.mean(r['judging_s'] for r in rs):.1f} | {statistics.mean(r['train_s'] for r in rs):.1f} |"
        )
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        fig, axes = plt.subplots(1, 2, figsize=(11, 4))
        for arm in st.arms:
            steps = sorted({r["step"] for r in rows if r["arm"] == arm})
            for ax, key in zip(axes, ("win_rate", "retention"), strict=True):
                ys = [statistics.mean(r[key] for r in rows if r["arm"] == arm and r["step"] == s) for s in steps]
                ax.plot(steps, ys, marker="o", label=arm)
                ax.set_xlabel("optimizer step")
                ax.set_ylabel(key.replace("_", " "))
        axes[0].legend(fontsize=7)
        fig.tight_layout()
        fig.savefig(path.with_suffix(".png"), dpi=110)
        lines += ["", f"![win-rate and retention per step]({path.with_suffix('.png').name})"]
    except ImportError:
        lines += ["", "(matplotlib is not installed: no plot)"]
    path.write_text("\n".join(lines) + "\n")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="CI smoke: 1 seed, 3 arms, 4 steps, 20 eval prompts")
    p.add_argument("--out-dir", help="raw results (default runs/online[-quick])")
    p.add_argument("--results-dir", help="page and plot (default docs/results; --quick: the out dir)")
    p.add_argument("--fresh", action="store_true", help="ignore finished runs in OUT/runs.jsonl")
    args = p.parse_args(argv)
    st = Study.quick() if args.quick else Study()
    out = Path(args.out_dir or ROOT / ("runs/online-quick" if args.quick else "runs/online"))
    out.mkdir(parents=True, exist_ok=True)
    results = Path(args.results_dir or (out if args.quick else ROOT / "docs/results"))
    results.mkdir(parents=True, exist_ok=True)
    store = out / "runs.jsonl"
    if args.fresh and store.exists():
        store.unlink()
    done = {(r["arm"], r["seed"]) for r in map(json.loads, store.read_text().splitlines())} if store.exists() else set()
    arms = {a.name: a for a in ARMS}
    for seed in st.seeds:
        for name in st.arms:
            if (name, seed) in done:
                continue
            t = time.perf_counter()
            rows = run_arm(arms[name], seed, st)
            with store.open("a") as f:
                f.write("".join(json.dumps(r) + "\n" for r in rows))
            print(f"bench_online: {name} seed {seed}: win-rate {rows[-1]['win_rate']:.3f}, retention "
                  f"{rows[-1]['retention']:.3f} ({time.perf_counter() - t:.0f} s)", flush=True)  # fmt: skip
    rows = [json.loads(line) for line in store.read_text().splitlines()]
    cmd = "python benchmarks/bench_online.py" + (" --quick" if args.quick else "")
    write_page(rows, st, results / "online.md", cmd)
    print(f"bench_online: wrote {results / 'online.md'} ({json.dumps(asdict(st))})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
