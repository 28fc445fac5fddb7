"""What a run checks before anything loads: options the loss cannot use, and the output folder.

Each failure is one :class:`~prefzoo.errors.ConfigError` line naming the option or path and the fix, raised before
torch loads a model or datasets tokenizes a row.  The CLI calls :func:`preflight` right after reading its flags; a
run started from Python passes the same checks in :func:`prefzoo.train.train` (the modifiers where it builds the
loss, :func:`prefzoo.train.setup.loss.build_loss`; the options in setup; the output folder where it claims it).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from prefzoo.errors import ConfigError
from prefzoo.train.checkpoint.outdir import OutputDirError, check_output_dir
from prefzoo.train.setup.loss import check_modifiers
from prefzoo.types import Need

__all__ = ["OutputDirError", "check_modifiers", "check_output_dir", "check_run_options", "preflight", "uses_reference"]


def uses_reference(loss: Any) -> bool:
    """Whether the loss (or a modifier on it) reads reference log-probs: its declared needs, never its name."""
    return bool({Need.REFERENCE, Need.KL_REFERENCE, Need.REF_TOKEN_LOGPS} & set(loss.needs))


def check_run_options(loss: Any, precompute_ref: bool, merge_lora: bool, model: str | None, lora: bool) -> None:
    """Options that would be silently ignored with this loss or model (``model``: --model): refused in one line
    saying why."""
    if precompute_ref and not uses_reference(loss):
        raise ConfigError(
            f"--precompute-ref has no effect with loss {loss.name!r}: it takes no reference model (its declared "
            "needs), so there is nothing to precompute; drop --precompute-ref"
        )
    adapter_folder = model is not None and (Path(model).expanduser() / "adapter_config.json").is_file()
    if merge_lora and not lora and not adapter_folder:
        raise ConfigError(
            "--merge-lora has no effect without --lora: there is no LoRA adapter to merge into the model; add --lora, "
            "or drop --merge-lora"
        )


def preflight(loss: Any, cfg: Any) -> None:
    """The checks that need neither data nor model: the modifiers against the run's settings, options, then the
    output folder.  The model
    folder is checked where the run first reads it (:func:`prefzoo.model.load_tokenizer`), after the data's shape
    is checked against the loss, and still before anything loads."""
    check_modifiers(loss, precompute_ref=cfg.precompute_ref, lora=cfg.lora)
    check_run_options(loss, cfg.precompute_ref, cfg.merge_lora, cfg.model, cfg.lora)
    check_output_dir(cfg.output_dir)
