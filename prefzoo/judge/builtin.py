"""Built-in judges: ``oracle`` (exact, synthetic task), ``reward-model`` (classifier), ``llm`` (local causal LM)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from prefzoo.hookspecs import hookimpl
from prefzoo.judge.generation import padding_side
from prefzoo.judge.spec import JudgeSpec

__all__ = ["DEFAULT_LLM_TEMPLATE", "LLMJudge", "OracleJudge", "RewardModelJudge", "prefzoo_register_judges"]

Texts = Sequence[str]

DEFAULT_LLM_TEMPLATE = (
    "Which answer to the question is better?\n\nQuestion: {prompt}\n\nAnswer A: {answer_a}\n\n"
    "Answer B: {answer_b}\n\nThe better answer is"
)


class _PairJudge:
    """``judge(prompts, completions_1, completions_2)``: one verdict per prompt, P(completion 1 is better) in [0, 1]
    (0.5 a tie), after checking the three lists are as long; a subclass gives the verdicts (``_verdicts``)."""

    def __call__(self, prompts: Texts, completions_1: Texts, completions_2: Texts) -> list[float]:
        if not len(prompts) == len(completions_1) == len(completions_2):
            raise ValueError(f"judge: {len(prompts)} prompts but {len(completions_1)} and {len(completions_2)} "
                             "completions; they must match")
        return self._verdicts(prompts, completions_1, completions_2)

    def _verdicts(self, prompts: Texts, completions_1: Texts, completions_2: Texts) -> list[float]:
        raise NotImplementedError


class OracleJudge(_PairJudge):
    """Exact oracle of :mod:`prefzoo.data.synthetic`: the answer closer to a + b wins; malformed answers lose."""

    name = "oracle"

    def _verdicts(self, prompts: Texts, completions_1: Texts, completions_2: Texts) -> list[float]:
        from prefzoo.data.synthetic import judge

        try:
            return [judge(p, a, b) for p, a, b in zip(prompts, completions_1, completions_2, strict=True)]
        except ValueError as e:
            raise ValueError(
                f"oracle judge: {e}; the oracle only grades the bundled synthetic task "
                "(use --judge reward-model or a judge plugin for other prompts)"
            ) from None


class RewardModelJudge(_PairJudge):
    """Scores ``prompt + completion`` with a local sequence-classification model; the higher score wins.

    ``model_path``: a ``save_pretrained`` folder of an ``AutoModelForSequenceClassification``
    (its last logit is the reward).  Scores closer than ``tie_tolerance`` are a tie.
    """

    name = "reward-model"

    def __init__(
        self, model_path: str | Path | None = None, *, model: Any = None, tokenizer: Any = None,
        batch_size: int = 16, tie_tolerance: float = 0.0, max_length: int = 2048, device: str | None = None,
    ) -> None:  # fmt: skip
        if model is None:
            if model_path is None:
                raise ValueError("reward-model judge: give model_path=PATH (--judge-param model_path=PATH)")
            if not Path(model_path).is_dir():
                raise ValueError(f"reward-model judge: model_path {str(model_path)!r} is not a folder")
            from transformers import AutoModelForSequenceClassification, AutoTokenizer

            model = AutoModelForSequenceClassification.from_pretrained(model_path)
            tokenizer = tokenizer or AutoTokenizer.from_pretrained(model_path)
        if tokenizer is None:
            raise ValueError("reward-model judge: a model given in memory needs its tokenizer=...")
        if tokenizer.pad_token_id is None:
            tokenizer.pad_token = tokenizer.eos_token  # batched scoring needs padding
        if getattr(model.config, "pad_token_id", None) is None:
            model.config.pad_token_id = tokenizer.pad_token_id  # the classifier finds the last token through it
        self.model = model.eval() if device is None else model.to(device).eval()
        self.tokenizer = tokenizer
        self.batch_size, self.tie_tolerance, self.max_length = int(batch_size), float(tie_tolerance), int(max_length)

    def scores(self, prompts: Sequence[str], completions: Sequence[str]) -> list[float]:
        """One reward per (prompt, completion): the classifier's last logit on their concatenation."""
        import torch

        out: list[float] = []
        device = next(self.model.parameters()).device
        with padding_side(self.tokenizer, "right"):
            for i in range(0, len(prompts), self.batch_size):
                texts = [
                    p + c
                    for p, c in zip(prompts[i : i + self.batch_size], completions[i : i + self.batch_size], strict=True)
                ]
                enc = self.tokenizer(
                    texts, return_tensors="pt", padding=True, truncation=True, max_length=self.max_length
                )
                with torch.no_grad():
                    logits = self.model(**enc.to(device)).logits  # (b, num_labels)
                out.extend(logits[:, -1].float().tolist())
        return out

    def _verdicts(self, prompts: Texts, completions_1: Texts, completions_2: Texts) -> list[float]:
        s1, s2 = self.scores(prompts, completions_1), self.scores(prompts, completions_2)
        return [0.5 if abs(a - b) <= self.tie_tolerance else float(a > b) for a, b in zip(s1, s2, strict=True)]


class LLMJudge(_PairJudge):
    """LLM-as-judge with a local causal LM: compares the next-token log-probs of " A" and " B" after a template.

    Each pair is asked in both orders and the two verdicts averaged, which cancels the judge's position bias:
    ``judge(p, a, b) == 1 - judge(p, b, a)`` exactly.  The verdict is ``P(first better)`` in [0, 1]; it is a tie
    (0.5) when it lies within ``tie_tolerance`` of 0.5.  A template for an instruction-tuned judge can use its chat
    format; it must contain ``{prompt}``, ``{answer_a}`` and ``{answer_b}``.  For an API judge (GPT-4 as in
    AlpacaEval), write a plugin with the same call signature (see :mod:`prefzoo.judge.registry`).
    """

    name = "llm"

    def __init__(
        self, model_path: str | Path | None = None, *, model: Any = None, tokenizer: Any = None,
        template: str = DEFAULT_LLM_TEMPLATE, choices: tuple[str, str] = (" A", " B"), batch_size: int = 8,
        tie_tolerance: float = 0.0, device: str | None = None,
    ) -> None:  # fmt: skip
        if model is None:
            if model_path is None or not Path(model_path).is_dir():
                raise ValueError(f"llm judge: model_path={model_path!r} must be a local causal-LM folder")
            from transformers import AutoModelForCausalLM, AutoTokenizer

            model = AutoModelForCausalLM.from_pretrained(model_path)
            tokenizer = tokenizer or AutoTokenizer.from_pretrained(model_path)
        if tokenizer is None:
            raise ValueError("llm judge: a model given in memory needs its tokenizer=...")
        for key in ("{prompt}", "{answer_a}", "{answer_b}"):
            if key not in template:
                raise ValueError(f"llm judge: the template lacks {key}")
        ids_a, ids_b = (list(tokenizer(c, add_special_tokens=False).input_ids) for c in choices)
        k = 0  # shared leading tokens (" A"/" B" under a character tokenizer share " ") are appended to the text
        while k < min(len(ids_a), len(ids_b)) and ids_a[k] == ids_b[k]:
            k += 1
        if k == len(ids_a) or k == len(ids_b):
            raise ValueError(f"llm judge: choices {choices!r} must differ in their tokens")
        self.shared_prefix = ids_a[:k]
        self.choice_ids = (ids_a[k], ids_b[k])
        self.model = model.eval() if device is None else model.to(device).eval()
        self.tokenizer, self.template = tokenizer, template
        self.batch_size, self.tie_tolerance = int(batch_size), float(tie_tolerance)

    def prob_first(self, prompts: Sequence[str], answers_a: Sequence[str], answers_b: Sequence[str]) -> list[float]:
        """P(" A") / (P(" A") + P(" B")) at the end of the template, one order only."""
        import torch

        fmt = self.template.format
        texts = [fmt(prompt=p, answer_a=a, answer_b=b) for p, a, b in zip(prompts, answers_a, answers_b, strict=True)]
        out: list[float] = []
        pad = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else self.tokenizer.eos_token_id
        with padding_side(self.tokenizer, "left"):  # the last position is the next-token prediction for every row
            for i in range(0, len(texts), self.batch_size):
                enc = self.tokenizer(texts[i : i + self.batch_size], return_tensors="pt", padding=True)
                enc = enc.to(next(self.model.parameters()).device)
                if self.tokenizer.pad_token_id is None:
                    enc["input_ids"][enc["attention_mask"] == 0] = pad
                if self.shared_prefix:
                    n = enc["input_ids"].shape[0]
                    extra = torch.tensor([self.shared_prefix] * n, device=enc["input_ids"].device)  # (b, k)
                    enc["input_ids"] = torch.cat([enc["input_ids"], extra], dim=1)  # (b, T + k)
                    enc["attention_mask"] = torch.cat([enc["attention_mask"], torch.ones_like(extra)], dim=1)
                with torch.no_grad():
                    logits = self.model(**enc).logits[:, -1].float()  # (b, V)
                pair = logits[:, list(self.choice_ids)]  # (b, 2) logits of " A", " B"
                out.extend(pair.softmax(-1)[:, 0].tolist())
        return out

    def _verdicts(self, prompts: Texts, completions_1: Texts, completions_2: Texts) -> list[float]:
        first = self.prob_first(prompts, completions_1, completions_2)  # completion 1 shown as A
        second = self.prob_first(prompts, completions_2, completions_1)  # completion 1 shown as B
        verdicts = [(f + (1.0 - s)) / 2 for f, s in zip(first, second, strict=True)]
        return [0.5 if abs(v - 0.5) <= self.tie_tolerance else v for v in verdicts]


@hookimpl
def prefzoo_register_judges() -> list[Any]:
    return [
        JudgeSpec(
            name="oracle",
            factory=OracleJudge,
            grades_default_task=True,
            description="exact oracle of the bundled synthetic task: the addition answer closer to the truth wins",
        ),
        JudgeSpec(
            name="reward-model",
            factory=RewardModelJudge,
            description="a local AutoModelForSequenceClassification folder scores prompt+completion; higher wins",
            options={
                "model_path": "save_pretrained folder of the classifier (required)",
                "batch_size": "sequences per forward (16)",
                "tie_tolerance": "scores this close are a tie (0.0)",
                "max_length": "truncate prompt+completion to this many tokens (2048)",
                "device": "torch device, e.g. cuda:0 (the model's own by default)",
            },
        ),
        JudgeSpec(
            name="llm",
            factory=LLMJudge,
            description="LLM-as-judge with a local causal LM: P(' A') vs P(' B') after a template, both orders",
            options={
                "model_path": "save_pretrained folder of the judge LM (required)",
                "template": "prompt with {prompt}, {answer_a}, {answer_b} (a plain A/B question)",
                "choices": "the two answer tokens ([' A', ' B'])",
                "batch_size": "prompts per forward (8)",
                "tie_tolerance": "verdicts within this of 0.5 are a tie (0.0)",
                "device": "torch device (the model's own by default)",
            },
        ),
    ]
