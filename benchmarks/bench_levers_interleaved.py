"""Lever timings robust to a loaded machine: one process, one model, the configurations' steps interleaved.

    python benchmarks/bench_levers_interleaved.py --workload orca --rounds 4

Every round runs one DPO step (policy + frozen reference + AdamW, the trainer's own pieces) of each configuration on
the same batch, in a rotating order, so background load falls on every configuration alike; the ratio of each
configuration's median step time to the baseline's is reported.  Options switched at run time: the fused head, the
shared-prompt layout, the attention implementation, the thread count, the reference forward.  Peak memory cannot be
separated here (one process): ``bench_levers.py`` measures it per configuration in its own process.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from trainbench_setup import WORKLOADS, ModelShape, build_model_dir, make_pairs

HERE = Path(__file__).resolve().parent
CONFIGS: dict[str, dict[str, Any]] = {
    "plain autograd head": {"fused_head": False},
    "fused head (default)": {},
    "fused + shared prompt": {"share_prompt": True},
    "fused + shared + eager attention": {"share_prompt": True, "attn": "eager"},
    "fused + shared, 2 threads": {"share_prompt": True, "threads": 2},
    "fused + shared, no reference forward": {"share_prompt": True, "no_reference": True},
}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--workload", default="ultrafeedback", choices=sorted(WORKLOADS))
    p.add_argument("--rounds", type=int, default=4, help="rounds (the first is warm-up and not counted)")
    p.add_argument("--batch", type=int, default=4)
    p.add_argument("--threads", type=int, default=1, help="threads of every configuration but the '2 threads' one")
    p.add_argument("--cache", default=str(HERE / ".cache"))
    p.add_argument("--out", default=None, help="results .json/.md prefix (default results/levers_interleaved_<wl>)")
    args = p.parse_args(argv)

    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from prefzoo.data.collate import PreferenceCollator
    from prefzoo.registry import get_loss
    from prefzoo.train.logps import PolicyLogps
    from prefzoo.train.reference import FrozenReference
    from prefzoo.types import PreferenceBatch

    model_dir = build_model_dir(Path(args.cache) / "llama-12m", ModelShape())
    tok = AutoTokenizer.from_pretrained(model_dir)
    lm = AutoModelForCausalLM.from_pretrained(model_dir, attn_implementation="sdpa")
    pairs = make_pairs(WORKLOADS[args.workload], args.batch, ModelShape().vocab_size, seed=3)
    examples = []
    for pr in pairs:
        ids = {k: tok(pr[k], add_special_tokens=False).input_ids for k in ("prompt", "chosen", "rejected")}
        examples.append(
            {
                "id": pr["id"],
                "prompt_ids": ids["prompt"],
                "chosen_ids": ids["chosen"] + [tok.eos_token_id],
                "rejected_ids": ids["rejected"] + [tok.eos_token_id],
            }
        )
    batches = {s: PreferenceCollator(tok.pad_token_id, share_prompt=s)(examples) for s in (False, True)}
    reference = FrozenReference(lm, 1024)
    policies = {f: PolicyLogps(lm, 1024, fused_head=f).train() for f in (False, True)}
    loss = get_loss("dpo")
    opt = torch.optim.AdamW([q for q in lm.parameters() if q.requires_grad], lr=1e-7)

    def step(cfg: dict[str, Any]) -> float:
        torch.set_num_threads(cfg.get("threads", args.threads))
        lm.config._attn_implementation = cfg.get("attn", "sdpa")
        reference.module.lm.config._attn_implementation = cfg.get("attn", "sdpa")
        batch = batches[cfg.get("share_prompt", False)]
        t0 = time.perf_counter()
        policy = policies[cfg.get("fused_head", True)]
        out = policy(batch["input_ids"], batch["attention_mask"], batch["completion_mask"])
        w, l_ = out.split()
        if cfg.get("no_reference"):
            ref_w, ref_l = torch.zeros_like(w["logps"]), torch.zeros_like(l_["logps"])
        else:
            ref_w, ref_l = reference(batch)
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
        torch.nn.utils.clip_grad_norm_(lm.parameters(), 1.0)
        opt.step()
        opt.zero_grad()
        return time.perf_counter() - t0

    names = list(CONFIGS)
    times: dict[str, list[float]] = {n: [] for n in names}
    for r in range(args.rounds):
        order = names[r % len(names) :] + names[: r % len(names)]
        for n in order:
            dt = step(CONFIGS[n])
            if r > 0:
                times[n].append(dt)
            print(f"[{args.workload} r{r}] {n}: {dt:.2f} s", flush=True)
    base = statistics.median(times[names[0]])
    rows = [
        {
            "config": n,
            "median_s": statistics.median(times[n]),
            "speedup": base / statistics.median(times[n]),
            "min_s": min(times[n]),
            "max_s": max(times[n]),
        }
        for n in names
    ]
    lines = [
        f"Workload {args.workload}, {args.rounds - 1} counted rounds, {args.threads} threads, interleaved in one "
        "process.",
        "",
        "| configuration | median s/step (min–max) | speed-up vs plain autograd head |",
        "|---|---|---|",
    ]
    lines += [
        f"| {r['config']} | {r['median_s']:.2f} ({r['min_s']:.2f}–{r['max_s']:.2f}) | {r['speedup']:.2f}× |"
        for r in rows
    ]
    table = "\n".join(lines) + "\n"
    print(table)
    out = Path(args.out or HERE / "results" / f"levers_interleaved_{args.workload}")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".json").write_text(
        json.dumps({"rows": rows, "times": times, "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())}, indent=1)
    )
    out.with_suffix(".md").write_text(table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
