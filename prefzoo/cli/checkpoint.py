"""`prefzoo checkpoint info DIR`: what a checkpoint holds and what it can resume on."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from prefzoo.cli.main import CLIError

_HELP = "Inspect checkpoints: `prefzoo checkpoint info DIR` (a checkpoint folder or a run's --output-dir)."

# what each checkpoint format resumes on (prefzoo.train.engines.Engine.checkpoint_format)
_RESUMES_ON = {
    "accelerate": "one process, DDP or FSDP2 on any number of processes",
    "dcp": "one process, DDP or FSDP2 on any number of processes (any FSDP2 mesh)",
    "per-rank": "the same engine, number of processes and mesh only (shards saved per rank on node-local disks)",
    "deepspeed": "the same DeepSpeed stage and number of processes only (DeepSpeed's ds_to_universal converts it)",
}


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    p = subparsers.add_parser("checkpoint", help=_HELP, description=_HELP)
    sub = p.add_subparsers(dest="action", metavar="ACTION", required=True)
    info = sub.add_parser("info", help="what a checkpoint holds and what it can resume on")
    info.add_argument("path", metavar="DIR", help="a checkpoint folder (step-N) or a run's --output-dir (its newest)")
    info.add_argument("--json", action="store_true", help="print the description as JSON")
    return p


def checkpoint_folder(path: str) -> Path:
    """The checkpoint ``path`` names: itself, or a run's newest complete one; a CLIError saying why not."""
    from prefzoo.train.checkpoint import COMPLETE_MARKER, complete_checkpoints

    p = Path(path)
    if not p.is_dir():
        raise CLIError(f"{path}: no such folder; give a checkpoint folder (checkpoints/step-N) or a run's --output-dir")
    if (p / COMPLETE_MARKER).is_file() or p.name.startswith(("step-", ".tmp-step-")):
        return p
    found = complete_checkpoints(p)
    if not found:
        raise CLIError(f"{path}: no complete checkpoint under {p / 'checkpoints'}; nothing to describe")
    return found[-1]


def describe(folder: Path) -> dict[str, Any]:
    """The checkpoint's marker read into what a user asks: step, run, layout, files, completeness, whether its files
    verify (their sha256 against the marker's), resumable on."""
    from prefzoo.train.checkpoint import COMPLETE_MARKER, ResumeError, read_marker, verify_checkpoint

    try:
        marker = read_marker(folder)
        complete = True
    except ResumeError as e:
        raw = folder / COMPLETE_MARKER
        marker = json.loads(raw.read_text()) if raw.is_file() else {}
        complete, why = False, str(e).split(": ", 1)[-1]
    verdict = verify_checkpoint(folder)
    files = marker.get("files") or {}
    p, b, a = (marker.get("batch") or [None, None, None])[:3]
    fmt = marker.get("checkpoint_format", "accelerate")
    out = {
        "checkpoint": str(folder), "complete": complete, "step": marker.get("step"),
        "loss": marker.get("loss"), "loss_params": marker.get("loss_params"), "model": marker.get("model"),
        "engine": marker.get("engine", "not recorded"), "format": fmt, "processes": p, "per_device_batch_size": b,
        "grad_accum": a, "examples_per_step": p * b * a if None not in (p, b, a) else None,
        "files": len(files), "bytes": sum(v for v in files.values() if isinstance(v, int)),
        "weights_only": bool(marker.get("model_only")),
        "verified": verdict.ok if verdict.hashed else None, "verification": _verification(verdict),
    }  # fmt: skip
    if not complete:
        out["resumes_on"] = f"nothing: {why}"
    elif not verdict.ok:
        out["resumes_on"] = f"nothing: it fails verification ({verdict.why})"
    elif marker.get("model_only"):
        out["resumes_on"] = "nothing (weights only, saved with --save-only-model): start a new run with --model"
    else:
        out["resumes_on"] = _RESUMES_ON.get(fmt, "the engine that wrote it") + (
            f", with {out['examples_per_step']} examples per step (processes × per-device batch × accumulation)"
            if out["examples_per_step"] else ""
        )
    return out


def _verification(verdict: Any) -> str:
    """The verdict in words: 'yes (...)', 'NO: why', or why it cannot be told."""
    if verdict.ok and verdict.hashed:
        return f"yes (the sha256 of each of its {verdict.files} files matches its marker)"
    if not verdict.ok:
        return f"NO: {verdict.why}"
    return "unknown: its marker records no sha256 (written by an older prefzoo); file sizes match"


def run(args: argparse.Namespace) -> int:
    info = describe(checkpoint_folder(args.path))
    if args.json:
        print(json.dumps(info, indent=1))
        return 0
    layout = f"{info['processes']} processes × {info['per_device_batch_size']} × {info['grad_accum']} accumulation"
    lines = [
        ("checkpoint", f"{info['checkpoint']} ({'complete' if info['complete'] else 'NOT complete'})"),
        ("step", info["step"]),
        ("loss", f"{info['loss']} {info['loss_params'] or {}}"),
        ("model", info["model"]),
        ("written by", f"{info['engine']} on {layout} ({info['examples_per_step']} examples per step)"),
        ("model/optimizer", f"{info['format']} form; {info['files']} files, {info['bytes'] / 1e6:.1f} MB"),
        ("verified", info["verification"]),
        ("resumes on", info["resumes_on"]),
    ]
    for key, value in lines:
        print(f"{key + ':':17}{value}")
    return 0
