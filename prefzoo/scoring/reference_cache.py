"""The precomputed reference: log-probs of every example computed once, cached on disk (safetensors).

The cache is keyed by dataset fingerprint, model identity and tokenization settings, and validated (ids, shapes,
key, checksum) before reuse; a mismatch recomputes it.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import socket
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from prefzoo._thirdparty import dataset_fingerprint
from prefzoo.data.progress import Progress, length
from prefzoo.scoring.fields import row_ids
from prefzoo.scoring.reference import FrozenReference, PrecomputedReference, Reference

__all__ = ["load_or_compute_reference_table", "model_identity", "precompute_reference", "read_safetensors"]

log = logging.getLogger(__name__)


def model_identity(lm: nn.Module, name: str | None) -> str:
    """A cheap, stable identity of a model's weights: name, config and a sample of every parameter."""
    h = hashlib.sha256(str(name).encode())
    cfg = getattr(lm, "config", None)
    if cfg is not None:
        h.update(json.dumps(cfg.to_dict(), sort_keys=True, default=str).encode())
    for pname, p in lm.state_dict().items():
        h.update(pname.encode())
        flat = p.detach().reshape(-1)
        h.update(flat[:: max(1, flat.numel() // 4096)].float().cpu().numpy().tobytes())
    return h.hexdigest()[:20]


@contextlib.contextmanager
def _atomic_path(path: Path) -> Iterator[Path]:
    tmp = path.with_name(f".{path.name}.tmp{socket.gethostname()}-{os.getpid()}")  # unique on a shared disk too
    yield tmp
    os.replace(tmp, path)


def _cache_file(cache_dir: Path, key: str) -> Path:
    return cache_dir / f"ref-logps-{hashlib.sha256(key.encode()).hexdigest()[:24]}.safetensors"


def _digest(logps: Tensor) -> str:
    """sha256 of the table's float32 bytes: a tampered or bit-rotted cache is recomputed, never used."""
    return hashlib.sha256(logps.detach().float().contiguous().cpu().numpy().tobytes()).hexdigest()


def read_safetensors(path: Path, names: tuple[str, ...]) -> tuple[dict[str, str], list[Tensor]]:
    """A safetensors file's metadata and its tensors ``names`` (safetensors' own errors for a bad file)."""
    from safetensors import safe_open

    with safe_open(str(path), framework="pt") as f:
        return f.metadata() or {}, [f.get_tensor(n) for n in names]


def _read_cache(path: Path, key: str, ids: list[str], width: int = 2) -> dict[str, tuple[float, ...]] | None:
    if not path.exists():
        return None
    try:
        meta, (logps,) = read_safetensors(path, ("logps",))  # (n, width)
        cached_ids = json.loads(meta.get("ids", "[]"))
    except Exception as e:  # a corrupt file is recomputed, never trusted
        log.warning("reference cache %s unreadable (%s): recomputing", path, e)
        return None
    if meta.get("key") != key or sorted(cached_ids) != sorted(ids) or tuple(logps.shape) != (len(cached_ids), width):
        log.warning("reference cache %s does not match this dataset/model/tokenization: recomputing", path)
        return None
    if meta.get("sha256") != _digest(logps) or not bool(torch.isfinite(logps).all()):
        log.warning("reference cache %s failed its checksum or holds non-finite values: recomputing", path)
        return None
    return {i: tuple(float(v) for v in row) for i, row in zip(cached_ids, logps.tolist(), strict=True)}


def load_or_compute_reference_table(
    reference: Reference, dataloader: Any, accelerator: Any, key: str, ids: list[str], cache_dir: str | Path,
    rows: bool = False, progress: bool = True,
) -> tuple[dict[str, tuple[float, ...]], bool]:
    """(id -> (ref chosen, ref rejected)) for every example, from the cache when valid; second item: cache hit.

    ``rows``: (row id -> (ref log-prob,)) for every row of lists or unpaired examples (``ids``: every :func:`row_ids`).
    """
    from safetensors.torch import save_file

    width = 1 if rows else 2
    path = _cache_file(Path(cache_dir).expanduser(), key)
    table = _read_cache(path, key, ids, width)
    if _hit_everywhere(accelerator, table is not None):
        assert table is not None
        return table, True
    table = {}
    position = {k: n for n, k in enumerate(ids)}
    bar = Progress(length(dataloader), "precomputing reference log-probs", unit="batches", enabled=progress)
    with bar:  # shown after 2 s
        for batch in dataloader:
            keys = row_ids(batch) if rows else batch["ids"]
            cols = [reference.rows(batch)] if rows else list(reference(batch))  # (B,) each
            idx = torch.tensor([position[i] for i in keys], device=cols[0].device)  # (B,) to gather across ranks
            # every rank's rows; a row scored twice (the padded last batch) is written twice with the same value
            vals = accelerator.gather(torch.stack([idx.double(), *(c.double() for c in cols)], dim=1))  # (B_all, 1 + w)
            for j, *v in vals.tolist():
                table[ids[int(j)]] = tuple(v)
            bar.update(1)
    missing = set(ids) - set(table)
    if missing:
        raise RuntimeError(f"reference precomputation missed {len(missing)} examples")
    if accelerator.is_local_main_process:  # once per node: a node-local cache dir is filled on every node
        path.parent.mkdir(parents=True, exist_ok=True)
        logps = torch.tensor([table[i] for i in ids], dtype=torch.float32)  # (n, width)
        with _atomic_path(path) as tmp:
            meta = {"key": key, "ids": json.dumps(ids), "sha256": _digest(logps)}
            save_file({"logps": logps}, str(tmp), metadata=meta)
    accelerator.wait_for_everyone()
    return table, False


def _hit_everywhere(accelerator: Any, hit: bool) -> bool:
    """Whether every rank read a valid cache; else all compute (a node whose own cache dir is empty computes with
    the others instead of waiting in gathers they never make)."""
    if accelerator.num_processes == 1:
        return hit
    flag = torch.tensor([0.0 if hit else 1.0], device=accelerator.device)
    return bool(accelerator.reduce(flag, reduction="sum").item() == 0)


def precompute_reference(
    reference: Reference, accelerator: Any, train_tok: Any, eval_tok: Any, collate: Any, identity: str, *,
    batch_size: int, max_prompt_length: int | None, max_completion_length: int | None, mixed_precision: str,
    cache_dir: str | None, progress: bool = False,
) -> tuple[Reference, str]:
    """Reference log-probs of every train and eval pair (list completion, unpaired example), computed once (or read
    from the cache).  KTO's KL rows (a completion with another prompt of its batch) change with every shuffle: they
    cannot be cached (refused before any model loads).  ``batch_size`` is the run's per-device batch size (scored two
    batches at a time); the token limits and the precision are part of the cache key; ``cache_dir`` None is the
    default cache folder; ``progress`` shows a bar while scoring (rank 0 of a run that asked for bars)."""
    import datasets

    both = datasets.concatenate_datasets([d for d in (train_tok, eval_tok) if d is not None])
    if getattr(collate, "kl", False):
        raise ValueError("--precompute-ref cannot cache KTO's KL rows (they change with each batch)")
    rows = "completion_ids" in both.column_names  # lists and unpaired examples: one log-prob per row
    if rows and "label" not in both.column_names:  # lists: a row per completion, keyed <id>#<k>
        pairs = zip(both["id"], both["completion_ids"], strict=True)
        ids = [f"{i}#{k}" for i, comps in pairs for k in range(len(comps))]
    else:
        ids = [str(i) for i in both["id"]]
    dl = accelerator.prepare(
        torch.utils.data.DataLoader(both, batch_size=batch_size * 2, collate_fn=collate)
    )
    key = "|".join(
        [
            str(dataset_fingerprint(train_tok)),
            str(dataset_fingerprint(eval_tok)),
            identity,
            f"p{max_prompt_length}c{max_completion_length}",
            str(mixed_precision),
        ]
    )
    from prefzoo.data.default import cache_root

    cache_dir = cache_dir or str(cache_root() / "ref")
    with accelerator.autocast():
        table, hit = load_or_compute_reference_table(
            reference, dl, accelerator, key, ids, cache_dir, rows=rows, progress=progress
        )
    if isinstance(reference, FrozenReference):
        del reference.module  # the copy is no longer needed: free its memory
    unit = "rows" if rows else "pairs"
    return PrecomputedReference(table), f"precomputed ({'cache hit' if hit else 'computed'}, {len(table)} {unit})"
