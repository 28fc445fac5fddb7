"""What each setup step returns: small typed results that the next steps take (see :mod:`.pipeline`)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from prefzoo.train.checkpoint import Storage
from prefzoo.train.engines import Engine
from prefzoo.train.setup.shape_plan import ShapePlan

__all__ = ["LoadedModel", "PolicyParts", "Processes", "RunData", "Tokenized", "Wrapped"]


@dataclass(frozen=True)
class Processes:
    """The processes started: the engine, its Accelerator, the output dir's storage, the checkpoint resumed from."""

    engine: Engine
    accelerator: Any
    storage: Storage
    resume_path: Path | None  # None: a fresh start
    resume_info: dict[str, Any]  # the resumed checkpoint's marker ({} for a fresh start)

    def say(self, line: str) -> None:
        self.accelerator.print(f"prefzoo train: {line}")


@dataclass(frozen=True)
class RunData:
    """The data read and the shape the loss trains on."""

    train_dataset: Any  # normalized rows; None for an on-policy run (its data is generated)
    eval_dataset: Any  # normalized rows or None
    plan: ShapePlan
    prompts: list[Any] | None = None  # an on-policy run's prompts
    eval_plan: ShapePlan | None = None  # an on-policy run's held-out data in its own shape
    judge: Any = None  # an on-policy run's judge
    saved_classifier: Any = None  # a resumed --density-ratio run's classifier


@dataclass(frozen=True)
class LoadedModel:
    """The tokenizer (its chat template decided) and the model loaded for training."""

    tokenizer: Any  # with a pad token
    template: str  # what was decided about the chat template
    lm: Any  # the causal LM as loaded (before LoRA and the lean modules)
    has_adapter: bool  # the model folder held a LoRA adapter
    identity: str  # the weights' identity (checked on resume, keys the reference cache)
    defaults: Any  # ModelDefaults: the dropout turned off (or kept) and the token limits used


@dataclass(frozen=True)
class Tokenized:
    """The tokenized splits (an on-policy run: the held-out data only) and what tokenizing kept and dropped."""

    train: Any
    eval: Any
    stats: dict[str, Any]


@dataclass(frozen=True)
class PolicyParts:
    """The policy over the adapted model, its reference, the fast paths chosen and the batches' collator."""

    fast: Any  # FastPaths
    policy: Any  # PolicyLogps, not yet wrapped by the engine
    reference: Any  # a Reference, or None for reference-free losses
    ref_kind: str
    collate: Any


@dataclass(frozen=True)
class Wrapped:
    """What the engine wraps (policy, optimizer, train DataLoader, schedule), with the step counts."""

    policy: Any
    trainable: list[Any]
    optimizer: Any
    schedule: Any
    train_dl: Any  # None for an on-policy run
    eval_dl: Any  # None without held-out data
    steps: tuple[int, int, int]  # steps per epoch, total steps, epochs to iterate
