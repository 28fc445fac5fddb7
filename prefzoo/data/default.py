"""The embedded default task: preference pairs and held-out prompts of two synthetic skills, and where its tiny
policy lives; all built locally, nothing touches the network.

Its starting policy (a character-level tokenizer and a tiny ``LlamaForCausalLM`` that a short deterministic supervised
warm-up taught the two skills of :mod:`prefzoo.data.synthetic`: noisy two-digit addition, skill A with an exact
oracle, and exact string reversal, skill B) is loaded by :func:`prefzoo.model.load_default_task`, which builds it when
it is not the one shipped (:mod:`prefzoo.model.default_policy`).  This module holds the data side: the warm-up's
settings (:class:`WarmupConfig`, part of the cache key), the shipped folder (``assets/default-task``, seed 0), the
cache root (``$PREFZOO_CACHE``, else ``$XDG_CACHE_HOME/prefzoo``, else ``~/.cache/prefzoo``) and
:func:`default_task`, which puts a policy folder together with the task's data.  Its oracle evaluation is
:func:`prefzoo.eval.default_task.evaluate_policy`.

Tokenization contract (what the trainer does): prompts with
``tokenizer(prompt).input_ids`` -> ``[<bos>, chars...]``; completions with
``tokenizer(completion, add_special_tokens=False).input_ids + [eos]``.  The
tokenizer has no chat template; ``<pad>`` (id 0) and ``<eos>`` (id 2) are set.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import tempfile
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from prefzoo.data import synthetic
from prefzoo.data.tiny import CHARS, char_tokenizer

if TYPE_CHECKING:
    import datasets

__all__ = [
    "ASSET_DIR",
    "DEFAULT_DATA",
    "DEFAULT_TASK_VERSION",
    "DefaultTask",
    "WarmupConfig",
    "build_tokenizer",
    "cache_key",
    "cache_root",
    "default_task",
    "shipped_model_dir",
    "staging_dir",
]

DEFAULT_TASK_VERSION = "v2"  # bump when the data or the warm-up changes: the cache key includes it
CACHE_ENV = "PREFZOO_CACHE"
# the warmed-up policy of seed 0 ships as package data (scripts/build_default_assets.py makes it)
ASSET_DIR = Path(__file__).parent / "assets" / "default-task"
SHIPPED_SEED = 0
DEFAULT_DATA = ("pairs", "lists", "unpaired")  # --dataset default:SHAPE (plain `default` = pairs)
STATS_FILE = "prefzoo_warmup.json"  # warm-up stats; in the shipped folder also the cache key it was built for


@dataclass(frozen=True)
class WarmupConfig:
    """The tiny model and its supervised warm-up (all part of the cache key)."""

    hidden_size: int = 64  # d_model
    intermediate_size: int = 256  # MLP width, 4 × d_model
    num_hidden_layers: int = 2
    num_attention_heads: int = 4  # head dim 16
    max_position_embeddings: int = 64  # longest sequence is 17 tokens ("<bos>rev abcde=edcba<eos>")
    steps: int = 1000  # AdamW steps (~30 s on one idle core, ~100 s on a loaded 2-core machine)
    batch_size: int = 64  # sequences per step: 1000 × 64 = 64k sequences ≈ 20 passes over the warm-up data
    lr: float = 3e-3  # peak learning rate, linear warm-up 100 steps then cosine to 10%
    warmup_steps: int = 100
    weight_decay: float = 0.01
    rev_fraction: float = 0.4  # share of reversal sequences in each batch (skill B)


def cache_root(cache_dir: str | os.PathLike[str] | None = None) -> Path:
    """``cache_dir``, else ``$PREFZOO_CACHE``, else ``$XDG_CACHE_HOME/prefzoo``, else ``~/.cache/prefzoo``.

    Every prefzoo cache (the default task, precomputed reference log-probs under ``ref/``) lives below this root.
    """
    if cache_dir is not None:
        return Path(cache_dir)
    env = os.environ.get(CACHE_ENV)
    if env:
        return Path(env)
    xdg = os.environ.get("XDG_CACHE_HOME")
    return Path(xdg) / "prefzoo" if xdg and os.path.isabs(xdg) else Path.home() / ".cache" / "prefzoo"


@dataclass
class DefaultTask:
    """The embedded default task: model folder, preference splits, held-out prompts and the oracle evaluation."""

    model_dir: Path  # save_pretrained() folder: tiny LlamaForCausalLM + tokenizer (pad, eos, bos set)
    train: datasets.Dataset  # id, prompt, chosen, rejected
    eval: datasets.Dataset  # held-out pairs, same columns
    heldout_prompts: list[str]  # win-rate prompts of skill A, disjoint from every other split
    retention_prompts: list[str]  # skill-B prompts ("rev abc="), strings not seen in the warm-up
    retention_targets: list[str]  # their exact answers
    recommended: dict[str, Any]  # train settings sized for well under 2 min on 2 CPU cores
    seed: int = 0
    warmup_stats: dict[str, Any] = field(default_factory=dict)  # what the warm-up measured (from the cache)
    # greedy completions of the starting policy, keyed by the prompt sets (dataclasses.replace starts afresh);
    # filled by prefzoo.eval.default_task.evaluate_policy
    _start_cache: dict[Any, tuple[list[str], list[str]]] = field(
        default_factory=dict, init=False, repr=False, compare=False
    )

    def data(self, shape: str = "pairs") -> tuple[datasets.Dataset, datasets.Dataset]:
        """(train, eval) of ``shape``, on the same prompts as the pairs: ``pairs``, ``lists`` (K = 4 drafts ranked by
        the oracle, :func:`synthetic.make_lists`) or ``unpaired`` (two drafts per prompt, desirable when exact,
        :func:`synthetic.make_unpaired`)."""
        import datasets

        if shape == "pairs":
            return self.train, self.eval
        make = {"lists": synthetic.make_lists, "unpaired": synthetic.make_unpaired}.get(shape)
        if make is None:
            raise ValueError(f"default task data {shape!r}: choose one of {', '.join(DEFAULT_DATA)}")
        splits = synthetic.make_splits(self.seed)
        return (
            datasets.Dataset.from_list(make(splits.pref_train, self.seed, "train")),
            datasets.Dataset.from_list(make(splits.pref_eval, self.seed, "eval")),
        )

    def load_model(self) -> Any:
        """A fresh copy of the starting policy (LlamaForCausalLM, eval mode, float32)."""
        from transformers import AutoModelForCausalLM

        return AutoModelForCausalLM.from_pretrained(self.model_dir).eval()

    def load_tokenizer(self) -> Any:
        from transformers import AutoTokenizer

        return AutoTokenizer.from_pretrained(self.model_dir)


RECOMMENDED: dict[str, Any] = {
    "epochs": 1,  # 600 pairs / (8 per step × 1 accumulation) = 75 optimizer steps
    "per_device_batch_size": 8,
    "grad_accum": 1,
    "lr": 2e-4,  # peak AdamW lr (cosine, 10% warm-up); 1 epoch: mmpo/dpo/simpo all gain, retention intact
    "max_prompt_length": 16,  # longest prompt "<bos>49+49=" is 7 tokens
    "max_completion_length": 8,  # "98<eos>" is 3 tokens
    "warmup_ratio": 0.1,
}


def build_tokenizer() -> Any:
    """The character-level tokenizer: one token per character of CHARS, ``<bos>`` prepended to plain calls."""
    return char_tokenizer(CHARS)


def cache_key(cfg: WarmupConfig, seed: int) -> str:
    noise = {"offsets": synthetic.NOISE_OFFSETS, "probs": synthetic.NOISE_PROBS, "range": synthetic.ADD_RANGE}
    blob = json.dumps(
        {"v": DEFAULT_TASK_VERSION, "cfg": asdict(cfg), "chars": CHARS, "seed": seed, "noise": noise}, sort_keys=True
    )
    return f"default-task-{DEFAULT_TASK_VERSION}-seed{seed}-{hashlib.sha256(blob.encode()).hexdigest()[:10]}"


@contextlib.contextmanager
def staging_dir(final: Path) -> Iterator[Path]:
    """A fresh folder beside ``final`` for the block to fill and move into place; removed if the block fails."""
    tmp = Path(tempfile.mkdtemp(prefix=final.name + ".tmp-", dir=final.parent))
    try:
        yield tmp
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def shipped_model_dir(key: str) -> Path | None:
    """The shipped model folder when it was built for the cache key ``key``, else None (then it is built in the
    cache)."""
    stats = ASSET_DIR / STATS_FILE
    if not (ASSET_DIR / "model.safetensors").exists() or not stats.exists():
        return None
    return ASSET_DIR if json.loads(stats.read_text()).get("cache_key") == key else None


def default_task(model_dir: Path, seed: int = 0) -> DefaultTask:
    """The default task around the policy folder ``model_dir``: the preference splits of ``seed``, the held-out and
    retention prompts, the recommended settings and the warm-up's stats (read from the folder)."""
    import datasets

    splits = synthetic.make_splits(seed)
    stats_file = model_dir / STATS_FILE
    stats = json.loads(stats_file.read_text()) if stats_file.exists() else {}
    stats.pop("cache_key", None)
    train = datasets.Dataset.from_list(synthetic.make_pairs(splits.pref_train, seed, "train"))
    eval_ = datasets.Dataset.from_list(synthetic.make_pairs(splits.pref_eval, seed, "eval"))
    return DefaultTask(
        model_dir=model_dir,
        train=train,
        eval=eval_,
        heldout_prompts=[p.prompt for p in splits.heldout],
        retention_prompts=[synthetic.reversal_prompt(s) for s in splits.rev_heldout],
        retention_targets=[s[::-1] for s in splits.rev_heldout],
        recommended=dict(RECOMMENDED),
        seed=seed,
        warmup_stats=stats,
    )
