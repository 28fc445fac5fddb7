"""Running `prefzoo train` in a subprocess (for signals and kill -9) and reading saved weights."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import torch

ROOT = Path(__file__).parents[2]


def cli_args(cfg: dict[str, Any]) -> list[str]:
    args = []
    for k, v in cfg.items():
        flag = "--" + k.replace("_", "-")
        if k == "callbacks":
            for spec in v:
                args += ["--callback", spec]
        elif isinstance(v, bool):
            args.append(flag if v else "--no-" + k.replace("_", "-"))
        elif v is not None:
            args += [flag, str(v)]
    return args


def env(**extra: str) -> dict[str, str]:
    # PYTHONUNBUFFERED left out: a user's shell rarely sets it, and the runs' logs must be in order without it
    e = {k: v for k, v in os.environ.items() if not k.startswith("PREFZOO_FAULT") and k != "PYTHONUNBUFFERED"}
    e.update(OMP_NUM_THREADS="1", HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1", PYTHONPATH=str(ROOT), **extra)
    return e


# SIGINT back to its default before Python starts (the disposition survives exec), so Python installs its Ctrl-C
# handler even where the suite was started with SIGINT ignored (nohup, `cmd &`, .ci/hermetic's `signals`)
_SIGINT_DEFAULT_THEN_EXEC = (
    "import os, signal, sys; signal.signal(signal.SIGINT, signal.SIG_DFL); "
    "signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT, signal.SIGTERM}); "  # a blocked mask survives exec too
    "os.execv(sys.executable, [sys.executable, *sys.argv[1:]])"
)


def start_cli(cfg: dict[str, Any], log: Path, *, ctrl_c: bool = False, **extra_env: str) -> subprocess.Popen:
    """`python -m prefzoo.cli.main train ...` in a fresh process; stdout+stderr go to ``log``.  ``ctrl_c``: started
    as from a terminal, with SIGINT's default disposition whatever the suite inherited."""
    cmd = [sys.executable, "-m", "prefzoo.cli.main", "train", *cli_args(cfg)]
    if ctrl_c:
        cmd = [sys.executable, "-c", _SIGINT_DEFAULT_THEN_EXEC, *cmd[1:]]
    fh = log.open("w")
    return subprocess.Popen(cmd, env=env(**extra_env), stdout=fh, stderr=subprocess.STDOUT, cwd=ROOT)


def wait_for(pred, timeout: float, what: str, proc: subprocess.Popen | None = None, log: Path | None = None) -> None:
    t0 = time.time()
    while time.time() - t0 < timeout:
        if pred():
            return
        if proc is not None and proc.poll() is not None:
            break
        time.sleep(0.1)
    text = log.read_text()[-4000:] if log is not None and log.exists() else ""
    raise AssertionError(f"timed out waiting for {what}\n{text}")


def logged_steps(out_dir: Path) -> int:
    import json

    path = out_dir / "metrics.jsonl"
    if not path.exists():
        return 0
    steps = [json.loads(line).get("step", 0) for line in path.read_text().splitlines() if line.strip()]
    return int(max(steps, default=0))


def final_weights(out_dir: Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    return load_file(str(Path(out_dir) / "final" / "model.safetensors"))


def checkpoint_weights(ckpt: Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    return load_file(str(Path(ckpt) / "model.safetensors"))


def reseal(ckpt: Path) -> None:
    """Rewrite checkpoint ``ckpt``'s marker to the sizes and sha256 of the files it lists, as they are now: what an
    attacker who can edit the folder does, so that a test reaches the checks behind the marker's."""
    import hashlib
    import json

    marker_path = Path(ckpt) / "prefzoo_checkpoint.json"
    marker = json.loads(marker_path.read_text())
    for rel in marker["files"]:
        data = (Path(ckpt) / rel).read_bytes()
        marker["files"][rel] = len(data)
        marker["sha256"][rel] = hashlib.sha256(data).hexdigest()
    marker_path.write_text(json.dumps(marker))


def max_diff(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    common = sorted(set(a) & set(b))
    assert common, (list(a)[:3], list(b)[:3])
    return max(float((a[k].float() - b[k].float()).abs().max()) for k in common)


def slow_to_tokenize(path: Path, rows: int = 24_000, chars: int = 2_000) -> Path:
    """``rows`` pairs whose prompts are ``chars`` characters long: tokenizing them takes tens of seconds (about 1 ms
    a row with the tests' character tokenizer on a loaded 2-core machine), still several on a machine a few times
    faster; writing the file (~48 MB) and reading it a fraction of that.  Prompts are cut to the tiny model's context
    only after they are tokenized, so the cost is in tokenizing, where a signal or a progress line is expected; a
    test that interrupts the run never pays for the whole of it."""
    import json
    import random

    rng = random.Random(0)
    filler = "".join(f"add {rng.randint(0, 49)}+{rng.randint(0, 49)} " for _ in range(chars // 8 + 1))
    with path.open("w") as f:
        for i in range(rows):
            a, b = rng.randint(0, 49), rng.randint(0, 49)
            prompt = filler[i % 97 : i % 97 + chars] + f" add {a}+{b}="
            f.write(json.dumps({"id": f"p{i}", "prompt": prompt, "chosen": str(a + b), "rejected": str(a + b + 1)}))
            f.write("\n")
    return path
