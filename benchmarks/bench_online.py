"""On-policy vs offline on the embedded default task: does sampling from the policy change what MMPO learns?

    python benchmarks/bench_online.py            # full: 5 seeds × 9 arms, 150 steps each -> docs/results/online.md
    python benchmarks/bench_online.py --quick    # CI smoke: 1 seed, 3 arms, 4 steps -> the out dir

Arms (the same optimizer steps, prompts per step, learning rate and oracle judge for all):

- offline ``mmpo`` and ``dpo`` on the task's dataset pairs (the paper's setting);
- online ``mml`` and ``mmpo-list`` with n = 2, 4, 8 samples per prompt (the paper's estimator as defined: Eq. 4 with
  z_i ~ π_θ), ranked by the exact oracle (round-robin Borda scores);
- online ``dpo`` on the best-vs-worst pair of n = 4 samples (the iterative / online DPO baseline);
- ``trl online-dpo n=2`` (opt-in with ``--arms``, needs ``trl``): TRL's experimental ``OnlineDPOTrainer`` on the same
  model, prompts, steps, lr schedule, β, sampling and oracle (as a reward function), the anchor for wall time and
  quality.  It samples 2 completions per prompt (fixed in TRL) and trains sigmoid DPO on the better vs the worse.

Every ``--eval-every`` steps the policy is scored against the starting policy (oracle win-rate, retention of the
reversal skill; greedy decoding).  Wall time is split into generation, judging, evaluation and the rest (training).
Finished runs are appended to ``OUT/runs.jsonl`` and skipped when rerun (``--fresh`` starts over).
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import math
import os
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, replace
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
TRL_ARM = Arm("trl online-dpo n=2", "dpo", True, 2, "best-worst")  # TRL's OnlineDPOTrainer: run by run_trl_arm
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


def _oracle_reward(prompts: list[str], completions: list[str], **_: Any) -> list[float]:
    """The task's exact oracle as a TRL reward function: −|answer − truth|, a malformed answer −10 (worse than any)."""
    from prefzoo.data.synthetic import distance

    return [-min(distance(p.removeprefix("<bos>"), c), 10.0) for p, c in zip(prompts, completions, strict=True)]


def run_trl_arm(seed: int, st: Study) -> list[dict[str, Any]]:
    """TRL's experimental OnlineDPOTrainer on the default task, evaluated like the prefzoo arms.

    Same starting policy and frozen reference, the task's training prompts, ``st.steps`` steps of ``st.batch_size``
    prompts, AdamW at ``st.lr`` with the task's cosine/warm-up schedule, β, temperature 1 and ``st.max_new_tokens``
    new tokens; the oracle is a reward function.  TRL's prompts are tokenized without special tokens, so the
    ``<bos>`` the prefzoo tokenization starts with is written into the prompt text (the same token ids).
    """
    import datasets
    import torch
    from transformers import TrainerCallback

    from prefzoo.eval.default_task import evaluate_policy

    try:
        from trl.experimental.online_dpo import OnlineDPOConfig, OnlineDPOTrainer
    except ImportError as e:
        raise SystemExit(f"bench_online: the TRL arm needs trl with trl.experimental.online_dpo ({e})") from None
    torch.set_num_threads(1)
    task, tokenizer, baseline = _task(SweepConfig(eval_prompts=st.eval_prompts))
    rows: list[dict[str, Any]] = []
    spent = {"eval": 0.0, "generation": 0.0, "judging": 0.0}
    t0 = time.perf_counter()

    def record(step: int, model: Any) -> None:
        t = time.perf_counter()
        was_training = model.training
        model.eval()
        m = evaluate_policy(task, model, tokenizer, baseline_model=baseline)
        model.train(was_training)
        spent["eval"] += time.perf_counter() - t
        wall = time.perf_counter() - t0
        rows.append({"arm": TRL_ARM.name, "loss": "dpo", "online": True, "n": 2, "seed": seed, "step": step,
                     "win_rate": m["win_rate"], "retention": m["retention"],
                     "addition_accuracy": m["addition_accuracy"], "malformed": m["malformed"],
                     "wall_s": round(wall, 2), "generation_s": round(spent["generation"], 2),
                     "judging_s": round(spent["judging"], 2), "eval_s": round(spent["eval"], 2),
                     "train_s": round(wall - spent["eval"] - spent["generation"] - spent["judging"], 2)})  # fmt: skip

    class Timed(OnlineDPOTrainer):  # generation and judging seconds, as the prefzoo arms' hooks measure them
        def _generate(self, *a: Any, **k: Any) -> Any:
            t = time.perf_counter()
            try:
                return super()._generate(*a, **k)
            finally:
                spent["generation"] += time.perf_counter() - t

        def _calculate_rewards_from_functions(self, *a: Any, **k: Any) -> Any:
            t = time.perf_counter()
            try:
                return super()._calculate_rewards_from_functions(*a, **k)
            finally:
                spent["judging"] += time.perf_counter() - t

    class Probe(TrainerCallback):
        def on_step_end(self, args: Any, state: Any, control: Any, model: Any = None, **_: Any) -> None:
            if state.global_step % st.eval_every == 0 or state.global_step == st.steps:
                record(state.global_step, model)

    record(0, task.load_model())
    prompts = datasets.Dataset.from_dict({"prompt": [f"<bos>{p}" for p in dict.fromkeys(task.train["prompt"])]})
    with tempfile.TemporaryDirectory(prefix="prefzoo-trl-online-") as out:
        args = OnlineDPOConfig(
            output_dir=out, max_steps=st.steps, per_device_train_batch_size=st.batch_size,
            gradient_accumulation_steps=1,
            learning_rate=st.lr, lr_scheduler_type="cosine",
            warmup_steps=math.ceil(float(task.recommended["warmup_ratio"]) * st.steps),  # prefzoo's rule
            beta=[st.beta], max_new_tokens=st.max_new_tokens, temperature=1.0, top_k=0, top_p=1.0,
            max_length=int(task.recommended["max_prompt_length"]) + st.max_new_tokens, seed=seed, data_seed=seed,
            use_cpu=True, bf16=False, fp16=False, gradient_checkpointing=False, report_to="none",
            save_strategy="no", logging_steps=10_000, disable_tqdm=True, dataloader_num_workers=0,
            weight_decay=0.0,
        )  # fmt: skip
        trainer = Timed(model=task.load_model(), ref_model=task.load_model(), reward_funcs=[_oracle_reward],
                        args=args, train_dataset=prompts, processing_class=tokenizer, callbacks=[Probe()])  # fmt: skip
        t0 = time.perf_counter()
        spent["eval"] = 0.0
        with contextlib.redirect_stdout(io.StringIO()):
            trainer.train()
    return rows


BEGIN = "<!-- bench_online:begin (generated by benchmarks/bench_online.py; edits inside are overwritten) -->"
END = "<!-- bench_online:end -->"
SKELETON = """# On-policy MML vs offline MMPO on the default task

Hand-written discussion goes here; the block below is regenerated by `benchmarks/bench_online.py`.
"""


def _ci(vals: list[float]) -> str:
    """mean ± 95% Student-t half-width over seeds (the mean alone for one seed)."""
    import math
    import statistics

    from _nsample_report import ci95

    c = ci95(vals)
    if len(vals) > 1 and not math.isnan(c["ci"]):
        return f"{c['mean']:.3f} ± {c['ci']:.3f}"
    return f"{statistics.mean(vals):.3f}"


# one point of a curve: (step, win-rate mean, its 95% CI half-width or None, retention mean, its half-width or None)
Point = tuple[int, float, float | None, float, float | None]


def series_from_rows(rows: list[dict[str, Any]], arms: tuple[str, ...]) -> dict[str, list[Point]]:
    """Each arm's curve: per evaluation step, the mean over seeds and the 95% Student-t half-width."""
    from _nsample_report import ci95

    out: dict[str, list[Point]] = {}
    for arm in arms:
        pts = []
        for s in sorted({r["step"] for r in rows if r["arm"] == arm}):
            win = ci95([r["win_rate"] for r in rows if r["arm"] == arm and r["step"] == s])
            ret = ci95([r["retention"] for r in rows if r["arm"] == arm and r["step"] == s])
            pts.append((s, win["mean"], win["ci"] if win["n"] > 1 else None, ret["mean"],
                        ret["ci"] if ret["n"] > 1 else None))  # fmt: skip
        if pts:
            out[arm] = pts
    return out


def plot(series: dict[str, list[Point]], path: Path, title: str) -> bool:
    """Win-rate and retention against the step, one line per arm with its 95% CI band (or bars where only some
    points have one); page width (8 in) at 2 × 96 dpi, the legend below the panels. False without matplotlib."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    plt.rcParams.update({"font.size": 9, "axes.spines.top": False, "axes.spines.right": False})
    fig, axes = plt.subplots(1, 2, figsize=(8.0, 4.6), layout="constrained")
    colors = matplotlib.colormaps["tab10"]
    for i, (arm, pts) in enumerate(series.items()):
        style = "--" if arm.startswith("offline") else ":" if arm.startswith("trl") else "-"
        steps = [p[0] for p in pts]
        for ax, (m, c) in zip(axes, ((1, 2), (3, 4)), strict=True):
            ys, cis = [p[m] for p in pts], [p[c] for p in pts]
            ax.plot(steps, ys, style, marker="o", ms=3, color=colors(i % 10), label=arm)
            if all(ci is not None for ci in cis):
                ax.fill_between(steps, [y - ci for y, ci in zip(ys, cis, strict=True)],
                                [y + ci for y, ci in zip(ys, cis, strict=True)], color=colors(i % 10), alpha=0.12)
            elif any(ci is not None for ci in cis):
                sel = [(s, y, ci) for s, y, ci in zip(steps, ys, cis, strict=True) if ci is not None]
                dodge = (i - (len(series) - 1) / 2) * 0.6  # bars at one step side by side, not on top of each other
                ax.errorbar([s + dodge for s, _, _ in sel], [y for _, y, _ in sel], yerr=[ci for _, _, ci in sel],
                            fmt="none", ecolor=colors(i % 10), capsize=2, elinewidth=1)  # fmt: skip
    for ax, name in zip(axes, ("win-rate", "retention"), strict=True):
        ax.set_xlabel("optimizer step")
        ax.set_ylabel(f"{name} vs starting policy")
        ax.grid(alpha=0.3)
    fig.legend(*axes[0].get_legend_handles_labels(), loc="outside lower center", ncol=3, frameon=False)
    fig.suptitle(title)
    fig.savefig(path, dpi=192)
    plt.close(fig)
    return True


def write_page(rows: list[dict[str, Any]], st: Study, path: Path, cmd: str) -> None:
    """The generated block of the page (last-step table with 95% CIs, per-round table, time split) and the plot."""
    import statistics

    last = {}
    for r in rows:
        last[(r["arm"], r["seed"])] = max(last.get((r["arm"], r["seed"]), -1), r["step"])
    final: dict[str, list[dict[str, Any]]] = {}
    for r in rows:
        if r["step"] == last[(r["arm"], r["seed"])]:
            final.setdefault(r["arm"], []).append(r)
    seeds = sorted({r["seed"] for r in rows})
    lines = [
        "",
        "### Run",
        "",
        f"- command: `{cmd}`",
        f"- sizes: {st.steps} optimizer steps of {st.batch_size} prompts (online) or pairs (offline), lr {st.lr:g} "
        f"(cosine, 10% warm-up), β {st.beta:g}, samples: temperature 1, at most {st.max_new_tokens} new tokens, "
        f"judge: the exact oracle; {st.eval_prompts} win-rate and {st.eval_prompts} retention prompts (greedy)",
        f"- seeds: {', '.join(map(str, seeds))} ({len(seeds)}); every run starts from the task-seed 0 policy",
        f"- runs: {len(last)}",
        "",
        "Win-rate and retention against the starting policy at the last step: mean ± 95% CI half-width over seeds "
        "(Student t); seconds per run (mean over seeds), split into generation, judging and the rest (training; "
        "the periodic evaluations are excluded).",
        "",
        "| arm | win-rate | retention | addition exact | malformed | generation s | judging s | training s | total s |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for arm in st.arms:
        rs = final.get(arm, [])
        if not rs:
            continue
        g, j, t = (statistics.mean(r[k] for r in rs) for k in ("generation_s", "judging_s", "train_s"))
        lines.append(
            f"| {arm} | {_ci([r['win_rate'] for r in rs])} | {_ci([r['retention'] for r in rs])} | "
            f"{_ci([r['addition_accuracy'] for r in rs])} | {_ci([r['malformed'] for r in rs])} | {g:.1f} | {j:.1f} | "
            f"{t:.1f} | {g + j + t:.1f} |"
        )
    steps = sorted({r["step"] for r in rows})
    head_row = "| arm | " + " | ".join(f"step {s}" for s in steps) + " |"
    lines += ["", "Per evaluation (seed-mean win-rate / retention):", "", head_row, "| --- |" + " --- |" * len(steps)]
    for arm in st.arms:
        cells = []
        for s in steps:
            rs = [r for r in rows if r["arm"] == arm and r["step"] == s]
            cells.append(f"{statistics.mean(r['win_rate'] for r in rs):.3f} / "
                         f"{statistics.mean(r['retention'] for r in rs):.3f}" if rs else "")  # fmt: skip
        if any(cells):
            lines.append(f"| {arm} | " + " | ".join(cells) + " |")
    if plot(series_from_rows(rows, st.arms), path.with_suffix(".png"), f"mean over {len(seeds)} seed(s) ± 95% CI"):
        lines += ["", f"![win-rate and retention per step, mean over seeds ± 95% CI]({path.with_suffix('.png').name})"]
    else:
        lines += ["", "(matplotlib is not installed: no plot)"]
    text = path.read_text() if path.exists() else SKELETON
    if BEGIN not in text or END not in text:
        text = text.rstrip("\n") + "\n\n" + BEGIN + "\n" + END + "\n"
    head, rest = text.split(BEGIN, 1)
    path.write_text(head + BEGIN + "\n" + "\n".join(lines).strip("\n") + "\n" + END + rest.split(END, 1)[1])


def _ints(text: str) -> tuple[int, ...]:
    return tuple(int(v) for v in text.split(",") if v.strip())


def _names(text: str) -> tuple[str, ...]:
    return tuple(v.strip() for v in text.split(",") if v.strip())


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="CI smoke: 1 seed, 3 arms, 4 steps, 20 eval prompts")
    p.add_argument("--seeds", type=_ints, help="comma-separated seeds (full: 0,1,2,3,4)")
    p.add_argument("--arms", type=_names, help=f"comma-separated arms (full: the 9 below; {TRL_ARM.name!r} opt-in): "
                   + ", ".join(a.name for a in (*ARMS, TRL_ARM)))  # fmt: skip
    p.add_argument("--steps", type=int, help="optimizer steps per run (full: 150)")
    p.add_argument("--eval-every", type=int, help="steps between evaluations (full: 30)")
    p.add_argument("--eval-prompts", type=int, help="win-rate and retention prompts (full: 200)")
    p.add_argument("--out-dir", help="raw results (default runs/online[-quick])")
    p.add_argument("--results-dir", help="page and plot (default docs/results; --quick: the out dir)")
    p.add_argument("--fresh", action="store_true", help="ignore finished runs in OUT/runs.jsonl")
    p.add_argument("--no-run", action="store_true", help="train nothing: write the page from the finished runs")
    args = p.parse_args(argv)
    st = Study.quick() if args.quick else Study()
    over = {"seeds": args.seeds, "arms": args.arms, "steps": args.steps, "eval_every": args.eval_every,
            "eval_prompts": args.eval_prompts}  # fmt: skip
    st = replace(st, **{k: v for k, v in over.items() if v is not None})
    arms = {a.name: a for a in (*ARMS, TRL_ARM)}
    unknown = [a for a in st.arms if a not in arms]
    if unknown:
        p.error(f"--arms: unknown {unknown}; choose from {', '.join(arms)}")
    if not st.seeds or not st.arms or st.steps < 1 or st.eval_every < 1 or st.eval_prompts < 1:
        p.error("--seeds and --arms need a value each; --steps, --eval-every and --eval-prompts must be >= 1")
    _quiet()
    out = Path(args.out_dir or ROOT / ("runs/online-quick" if args.quick else "runs/online"))
    out.mkdir(parents=True, exist_ok=True)
    results = Path(args.results_dir or (out if args.quick else ROOT / "docs/results"))
    results.mkdir(parents=True, exist_ok=True)
    store = out / "runs.jsonl"
    if args.fresh and store.exists() and not args.no_run:
        store.unlink()
    study_key = json.dumps({k: v for k, v in asdict(st).items() if k not in ("seeds", "arms")}, sort_keys=True)
    old = [json.loads(line) for line in store.read_text().splitlines()] if store.exists() else []
    done = {(r["arm"], r["seed"]) for r in old if r.get("study") == study_key}
    for seed in st.seeds:
        for name in st.arms:
            if (name, seed) in done or args.no_run:
                continue
            t = time.perf_counter()
            rows = run_trl_arm(seed, st) if arms[name] is TRL_ARM else run_arm(arms[name], seed, st)
            with store.open("a") as f:
                f.write("".join(json.dumps({**r, "study": study_key}) + "\n" for r in rows))
            print(f"bench_online: {name} seed {seed}: win-rate {rows[-1]['win_rate']:.3f}, retention "
                  f"{rows[-1]['retention']:.3f} ({time.perf_counter() - t:.0f} s)", flush=True)  # fmt: skip
    if store.exists():
        old = [json.loads(line) for line in store.read_text().splitlines()]
    rows = [r for r in old if r.get("study") == study_key]
    rows = [r for r in rows if r["arm"] in st.arms and r["seed"] in st.seeds]
    if not rows:
        raise SystemExit(f"bench_online: no finished run of this study in {store} to report")
    shown = " ".join(argv if argv is not None else sys.argv[1:])
    cmd = "OMP_NUM_THREADS=1 python benchmarks/bench_online.py" + (f" {shown}" if shown else "")
    write_page(rows, st, results / "online.md", cmd)
    print(f"bench_online: wrote {results / 'online.md'} ({json.dumps(asdict(st))})")
    return 0


def _quiet() -> None:
    """No per-round progress bars or per-checkpoint warnings (thousands of lines in a full study)."""
    import logging

    import datasets
    import transformers

    datasets.disable_progress_bars()
    transformers.logging.set_verbosity_error()
    transformers.logging.disable_progress_bar()
    logging.getLogger("accelerate").setLevel(logging.ERROR)
    logging.getLogger("prefzoo.data.groups").setLevel(logging.ERROR)  # "dropped 1 of 8 lists" (samples all tied)


if __name__ == "__main__":
    raise SystemExit(main())
