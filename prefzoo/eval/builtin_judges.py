"""The built-in judges: ``oracle`` (exact, for the bundled synthetic task) and ``reward-model`` (a local classifier)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from prefzoo.hookspecs import hookimpl

__all__ = ["OracleJudge", "RewardModelJudge", "prefzoo_register_judges"]


class OracleJudge:
    """Exact oracle of :mod:`prefzoo.data.synthetic`: the answer closer to a + b wins; malformed answers lose."""

    name = "oracle"

    def __call__(
        self, prompts: Sequence[str], completions_1: Sequence[str], completions_2: Sequence[str]
    ) -> list[float]:
        from prefzoo.data.synthetic import judge

        _check_lengths(prompts, completions_1, completions_2)
        try:
            return [judge(p, a, b) for p, a, b in zip(prompts, completions_1, completions_2, strict=True)]
        except ValueError as e:
            raise ValueError(
                f"oracle judge: {e}; the oracle only grades the bundled synthetic task "
                "(use --judge reward-model or a judge plugin for other prompts)"
            ) from None


class RewardModelJudge:
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
                raise ValueError("reward-model judge: give model_path=PATH (--judge-arg model_path=PATH)")
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
        old_side = self.tokenizer.padding_side
        self.tokenizer.padding_side = "right"
        try:
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
        finally:
            self.tokenizer.padding_side = old_side
        return out

    def __call__(
        self, prompts: Sequence[str], completions_1: Sequence[str], completions_2: Sequence[str]
    ) -> list[float]:
        _check_lengths(prompts, completions_1, completions_2)
        s1, s2 = self.scores(prompts, completions_1), self.scores(prompts, completions_2)
        return [0.5 if abs(a - b) <= self.tie_tolerance else float(a > b) for a, b in zip(s1, s2, strict=True)]


def _check_lengths(prompts: Sequence[str], c1: Sequence[str], c2: Sequence[str]) -> None:
    if not len(prompts) == len(c1) == len(c2):
        raise ValueError(f"judge: {len(prompts)} prompts but {len(c1)} and {len(c2)} completions; they must match")


@hookimpl
def prefzoo_register_judges() -> list[Any]:
    from prefzoo.eval.judges import JudgeSpec

    return [
        JudgeSpec(
            name="oracle",
            factory=OracleJudge,
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
    ]
