"""The default task's starting policy: the folder shipped for seed 0, else a tiny Llama warmed up once and cached.

The warm-up is a short deterministic supervised training (AdamW, linear warm-up then cosine to 10%) that teaches the
tiny Llama of :class:`~prefzoo.data.default.WarmupConfig` the two skills of :mod:`prefzoo.data.synthetic`.  The
shipped folder (``prefzoo/data/assets/default-task``) is this warm-up's output for seed 0, written by
``scripts/build_default_assets.py``; another seed or warm-up is built on first use (~30 s on an idle core, ~100 s on a
busy 2-core machine) under :func:`~prefzoo.data.default.cache_root`.  :func:`load_default_task` puts the policy
together with the task's data (:func:`prefzoo.data.default.default_task`).
"""

from __future__ import annotations

import json
import logging
import os
import random
import shutil
import time
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING, Any

from prefzoo._filelock import file_lock
from prefzoo.data import synthetic
from prefzoo.data.default import (
    DEFAULT_TASK_VERSION,
    STATS_FILE,
    DefaultTask,
    WarmupConfig,
    build_tokenizer,
    cache_key,
    cache_root,
    default_task,
    shipped_model_dir,
    staging_dir,
)
from prefzoo.data.tiny import tiny_causal_lm

if TYPE_CHECKING:
    import torch

__all__ = ["build_model", "load_default_task", "warm_up"]


def load_default_task(
    cache_dir: str | os.PathLike[str] | None = None,
    seed: int = 0,
    *,
    warmup: WarmupConfig | None = None,
    progress: bool = False,
) -> DefaultTask:
    """Load the embedded default task: the shipped policy for seed 0, else built once in the cache.

    ``seed`` fixes the data splits, the preference pairs, the model's
    initialisation and the warm-up.  Seed 0 with the default ``warmup`` uses the
    policy shipped in ``prefzoo/data/assets/default-task`` (no warm-up); any other
    model folder is built on first use (``progress``: a bar on stderr) in
    ``cache_root(cache_dir) / default-task-<version>-seed<seed>-<hash>``.
    """
    cfg = warmup or WarmupConfig()
    final = shipped_model_dir(cache_key(cfg, seed)) or _cached_model_dir(cache_dir, cfg, seed, progress)
    return default_task(final, seed)


def _cached_model_dir(cache_dir: str | os.PathLike[str] | None, cfg: WarmupConfig, seed: int, progress: bool) -> Path:
    root = cache_root(cache_dir)
    root.mkdir(parents=True, exist_ok=True)
    final = root / cache_key(cfg, seed)
    if not final.is_dir() or _cache_problem(final):
        with file_lock(root / (final.name + ".lock")):  # concurrent first calls build it once
            problem = _cache_problem(final) if final.is_dir() else "absent"
            if problem is not None:
                if problem != "absent":  # half-written by an older build, or damaged since: never trained on
                    log.warning("default-task cache %s is incomplete (%s); rebuilding it", final, problem)
                    shutil.rmtree(final)
                for stale in root.glob(final.name + ".tmp-*"):  # builds killed mid-write (we hold the lock)
                    log.warning("removing %s, left by a default-task build that was killed", stale)
                    shutil.rmtree(stale, ignore_errors=True)
                _build_model_dir(final, synthetic.make_splits(seed), cfg, seed, progress)
    return final


_CACHE_FILES = ("config.json", "model.safetensors", "tokenizer_config.json", STATS_FILE)
log = logging.getLogger(__name__)


def _cache_problem(final: Path) -> str | None:
    """Why the cached model folder ``final`` cannot be used (a missing file, an unreadable safetensors), or None."""
    missing = [f for f in _CACHE_FILES if not (final / f).is_file()]
    if missing:
        return f"missing {', '.join(missing)}"
    try:
        from safetensors import safe_open

        with safe_open(str(final / "model.safetensors"), framework="pt") as f:
            for key in f.keys():
                f.get_tensor(key)  # reads every byte: a truncated file fails here
        json.loads((final / STATS_FILE).read_text())
    except Exception as e:
        return f"unreadable ({type(e).__name__}: {str(e).splitlines()[0][:120] if str(e) else ''})"
    return None


def _build_model_dir(final: Path, splits: synthetic.Splits, cfg: WarmupConfig, seed: int, progress: bool) -> None:
    tokenizer = build_tokenizer()
    model = build_model(cfg, tokenizer, seed)
    stats = warm_up(model, tokenizer, splits, cfg, seed, progress=progress)
    with staging_dir(final) as tmp:
        model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        stats.update({"seed": seed, "version": DEFAULT_TASK_VERSION, "config": asdict(cfg)})
        (tmp / STATS_FILE).write_text(json.dumps(stats, indent=2))
        os.replace(tmp, final)  # atomic: a half-written folder is never the cache


def build_model(cfg: WarmupConfig, tokenizer: Any, seed: int) -> Any:
    """The tiny Llama of ``cfg`` before its warm-up (``prefzoo.testing.tiny_causal_lm`` with these sizes)."""
    model, _ = tiny_causal_lm(
        tokenizer,
        seed=seed,
        hidden_size=cfg.hidden_size,
        intermediate_size=cfg.intermediate_size,
        num_hidden_layers=cfg.num_hidden_layers,
        num_attention_heads=cfg.num_attention_heads,
        max_position_embeddings=cfg.max_position_embeddings,
        tie_word_embeddings=True,
    )
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


def warm_up(
    model: Any, tokenizer: Any, splits: synthetic.Splits, cfg: WarmupConfig, seed: int, *, progress: bool = False
) -> dict[str, Any]:
    """The deterministic supervised warm-up: noisy addition answers (fresh draws each step) plus exact reversals."""
    import torch
    from tqdm.auto import tqdm

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
    for step in tqdm(range(cfg.steps), desc="warming up the default policy", disable=not progress, mininterval=2):
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
