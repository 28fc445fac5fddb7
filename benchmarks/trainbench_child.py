"""One benchmark run in its own process: prefzoo's trainer or TRL's, timed per optimizer step, peak RSS at the end.

Usage: ``python trainbench_child.py spec.json result.json`` (the parent writes the spec; see bench_train_throughput).
Step time runs from the trainer's ``on_step_begin`` to its ``on_step_end`` callback on both sides (the batch is
already loaded; logging and checkpoints are outside): prefzoo's trainer runs unmodified, timed by a callback.  The
tokens of a step are Σ over its pairs of 2·|x| + |y_w| + |y_l| (the plain chosen and rejected sequences), counted
from the batches the step trained on (prefzoo) or the examples the collator received (TRL).
"""

from __future__ import annotations

import json
import os
import resource
import sys
import tempfile
import time
from pathlib import Path
from typing import Any


def _example_shape(examples: list[dict[str, Any]]) -> list[dict[str, int]]:
    """Prompt / chosen / rejected token counts of each example (prefzoo and TRL DPO keys, or TRL CPO's)."""
    out = []
    for e in examples:
        if "prompt_ids" in e:
            out.append(
                {"prompt": len(e["prompt_ids"]), "chosen": len(e["chosen_ids"]), "rejected": len(e["rejected_ids"])}
            )
        else:  # CPO: chosen_input_ids / rejected_input_ids hold prompt + completion
            x = len(e["prompt_input_ids"])
            out.append(
                {"prompt": x, "chosen": len(e["chosen_input_ids"]) - x, "rejected": len(e["rejected_input_ids"]) - x}
            )
    return out


class _Recorder:
    """Step start/end times, collated batches (in order) and the reference precomputation time."""

    def __init__(self) -> None:
        self.starts: list[float] = []
        self.ends: list[float] = []
        self.batches: list[list[dict[str, int]]] = []
        self.precompute_s = 0.0

    def wrap_collator(self, collate: Any) -> Any:
        def collate_and_record(examples: list[dict[str, Any]]) -> Any:
            self.batches.append(_example_shape(examples))
            return collate(examples)

        return collate_and_record

    def timed(self, fn: Any) -> Any:
        def wrapper(*a: Any, **k: Any) -> Any:
            t0 = time.perf_counter()
            try:
                return fn(*a, **k)
            finally:
                self.precompute_s += time.perf_counter() - t0
                self.batches.clear()  # the precomputation's batches are not training steps

        return wrapper


def run_prefzoo(spec: dict[str, Any], rec: _Recorder, workdir: Path) -> dict[str, Any]:
    import datasets
    from trainbench_setup import step_timer

    from prefzoo.train import TrainConfig, train

    opts = dict(spec.get("prefzoo_options", {}))
    cfg = TrainConfig(
        model=spec["model_dir"],
        loss=spec["loss"],
        loss_params=spec.get("loss_params", {}),
        lr=1e-5,
        max_steps=spec.get("max_steps"),
        epochs=spec.get("epochs", 1),
        per_device_batch_size=spec["batch"],
        grad_accum=1,
        warmup_ratio=0.0,
        eval_fraction=0.0,
        lora=spec.get("lora", False),
        precompute_ref=spec.get("precompute", False),
        ref_cache_dir=str(workdir / "refcache"),
        output_dir=str(workdir / "out"),
        progress=False,
        report_to="none",
        seed=0,
        **opts,
    )
    timer = step_timer()
    train(cfg, train_dataset=datasets.Dataset.from_list(spec["pairs"]), callbacks=[timer])
    rec.starts, rec.ends, rec.batches = timer.starts, timer.ends, timer.batches
    rec.precompute_s = timer.setup_s.get("reference", 0.0)  # the reference precomputation, when on
    return {}


def run_trl(spec: dict[str, Any], rec: _Recorder, workdir: Path) -> dict[str, Any]:
    import datasets
    from trainbench_setup import reset_peak_rss
    from transformers import AutoTokenizer, TrainerCallback

    tok = AutoTokenizer.from_pretrained(spec["model_dir"])
    common = dict(
        output_dir=str(workdir / "out"),
        per_device_train_batch_size=spec["batch"],
        gradient_accumulation_steps=1,
        learning_rate=1e-5,
        lr_scheduler_type="cosine",
        warmup_steps=0,
        optim="adamw_torch",
        max_grad_norm=1.0,
        logging_steps=1,
        save_strategy="no",
        report_to="none",
        disable_tqdm=True,
        use_cpu=True,
        seed=0,
        dataloader_num_workers=0,
    )
    common = {"max_length": 4096, **common, **spec.get("trl_options", {})}  # trl_options may raise max_length
    if spec.get("max_steps"):
        common["max_steps"] = spec["max_steps"]
    else:
        common["num_train_epochs"] = spec.get("epochs", 1)
    peft_config = None
    if spec.get("lora"):
        from peft import LoraConfig
        from trainbench_setup import LORA_RANK

        peft_config = LoraConfig(
            r=LORA_RANK,
            lora_alpha=LORA_RANK,
            lora_dropout=0.01,
            task_type="CAUSAL_LM",
            bias="none",
            target_modules=["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"],
        )
    ds = datasets.Dataset.from_list([{k: p[k] for k in ("prompt", "chosen", "rejected")} for p in spec["pairs"]])
    if spec["trl_trainer"] == "cpo":
        from trl.experimental.cpo import CPOConfig, CPOTrainer

        args = CPOConfig(**common, **spec.get("trl_loss", {}))
        trainer = CPOTrainer(
            model=spec["model_dir"], args=args, train_dataset=ds, processing_class=tok, peft_config=peft_config
        )
    else:
        from trl import DPOConfig, DPOTrainer

        DPOTrainer._precompute_ref_logps = rec.timed(DPOTrainer._precompute_ref_logps)  # type: ignore[method-assign]
        args = DPOConfig(**common, precompute_ref_log_probs=spec.get("precompute", False), **spec.get("trl_loss", {}))
        loss_kw: dict[str, Any] = {}
        if spec.get("adapter_loss"):  # bench_trl_adapter: a prefzoo loss inside TRL's trainer (one changed import)
            from prefzoo.integrations.trl import DPOTrainer  # type: ignore[assignment]

            loss_kw = {"loss": spec["adapter_loss"]}
        trainer = DPOTrainer(
            model=spec["model_dir"],
            args=args,
            train_dataset=ds,
            processing_class=tok,
            peft_config=peft_config,
            **loss_kw,
        )

    class Timer(TrainerCallback):
        def on_step_begin(self, *a: Any, **k: Any) -> None:
            reset_peak_rss()
            rec.starts.append(time.perf_counter())

        def on_step_end(self, *a: Any, **k: Any) -> None:
            rec.ends.append(time.perf_counter())

    trainer.data_collator = rec.wrap_collator(trainer.data_collator)
    trainer.add_callback(Timer())
    trainer.train()
    return {"trl_gradient_checkpointing": bool(args.gradient_checkpointing), "trl_bf16": bool(args.bf16)}


def main() -> None:
    spec = json.loads(Path(sys.argv[1]).read_text())
    if spec["side"] == "prefzoo":  # as `prefzoo train` starts: its allocator setting, before torch loads
        from prefzoo.cli.runtime import huge_pages

        huge_pages()
    import torch

    torch.set_num_threads(int(spec["threads"]))
    from trainbench_setup import matmul_rate, process_peak_rss_mb, step_peak_rss_mb

    rate = matmul_rate(int(spec["threads"]))
    rss_start = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    rec = _Recorder()
    with tempfile.TemporaryDirectory(prefix="trainbench-") as tmp:
        extra = (run_prefzoo if spec["side"] == "prefzoo" else run_trl)(spec, rec, Path(tmp))
    n = min(len(rec.starts), len(rec.ends))
    steps = [rec.ends[k] - rec.starts[k] for k in range(n)]
    result = {
        "step_s": steps,
        "batches": rec.batches[:n],
        "tokens": [_example_tokens_from_shape(b) for b in rec.batches[:n]],
        "precompute_s": rec.precompute_s,
        "peak_rss_mb": process_peak_rss_mb(),
        "peak_steps_mb": step_peak_rss_mb(),  # from the first step on: without set-up (prefzoo's self-check)
        "rss_after_import_mb": rss_start / 1024,
        "matmul_flops": rate,
        **extra,
    }
    Path(sys.argv[2]).write_text(json.dumps(result))
    sys.stdout.flush()
    os._exit(0)


def _example_tokens_from_shape(batch: list[dict[str, int]]) -> int:
    return sum(2 * p["prompt"] + p["chosen"] + p["rejected"] for p in batch)


if __name__ == "__main__":
    main()
