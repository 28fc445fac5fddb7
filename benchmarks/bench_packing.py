"""Packing against the unpacked path, and LoRA's dropout and reference pass, in one process with sides alternating.

    python benchmarks/bench_packing.py            # the table in docs/results/performance-growth.md
    python benchmarks/bench_packing.py --flex     # and SDPA against FlexAttention on the packed rows' masks
    python benchmarks/bench_packing.py --quick    # smoke: smaller model, 1 repeat
    python benchmarks/bench_packing.py --only split   # only the shared-prompt attention, masked against split
    python benchmarks/bench_packing.py --only flat    # only padded rows against one padding-free row (both split)

Timings are in-process forward + backward through :func:`prefzoo.sequence_logps` (the trainer's own log-prob
call), medians over repeats with the sides alternating; compare only the ratios printed in one run.
"""

from __future__ import annotations

import argparse
import random
import statistics
import time
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from transformers import LlamaConfig, LlamaForCausalLM

from prefzoo.data.collate import PreferenceCollator
from prefzoo.model.fast.packing import pack_rows
from prefzoo.model.loading import apply_lora
from prefzoo.model.logps import PolicyLogps, sequence_logps
from prefzoo.scoring import AdapterDisabledReference

LORA_TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


def _model(hidden: int, layers: int) -> LlamaForCausalLM:
    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=4096, hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=layers,
                      num_attention_heads=4, max_position_embeddings=2048)  # fmt: skip
    cfg._attn_implementation = "sdpa"
    return LlamaForCausalLM(cfg)


def _pairs(n: int, spread: int, seed: int = 0) -> list[dict]:
    rng = random.Random(seed)

    def ids(k: int) -> list[int]:
        return [rng.randint(3, 4000) for _ in range(k)]

    return [{"id": str(i), "prompt_ids": ids(rng.randint(20, 60)), "chosen_ids": ids(rng.randint(20, 20 + spread)),
             "rejected_ids": ids(rng.randint(20, 20 + spread))} for i in range(n)]  # fmt: skip


def _median(samples: list[float]) -> float:
    return statistics.median(samples[1:] if len(samples) > 2 else samples)


def _alternating(run: Callable[[Any], object], sides: tuple[Any, ...], repeats: int) -> dict[Any, float]:
    """Median seconds of ``run(side)`` for each side over ``repeats`` + 1 rounds, the order reversed every other
    round (:func:`_median` drops the first round, a warm-up)."""
    times: dict[Any, list[float]] = {s: [] for s in sides}
    for rep in range(repeats + 1):
        for side in sides if rep % 2 == 0 else sides[::-1]:
            t0 = time.perf_counter()
            run(side)
            times[side].append(time.perf_counter() - t0)
    return {s: _median(t) for s, t in times.items()}


def packing_rows(model: LlamaForCausalLM, repeats: int) -> list[str]:
    rows = []
    for spread in (20, 300):
        pairs = _pairs(8, spread)
        for share in (False, True):
            b = PreferenceCollator(0, share_prompt=share)(pairs)
            args = (b["input_ids"], b["attention_mask"], b["completion_mask"])
            med = _alternating(
                lambda packing, args=args: sequence_logps(model, *args, packing=packing).logps.sum().backward(),
                (False, True), repeats,
            )  # fmt: skip
            pad = 1 - float(b["attention_mask"].sum()) / b["attention_mask"].numel()
            u, p = med[False], med[True]
            rows.append(f"| packing, completions 20–{20 + spread}, share_prompt={share} ({pad:.0%} padding) "
                        f"| unpacked {u:.2f} s | packed {p:.2f} s | {u / p:.2f}× |")  # fmt: skip
    return rows


def lora_rows(hidden: int, layers: int, repeats: int) -> list[str]:
    b = PreferenceCollator(0)(_pairs(4, 50))
    args = (b["input_ids"], b["attention_mask"], b["completion_mask"])
    policies = {d: PolicyLogps(apply_lora(_model(hidden, layers), 64, 64, d, LORA_TARGETS)) for d in (0.01, 0.0)}
    for p in policies.values():
        p.train()
    step: dict[float, list[float]] = {0.01: [], 0.0: []}
    ref_off, ref_on = [], []
    reference = AdapterDisabledReference(policies[0.0])
    for rep in range(repeats + 1):
        for d in (0.01, 0.0) if rep % 2 == 0 else (0.0, 0.01):
            t0 = time.perf_counter()
            policies[d](*args).logps.sum().backward()
            step[d].append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        reference(b)
        ref_off.append(time.perf_counter() - t0)
        policies[0.0].eval()
        with torch.no_grad():
            t0 = time.perf_counter()
            policies[0.0](*args)
            ref_on.append(time.perf_counter() - t0)
        policies[0.0].train()
    a, z = _median(step[0.01]), _median(step[0.0])
    on, off = _median(ref_on), _median(ref_off)
    return [
        f"| LoRA r 64, policy forward + backward | lora_dropout 0.01: {a:.2f} s | 0.0: {z:.2f} s | {a / z:.2f}× |",
        f"| LoRA reference pass | adapters enabled: {on:.2f} s | disable_adapter(): {off:.2f} s | {on / off:.2f}× |",
    ]


def flex_rows(hidden: int, repeats: int) -> list[str]:
    """SDPA with prefzoo's packed 4-D mask against compiled FlexAttention with the same mask as a BlockMask (which
    skips whole masked blocks), attention alone on the packed rows' shapes; forward only when torch's CPU
    FlexAttention has no backward (then only the no-grad reference pass could use it)."""
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention

    flex = torch.compile(flex_attention)
    heads, rows = 4, []
    for share in (False, True):
        b = PreferenceCollator(0, share_prompt=share)(_pairs(8, 300))
        packed = pack_rows(b["input_ids"], b["attention_mask"], b["completion_mask"], share)
        doc, kind = packed.doc, packed.kind
        r, t = doc.shape
        additive = torch.zeros(r, 1, t, t).masked_fill_(~packed.mask(), float("-inf"))

        def allowed(b_, h_, q_, k_, doc=doc, kind=kind):  # PackedRows.mask(), index by index
            own = (q_ >= k_) & (doc[b_, q_] == doc[b_, k_]) & (doc[b_, k_] != 0)
            return (own & ~((kind[b_, q_] == 3) & (kind[b_, k_] == 2))) | ((q_ == k_) & (doc[b_, q_] == 0))

        block = create_block_mask(allowed, r, None, t, t, device="cpu")
        q, k, v = (torch.randn(r, heads, t, hidden // heads, generator=torch.Generator().manual_seed(i))
                   for i in range(3))  # fmt: skip
        try:  # eager, not the compiled function: an error inside it would leave that function uncompiled
            flex_attention(q.clone().requires_grad_(), k, v, block_mask=block).sum().backward()
            backward = "has a backward"
        except NotImplementedError:
            backward = "has **no backward on CPU**"

        def attend(side: str, q=q, k=k, v=v, additive=additive, block=block) -> torch.Tensor:
            if side == "sdpa":
                return F.scaled_dot_product_attention(q, k, v, additive)
            return flex(q, k, v, block_mask=block)

        with torch.no_grad():
            diff = float((attend("flex") - attend("sdpa")).abs().amax())
            # (the call above also compiled this shape: the timed calls below run the compiled kernel)
            med = _alternating(attend, ("sdpa", "flex"), repeats)
        sd, fx = med["sdpa"], med["flex"]
        rows.append(f"| attention forward on packed rows ({r} × {t}, share_prompt={share}, {block.sparsity():.0f}% "
                    f"of blocks skipped by Flex; max diff {diff:.1e}; Flex {backward}) | SDPA + 4-D mask "
                    f"{sd * 1e3:.1f} ms | FlexAttention {fx * 1e3:.1f} ms | {sd / fx:.2f}× |")  # fmt: skip
    return rows


def _goal_batches(quick: bool) -> tuple[Any, list[tuple[str, list[dict[str, Any]]]]]:
    """The goals benchmark's model (sdpa) and 4-pair batches of token ids: UltraFeedback- and Orca-shaped lengths,
    and rows of about 2,000 tokens with a 1,000-token prompt (the tiny shape with ``quick``)."""
    import tempfile

    from trainbench_setup import TINY_SHAPE, WORKLOADS, ModelShape, Workload, build_model_dir, make_pairs
    from transformers import AutoModelForCausalLM, AutoTokenizer

    shape = TINY_SHAPE if quick else ModelShape()
    with tempfile.TemporaryDirectory() as tmp:
        path = build_model_dir(tmp, shape)
        model = AutoModelForCausalLM.from_pretrained(path, attn_implementation="sdpa")
        tok = AutoTokenizer.from_pretrained(path)
    long_rows = Workload("long-prompt", prompt=(900, 1100), completion=(300, 500))  # rows of about 2,000 tokens
    batches = []
    for wl in [WORKLOADS["tiny"]] if quick else [WORKLOADS["ultrafeedback"], WORKLOADS["orca"], long_rows]:
        text = make_pairs(wl, 4, shape.vocab_size, seed=1)
        pairs = [{"id": str(i), "prompt_ids": tok(p["prompt"])["input_ids"],
                  "chosen_ids": tok(p["chosen"])["input_ids"], "rejected_ids": tok(p["rejected"])["input_ids"]}
                 for i, p in enumerate(text)]  # fmt: skip
        batches.append((wl.name, pairs))
    return model, batches


def _policy_and_reference(model: Any, args: tuple, **options: Any) -> None:
    """One step's log-prob work: policy forward + backward, then the no-grad reference pass."""
    model.zero_grad(set_to_none=True)
    sequence_logps(model, *args, **options).logps.sum().backward()
    with torch.no_grad():
        sequence_logps(model, *args, **options)


def _off_on(
    model: Any, pairs: list[dict[str, Any]], share: bool, option: str, repeats: int
) -> tuple[Any, float, float]:
    """(the collated batch, median s with ``option`` off, with it on) of :func:`_policy_and_reference`."""
    b = PreferenceCollator(0, share_prompt=share)(pairs)
    args = (b["input_ids"], b["attention_mask"], b["completion_mask"])
    med = _alternating(lambda on, a=args: _policy_and_reference(model, a, **{option: on}), (False, True), repeats)
    return b, med[False], med[True]


def split_rows(quick: bool, repeats: int) -> list[str]:
    """Shared-prompt attention as one masked SDPA call per layer or split into two causal parts (fastpath_split)."""
    model, batches = _goal_batches(quick)
    rows = []
    for name, pairs in batches:
        b, m, s_ = _off_on(model, pairs, True, "split_attention", repeats)
        rows.append(f"| shared-prompt attention, {name}-shaped, 4 pairs, rows of {b['input_ids'].shape[1]} "
                    f"| masked {m:.2f} s | split {s_:.2f} s | {m / s_:.2f}× |")  # fmt: skip
    return rows


def flat_rows(quick: bool, repeats: int) -> list[str]:
    """Padded rows with the split attention against one padding-free row with the split gathered from it
    (``packing=True`` under SDPA), shared-prompt and plain layouts."""
    model, batches = _goal_batches(quick)
    rows = []
    for name, pairs in batches:
        for share in (True, False):
            b, u, f = _off_on(model, pairs, share, "packing", repeats)
            pad = 1 - float(b["attention_mask"].sum()) / b["attention_mask"].numel()
            rows.append(f"| padding-free row, {name}-shaped, 4 pairs, share_prompt={share}, {pad:.0%} padding "
                        f"| padded {u:.2f} s | one row {f:.2f} s | {u / f:.2f}× |")  # fmt: skip
    return rows


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="smoke: hidden 64, 2 layers, 1 repeat")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--flex", action="store_true", help="add SDPA against FlexAttention (compiles: ~15-30 s a shape)")
    p.add_argument("--only", choices=("packing", "lora", "split", "flat"), help="one comparison instead of all")
    a = p.parse_args(argv)
    hidden, layers, repeats = (64, 2, 1) if a.quick else (256, 4, a.repeats)
    lines = ["| what | A | B | A / B |", "| --- | --- | --- | --- |"]
    if a.only in (None, "packing"):
        lines += packing_rows(_model(hidden, layers), repeats)
    if a.only in (None, "lora"):
        lines += lora_rows(hidden, layers, repeats)
    if a.only in (None, "split"):
        lines += split_rows(a.quick, repeats)
    if a.only in (None, "flat"):
        lines += flat_rows(a.quick, repeats)
    if a.flex:
        lines += flex_rows(hidden, max(repeats, 5))
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
