"""The embedded default task: a warmed-up tiny Llama, preference pairs and an oracle evaluation, all built locally.

``load_default_task()`` builds (the first time: ~30 s on an idle core, ~100 s on a busy 2-core machine) or loads
(cached under ``$PREFZOO_CACHE`` or ``~/.cache/prefzoo``) a character-level
tokenizer and a tiny ``LlamaForCausalLM`` that a short deterministic supervised
warm-up taught two skills (see :mod:`prefzoo.data.synthetic`): noisy two-digit
addition (skill A, exact oracle) and exact string reversal (skill B).  Nothing
touches the network.

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
import random
import shutil
import tempfile
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from prefzoo.data import synthetic

if TYPE_CHECKING:
    import datasets
    import torch

__all__ = ["DEFAULT_TASK_VERSION", "DefaultTask", "WarmupConfig", "cache_root", "load_default_task"]

DEFAULT_TASK_VERSION = "v2"  # bump when the data or the warm-up changes: the cache key includes it
CACHE_ENV = "PREFZOO_CACHE"
SPECIAL_TOKENS = ("<pad>", "<bos>", "<eos>", "<unk>")  # ids 0, 1, 2, 3
CHARS = "0123456789+= abcdefghijklmnopqrstuvwxyz"  # one token per character


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
    """``cache_dir``, else ``$PREFZOO_CACHE``, else ``~/.cache/prefzoo``."""
    if cache_dir is not None:
        return Path(cache_dir)
    env = os.environ.get(CACHE_ENV)
    return Path(env) if env else Path.home() / ".cache" / "prefzoo"


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
    # greedy completions of the starting policy, keyed by the prompt sets (dataclasses.replace starts afresh)
    _start_cache: dict[Any, tuple[list[str], list[str]]] = field(
        default_factory=dict, init=False, repr=False, compare=False
    )

    def load_model(self) -> Any:
        """A fresh copy of the starting policy (LlamaForCausalLM, eval mode, float32)."""
        from transformers import AutoModelForCausalLM

        return AutoModelForCausalLM.from_pretrained(self.model_dir).eval()

    def load_tokenizer(self) -> Any:
        from transformers import AutoTokenizer

        return AutoTokenizer.from_pretrained(self.model_dir)

    def evaluate_policy(
        self, model: Any, tokenizer: Any, baseline_model: Any = None, *, batch_size: int = 100
    ) -> dict[str, float]:
        """Oracle win-rate of ``model`` against ``baseline_model`` and retention of skill B.

        Decoding is greedy (deterministic) for both models, at most 6 new tokens.
        ``baseline_model=None`` means the starting policy from ``model_dir``.
        Returns ``win_rate`` ((wins + ½ ties) / n), ``wins``, ``ties``, ``losses``,
        ``n``, ``lc_win_rate`` (length-controlled), ``retention`` (greedy exact-match
        accuracy on reversal prompts unseen in the warm-up), ``addition_accuracy``
        and ``addition_mae`` (mean |answer − truth| over well-formed answers) of
        ``model``, ``malformed`` (share of unparseable answers), and the same three
        skill numbers for the baseline, prefixed ``baseline_``.
        """
        from prefzoo.eval.judges import get_judge
        from prefzoo.eval.winrate import judge_completions

        if baseline_model is None:  # the starting policy: greedy, so its completions are computed once per task
            key = (tuple(self.heldout_prompts), tuple(self.retention_prompts))
            if key not in self._start_cache:
                self._start_cache[key] = self._completions(self.load_model(), tokenizer, batch_size)
            base_add, base_rev = self._start_cache[key]
        else:
            base_add, base_rev = self._completions(baseline_model, tokenizer, batch_size)
        pol_add, pol_rev = self._completions(model, tokenizer, batch_size)
        res = judge_completions(self.heldout_prompts, pol_add, base_add, get_judge("oracle"), tokenizer)
        out = {k: float(v) for k, v in res.summary().items()}
        out.update(_skill_scores(pol_add, self.heldout_prompts))
        out["retention"] = self._retention(pol_rev)
        out["baseline_retention"] = self._retention(base_rev)
        out.update({f"baseline_{k}": v for k, v in _skill_scores(base_add, self.heldout_prompts).items()})
        return out

    def _completions(self, model: Any, tokenizer: Any, batch_size: int) -> tuple[list[str], list[str]]:
        """Greedy completions of the held-out addition prompts (≤ 6 tokens) and the reversal prompts (≤ 7)."""
        from prefzoo.eval.generation import generate

        add = generate(model, tokenizer, self.heldout_prompts, max_new_tokens=6, batch_size=batch_size)
        rev = generate(model, tokenizer, self.retention_prompts, max_new_tokens=7, batch_size=batch_size)
        return add, rev

    def _retention(self, completions: list[str]) -> float:
        hits = sum(c.strip() == t for c, t in zip(completions, self.retention_targets, strict=True))
        return hits / len(completions)


def _skill_scores(completions: list[str], prompts: list[str]) -> dict[str, float]:
    dists = [synthetic.distance(p, c) for p, c in zip(prompts, completions, strict=True)]
    finite = [d for d in dists if d != float("inf")]
    return {
        "addition_accuracy": sum(d == 0 for d in dists) / len(dists),
        "addition_mae": sum(finite) / len(finite) if finite else float("inf"),
        "malformed": 1.0 - len(finite) / len(dists),
    }


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
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast

    vocab = {t: i for i, t in enumerate((*SPECIAL_TOKENS, *CHARS))}
    tk = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tk.pre_tokenizer = pre_tokenizers.Split(Regex("."), behavior="isolated")
    tk.decoder = decoders.Fuse()  # decode by plain concatenation: "4","7" -> "47"
    tk.post_processor = processors.TemplateProcessing(
        single="<bos> $A", pair="<bos> $A $B", special_tokens=[("<bos>", vocab["<bos>"])]
    )
    return PreTrainedTokenizerFast(
        tokenizer_object=tk, bos_token="<bos>", eos_token="<eos>", pad_token="<pad>", unk_token="<unk>",
        padding_side="right", model_max_length=64,
    )  # fmt: skip


def build_model(cfg: WarmupConfig, tokenizer: Any, seed: int) -> Any:
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        vocab_size=len(tokenizer), hidden_size=cfg.hidden_size, intermediate_size=cfg.intermediate_size,
        num_hidden_layers=cfg.num_hidden_layers, num_attention_heads=cfg.num_attention_heads,
        num_key_value_heads=cfg.num_attention_heads, max_position_embeddings=cfg.max_position_embeddings,
        tie_word_embeddings=True, pad_token_id=tokenizer.pad_token_id, bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
    )  # fmt: skip
    torch.manual_seed(seed)
    model = LlamaForCausalLM(config)
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.generation_config.bos_token_id = tokenizer.bos_token_id
    return model


def _sft_batch(
    tokenizer: Any, pairs: list[tuple[str, str]]
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:  # (B,T) ids, (B,T) mask, (B,T) labels
    import torch

    eos = tokenizer.eos_token_id
    seqs, labels = [], []
    for prompt, completion in pairs:
        p = tokenizer(prompt).input_ids
        c = [*tokenizer(completion, add_special_tokens=False).input_ids, eos]
        seqs.append(p + c)
        labels.append([-100] * len(p) + c)  # loss on completion tokens only
    T = max(len(s) for s in seqs)
    ids = torch.full((len(seqs), T), tokenizer.pad_token_id, dtype=torch.long)  # (B,T)
    mask = torch.zeros((len(seqs), T), dtype=torch.long)  # (B,T)
    lab = torch.full((len(seqs), T), -100, dtype=torch.long)  # (B,T)
    for i, (s, l) in enumerate(zip(seqs, labels, strict=True)):
        ids[i, : len(s)] = torch.tensor(s)
        mask[i, : len(s)] = 1
        lab[i, : len(l)] = torch.tensor(l)
    return ids, mask, lab


def warm_up(model: Any, tokenizer: Any, splits: synthetic.Splits, cfg: WarmupConfig, seed: int) -> dict[str, Any]:
    """The deterministic supervised warm-up: noisy addition answers (fresh draws each step) plus exact reversals."""
    import torch

    rng = random.Random(f"prefzoo-warmup-{seed}")
    torch.manual_seed(seed)
    opt = torch.optim.AdamW(model.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay, betas=(0.9, 0.98))

    def lr_at(step: int) -> float:
        import math

        if step < cfg.warmup_steps:
            return cfg.lr * (step + 1) / cfg.warmup_steps
        frac = (step - cfg.warmup_steps) / max(1, cfg.steps - cfg.warmup_steps)
        return cfg.lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * frac)))

    n_rev = round(cfg.batch_size * cfg.rev_fraction)
    model.train()
    t0 = time.perf_counter()
    losses = []
    for step in range(cfg.steps):
        batch = [
            (p.prompt, str(synthetic.noisy_answer(p.truth, rng)))
            for p in rng.sample(splits.warmup, cfg.batch_size - n_rev)
        ]
        batch += [(synthetic.reversal_prompt(s), s[::-1]) for s in rng.sample(splits.rev_warmup, n_rev)]
        ids, mask, lab = _sft_batch(tokenizer, batch)
        for g in opt.param_groups:
            g["lr"] = lr_at(step)
        loss = model(input_ids=ids, attention_mask=mask, labels=lab).loss
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        losses.append(loss.item())
    model.eval()
    return {"warmup_seconds": round(time.perf_counter() - t0, 1), "final_loss": sum(losses[-50:]) / 50}


def _cache_key(cfg: WarmupConfig, seed: int) -> str:
    noise = {"offsets": synthetic.NOISE_OFFSETS, "probs": synthetic.NOISE_PROBS, "range": synthetic.ADD_RANGE}
    blob = json.dumps(
        {"v": DEFAULT_TASK_VERSION, "cfg": asdict(cfg), "chars": CHARS, "seed": seed, "noise": noise}, sort_keys=True
    )
    return f"default-task-{DEFAULT_TASK_VERSION}-seed{seed}-{hashlib.sha256(blob.encode()).hexdigest()[:10]}"


@contextlib.contextmanager
def _file_lock(path: Path) -> Iterator[None]:
    """An exclusive lock so that concurrent first calls build the model once (POSIX; a no-op elsewhere)."""
    try:
        import fcntl
    except ImportError:  # pragma: no cover - Windows
        yield
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a+") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def _build_model_dir(final: Path, splits: synthetic.Splits, cfg: WarmupConfig, seed: int) -> None:
    tokenizer = build_tokenizer()
    model = build_model(cfg, tokenizer, seed)
    stats = warm_up(model, tokenizer, splits, cfg, seed)
    tmp = Path(tempfile.mkdtemp(prefix=final.name + ".tmp-", dir=final.parent))
    try:
        model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        stats.update({"seed": seed, "version": DEFAULT_TASK_VERSION, "config": asdict(cfg)})
        (tmp / "prefzoo_warmup.json").write_text(json.dumps(stats, indent=2))
        os.replace(tmp, final)  # atomic: a half-written folder is never the cache
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def load_default_task(
    cache_dir: str | os.PathLike[str] | None = None, seed: int = 0, *, warmup: WarmupConfig | None = None
) -> DefaultTask:
    """Build (first call, cached afterwards) or load the embedded default task.

    ``seed`` fixes the data splits, the preference pairs, the model's
    initialisation and the warm-up.  The model folder lives in
    ``cache_root(cache_dir) / default-task-<version>-seed<seed>-<hash>``.
    """
    import datasets

    cfg = warmup or WarmupConfig()
    splits = synthetic.make_splits(seed)
    root = cache_root(cache_dir)
    root.mkdir(parents=True, exist_ok=True)
    final = root / _cache_key(cfg, seed)
    if not (final / "config.json").exists():
        with _file_lock(root / (final.name + ".lock")):
            if not (final / "config.json").exists():
                _build_model_dir(final, splits, cfg, seed)
    stats_file = final / "prefzoo_warmup.json"
    stats = json.loads(stats_file.read_text()) if stats_file.exists() else {}
    train = datasets.Dataset.from_list(synthetic.make_pairs(splits.pref_train, seed, "train"))
    eval_ = datasets.Dataset.from_list(synthetic.make_pairs(splits.pref_eval, seed, "eval"))
    return DefaultTask(
        model_dir=final,
        train=train,
        eval=eval_,
        heldout_prompts=[p.prompt for p in splits.heldout],
        retention_prompts=[synthetic.reversal_prompt(s) for s in splits.rev_heldout],
        retention_targets=[s[::-1] for s in splits.rev_heldout],
        recommended=dict(RECOMMENDED),
        seed=seed,
        warmup_stats=stats,
    )
