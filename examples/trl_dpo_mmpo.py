"""MMPO with TRL's DPOTrainer: TRL's DPO example script with one changed import and one more argument.

    pip install -e ".[trl]"                                           # in the prefzoo clone
    python examples/trl_dpo_mmpo.py                                   # Qwen2.5-0.5B-Instruct on UltraFeedback
    python examples/trl_dpo_mmpo.py --loss "0.8*dpo + 0.2*sft"        # any prefzoo loss or weighted sum
    python examples/trl_dpo_mmpo.py --tiny                            # offline: a tiny random model, 8 pairs

Everything else (dataset preparation, chat template, reference model, LoRA, callbacks, logging, saving) is TRL's;
``accelerate launch examples/trl_dpo_mmpo.py`` trains on several processes, and MMPO's reward normalization then
spans all of them.  docs/trl.md has the details.
"""

from __future__ import annotations

import argparse

from datasets import Dataset, load_dataset
from transformers import AutoModelForCausalLM, AutoTokenizer
from trl import DPOConfig

from prefzoo.integrations.trl import DPOTrainer  # was: from trl import DPOTrainer


def tiny_model_and_data(out: str) -> tuple[str, Dataset]:
    """A tiny random Llama saved to ``out`` (TRL loads its reference copy by path) and 8 arithmetic pairs."""
    from prefzoo.testing import tiny_causal_lm

    model, tokenizer = tiny_causal_lm(seed=0)
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    rows = [{"prompt": f"{a}+{a}=", "chosen": f" {2 * a}", "rejected": f" {2 * a + 1}"} for a in range(1, 9)]
    return out, Dataset.from_list(rows)


def main(argv: list[str] | None = None) -> DPOTrainer:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="Qwen/Qwen2.5-0.5B-Instruct")
    parser.add_argument("--dataset", default="trl-lib/ultrafeedback_binarized")
    parser.add_argument("--loss", default="mmpo", help="a prefzoo loss (`prefzoo losses`) or a weighted sum")
    parser.add_argument("--beta", type=float, default=0.1, help="DPOConfig.beta: MMPO's β, as DPO's")
    parser.add_argument("--output-dir", default="Qwen2.5-0.5B-MMPO")
    parser.add_argument("--max-steps", type=int, default=-1)
    parser.add_argument("--tiny", action="store_true", help="a tiny random model and 8 pairs, no downloads")
    args = parser.parse_args(argv)

    if args.tiny:
        model_name, train_dataset = tiny_model_and_data(f"{args.output_dir}/tiny-model")
    else:
        model_name, train_dataset = args.model, load_dataset(args.dataset, split="train")
    model = AutoModelForCausalLM.from_pretrained(model_name)
    tokenizer = AutoTokenizer.from_pretrained(model_name)

    training_args = DPOConfig(
        output_dir=args.output_dir,
        beta=args.beta,
        per_device_train_batch_size=4,
        learning_rate=5e-7 if not args.tiny else 1e-3,
        max_steps=args.max_steps,
        logging_steps=1 if args.tiny else 10,
        bf16=not args.tiny,  # on CPU: fp32
        gradient_checkpointing=not args.tiny,
        use_cpu=args.tiny,
        report_to="none" if args.tiny else "all",
    )
    trainer = DPOTrainer(
        model=model,
        args=training_args,
        train_dataset=train_dataset,
        processing_class=tokenizer,
        loss=args.loss,  # the one new argument; loss_params={...} sets the loss's other parameters
    )
    trainer.train()
    trainer.save_model(args.output_dir)
    return trainer


if __name__ == "__main__":
    main()
