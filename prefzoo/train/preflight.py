"""What a run checks before anything loads: options the loss cannot use, and the output folder.

Each failure is one :class:`~prefzoo.errors.ConfigError` line naming the option or path and the fix, raised before
torch loads a model or datasets tokenizes a row (the CLI calls :func:`preflight` right after reading its flags;
:func:`prefzoo.train.train` calls it again for runs started from Python).
"""

from __future__ import annotations

import errno
import os
import tempfile
from pathlib import Path
from typing import Any

from prefzoo.errors import ConfigError
from prefzoo.types import Need

__all__ = ["OutputDirError", "check_output_dir", "check_run_options", "preflight", "uses_reference"]


class OutputDirError(ConfigError):
    """``--output-dir`` cannot hold the run: a file, under a file, not writable, or on a read-only filesystem."""


def uses_reference(loss: Any) -> bool:
    """Whether the loss (or a modifier on it) reads reference log-probs: its declared needs, never its name."""
    return bool({Need.REFERENCE, Need.KL_REFERENCE, Need.REF_TOKEN_LOGPS} & set(loss.needs))


def check_run_options(loss: Any, cfg: Any) -> None:
    """Options that would be silently ignored with this loss or model: refused in one line saying why."""
    if cfg.precompute_ref and not uses_reference(loss):
        raise ConfigError(
            f"--precompute-ref has no effect with loss {loss.name!r}: it takes no reference model (its declared "
            "needs), so there is nothing to precompute; drop --precompute-ref"
        )
    adapter_folder = cfg.model is not None and (Path(cfg.model).expanduser() / "adapter_config.json").is_file()
    if cfg.merge_lora and not cfg.lora and not adapter_folder:
        raise ConfigError(
            "--merge-lora has no effect without --lora: there is no LoRA adapter to merge into the model; add --lora, "
            "or drop --merge-lora"
        )


def _first_existing(path: Path) -> Path:
    while not path.exists() and path != path.parent:
        path = path.parent
    return path


def check_output_dir(output_dir: str | os.PathLike[str]) -> None:
    """``output_dir`` is a folder this process can create and write in, or one line naming the path and the fix."""
    out = Path(output_dir).expanduser()
    fix = "give --output-dir a folder you can write to (it is created if missing)"
    if out.exists() and not out.is_dir():
        raise OutputDirError(f"--output-dir {out} is a file, not a folder: {fix}")
    ancestor = _first_existing(out)
    if not ancestor.is_dir():
        raise OutputDirError(f"--output-dir {out} lies under {ancestor}, which is a file: {fix}")
    try:
        out.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=out, prefix=".prefzoo-write-check-"):
            pass
    except OSError as e:
        why = "the filesystem is read-only" if e.errno == errno.EROFS else (e.strerror or type(e).__name__).lower()
        raise OutputDirError(f"--output-dir {out} cannot be written ({why}): {fix}") from None


def preflight(loss: Any, cfg: Any) -> None:
    """The checks of this module that need neither data nor model: options, then the output folder.  The model
    folder is checked where the run first reads it (:func:`prefzoo.model.load_tokenizer`), after the data's shape
    is checked against the loss, and still before anything loads."""
    check_run_options(loss, cfg)
    check_output_dir(cfg.output_dir)
