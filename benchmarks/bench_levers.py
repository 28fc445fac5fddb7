"""One lever at a time: prefzoo's DPO step (policy + frozen reference + AdamW) timed in-process per configuration.

    python benchmarks/bench_levers.py --workloads ultrafeedback orca --reps 3

Each configuration runs in its own subprocess (so peak RSS is per configuration); within a round the
configurations run back to back in a rotating order, and the medians over rounds are reported.  The step is the
trainer's own pieces (PolicyLogps, FrozenReference, the registered loss, torch AdamW), without the loop around them.
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
from trainbench_setup import WORKLOADS, ModelShape, build_model_dir, make_pairs

HERE = Path(__file__).resolve().parent
CONFIGS: dict[str, dict[str, Any]] = {
    "plain autograd head": {"fused_head": False},
    "fused head (default)": {},
    "fused head + shared prompt": {"share_prompt": True},
    "fused + shared + eager attention": {"share_prompt": True, "attn": "eager"},
    "fused + shared, 1 thread": {"share_prompt": True, "threads": 1},
    "fused + shared + length-sorted batches": {"share_prompt": True, "sort": True},
    "fused + shared, no reference forward": {"share_prompt": True, "no_reference": True},
    "fused + shared + torch.compile": {"share_prompt": True, "compile": True},
}


def child(spec: dict[str, Any]) -> dict[str, Any]:
    """Time ``spec['steps']`` DPO steps (after one warm-up) of one configuration; the last line printed is JSON."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from prefzoo.data.collate import PreferenceCollator
    from prefzoo.registry import get_loss
    from prefzoo.train.logps import PolicyLogps
    from prefzoo.train.reference import FrozenReference
    from prefzoo.types import PreferenceBatch

    opts = spec["options"]
    torch.set_num_threads(opts.get("threads", spec["threads"]))
    tok = AutoTokenizer.from_pretrained(spec["model_dir"])
    lm = AutoModelForCausalLM.from_pretrained(spec["model_dir"], attn_implementation=opts.get("attn", "sdpa"))
    examples = []
    for p in spec["pairs"]:
        ids = {k: tok(p[k], add_special_tokens=False).input_ids for k in ("prompt", "chosen", "rejected")}
        examples.append(
            {
                "id": p["id"],
                "prompt_ids": ids["prompt"],
                "chosen_ids": ids["chosen"] + [tok.eos_token_id],
                "rejected_ids": ids["rejected"] + [tok.eos_token_id],
            }
        )
    if opts.get("sort"):
        examples.sort(key=lambda e: len(e["prompt_ids"]) + len(e["chosen_ids"]) + len(e["rejected_ids"]))
    b = spec["batch"]
    collate = PreferenceCollator(tok.pad_token_id, share_prompt=opts.get("share_prompt", False))
    batches = [collate(examples[i : i + b]) for i in range(0, len(examples), b)]
    reference = None if opts.get("no_reference") else FrozenReference(lm, 1024)
    policy = PolicyLogps(lm, 1024, fused_head=opts.get("fused_head", True)).train()
    if opts.get("compile"):
        lm.model = torch.compile(lm.model, dynamic=True)
    loss = get_loss("dpo")
    opt = torch.optim.AdamW([p for p in policy.parameters() if p.requires_grad], lr=1e-5)
    times = []
    for k, batch in enumerate(batches):
        t0 = time.perf_counter()
        out = policy(batch["input_ids"], batch["attention_mask"], batch["completion_mask"])
        w, l_ = out.split()
        if reference is not None:
            ref_w, ref_l = reference(batch)
        else:  # what skipping the reference would save (NOT the DPO loss: the reference is replaced by zeros)
            ref_w, ref_l = torch.zeros_like(w["logps"]), torch.zeros_like(l_["logps"])
        pb = PreferenceBatch(
            policy_chosen_logps=w["logps"],
            policy_rejected_logps=l_["logps"],
            ref_chosen_logps=ref_w,
            ref_rejected_logps=ref_l,
            chosen_lengths=w["lengths"],
            rejected_lengths=l_["lengths"],
            example_ids=tuple(batch["ids"]),
        )
        loss(pb).losses.mean().backward()
        torch.nn.utils.clip_grad_norm_(policy.parameters(), 1.0)
        opt.step()
        opt.zero_grad()
        if k > 0:  # the first step is warm-up
            times.append(time.perf_counter() - t0)
    tokens = sum(2 * len(e["prompt_ids"]) + len(e["chosen_ids"]) + len(e["rejected_ids"]) for e in examples[b:])
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
