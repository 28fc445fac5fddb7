"""BCO (or any prefzoo unpaired loss) with TRL's KTOTrainer: TRL's KTO example with one changed import and one
more argument.

    pip install -e ".[trl]"                                       # in the prefzoo clone
    python examples/trl_kto.py                                    # Qwen2.5-0.5B-Instruct on trl-lib/kto-mix-14k, BCO
    python examples/trl_kto.py --loss kto                         # KTO, as TRL's own loss_type="kto"
    python examples/trl_kto.py --loss "0.5*kto + 0.5*bco"         # a weighted sum of unpaired losses
    python examples/trl_kto.py --tiny                             # offline: a tiny random model, 16 examples

Everything else (unpairing, tokenization, the KL completions KTO needs, reference model, LoRA, callbacks, logging,
saving) is TRL's; ``accelerate launch examples/trl_kto.py`` trains on several processes.  docs/trl.md has the details.
"""

from __future__ import annotations

import argparse

from datasets import Dataset, load_dataset
from transformers import AutoModelForCausalLM, AutoTokenizer
from trl import KTOConfig

from prefzoo.integrations.trl import KTOTrainer  # was: from trl import KTOTrainer


def tiny_model_and_data(out: str) -> tuple[str, Dataset]:
    """A tiny random Llama saved to ``out`` (TRL loads its reference copy by path) and 16 labelled completions."""
    from prefzoo.testing import tiny_causal_lm

    model, tokenizer = tiny_causal_lm(seed=0)
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    rows = [{"prompt": f"{a}+{a}=", "completion": f" {2 * a + (a % 2)}", "label": a % 2 == 0} for a in range(1, 17)]
    return out, Dataset.from_list(rows)


def main(argv: list[str] | None = None) -> KTOTrainer:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="Qwen/Qwen2.5-0.5B-Instruct")
    parser.add_argument("--dataset", default="trl-lib/kto-mix-14k")
    parser.add_argument("--loss", default="bco", help="a prefzoo unpaired loss (`prefzoo losses`) or a weighted sum")
    parser.add_argument("--beta", type=float, default=0.1, help="KTOConfig.beta: the loss's β")
    parser.add_argument("--output-dir", default="Qwen2.5-0.5B-BCO")
    parser.add_argument("--max-steps", type=int, default=-1)
    parser.add_argument("--tiny", action="store_true", help="a tiny random model and 16 examples, no downloads")
    args = parser.parse_args(argv)

    if args.tiny:
        model_name, train_dataset = tiny_model_and_data(f"{args.output_dir}/tiny-model")
    else:
        model_name, train_dataset = args.model, load_dataset(args.dataset, split="train")
    model = AutoModelForCausalLM.from_pretrained(model_name)
    tokenizer = AutoTokenizer.from_pretrained(model_name)

    training_args = KTOConfig(
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
    trainer = KTOTrainer(
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
