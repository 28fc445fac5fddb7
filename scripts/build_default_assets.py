"""Regenerate the shipped default policy: ``python scripts/build_default_assets.py [--out DIR]``.

The embedded default task's warmed-up tiny Llama (hidden 64, 2 layers, character tokenizer: about 600 KB) ships
as package data in ``prefzoo/data/assets/default-task/`` so that a new user's first ``prefzoo train`` loads it
instead of paying for the supervised warm-up.  This script is the only way those files are made: it runs the same
deterministic warm-up as :func:`prefzoo.model.load_default_task` (seed 0, the default
:class:`~prefzoo.data.default.WarmupConfig`) on one CPU thread and writes the folder.  A test
(``tests/data/test_default_assets.py``) runs it again and compares the result with the shipped files bit for bit.
The bits depend on the CPU kernels torch dispatches to: the shipped files were made on AVX2 ones, so on an AVX-512
machine run it as ``ATEN_CPU_CAPABILITY=avx2 python scripts/build_default_assets.py`` (the test does).

Run it again after changing the warm-up, the synthetic data or ``DEFAULT_TASK_VERSION`` (the cache key recorded in
``prefzoo_warmup.json`` then no longer matches, and ``load_default_task`` falls back to building in the cache).
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
from dataclasses import asdict
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from prefzoo.data.default import ASSET_DIR, SHIPPED_SEED, STATS_FILE

__all__ = ["build_assets", "main"]


def build_assets(out: Path, *, progress: bool = True) -> dict[str, Any]:
    """Warm up the default policy on one thread and write it to ``out`` (replaced atomically); returns the stats."""
    import torch

    from prefzoo.data import default, synthetic
    from prefzoo.model import default_policy

    torch.set_num_threads(1)  # bit-exact reproduction needs one summation order
    cfg = default.WarmupConfig()
    tokenizer = default.build_tokenizer()
    model = default_policy.build_model(cfg, tokenizer, SHIPPED_SEED)
    stats = default_policy.warm_up(
        model, tokenizer, synthetic.make_splits(SHIPPED_SEED), cfg, SHIPPED_SEED, progress=progress
    )
    shipped = {
        "cache_key": default.cache_key(cfg, SHIPPED_SEED),
        "seed": SHIPPED_SEED,
        "version": default.DEFAULT_TASK_VERSION,
        "config": asdict(cfg),
        "final_loss": stats["final_loss"],  # deterministic; the warm-up's wall time is not shipped
        "torch": torch.__version__,
    }
    out.parent.mkdir(parents=True, exist_ok=True)
    with default.staging_dir(out) as tmp:
        model.save_pretrained(tmp, safe_serialization=True)
        tokenizer.save_pretrained(tmp)
        (tmp / STATS_FILE).write_text(json.dumps(shipped, indent=2, sort_keys=True) + "\n")
        if out.exists():
            shutil.rmtree(out)
        tmp.rename(out)
    return {**shipped, "warmup_seconds": stats["warmup_seconds"]}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python scripts/build_default_assets.py", description=__doc__.splitlines()[0])
    p.add_argument("--out", type=Path, default=ASSET_DIR, help=f"output folder (default: {ASSET_DIR})")
    p.add_argument("--no-progress", dest="progress", action="store_false", help="no progress bar")
    args = p.parse_args(argv)
    stats = build_assets(args.out, progress=args.progress)
    size = sum(f.stat().st_size for f in args.out.iterdir())
    print(
        f"wrote {args.out} ({size / 1e3:.0f} kB; warm-up {stats['warmup_seconds']} s, final loss "
        f"{stats['final_loss']:.4f}, key {stats['cache_key']})"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
