"""The trainer's public extension surface: ``Callback`` (no-op hooks) and the ``RunState`` they see (both defined in
:mod:`prefzoo.callbacks`), the list a run calls them through, and their loading.

Modelled on transformers' ``TrainerCallback``.  A run calls, in this order::

    on_train_begin
    (eval_at_start: on_evaluate)
    every optimizer step:  on_step_begin → on_batch (each micro-batch) → on_before_optimizer_step → on_step_end
                           → on_log (logging steps) → on_save_files, on_save (checkpoint steps)
    every epoch end:       on_evaluate (with an eval split) → on_epoch_end
    on_train_end

A callback asks the run to stop with ``state.should_stop = True`` (and optionally ``state.stop_reason``): every
process stops at the next optimizer-step boundary with a checkpoint, as on SIGTERM, and the final model is written.
Callbacks come from ``train(cfg, callbacks=[...])``, from ``cfg.callbacks`` / ``--callback SPEC`` where SPEC is
``module:Class`` or a name (an entry point of group ``prefzoo.callbacks``: prefzoo's own are declared there too),
optionally followed by ``:KEY=VALUE,KEY=VALUE`` constructor arguments; in YAML also
``{callback: SPEC, KEY: VALUE, ...}``.  A callback that raises stops the run with a one-line :class:`CallbackError`
naming it and the hook.
"""

from __future__ import annotations

from prefzoo.callbacks import Callback, RunState
from prefzoo.train.callbacks.base import CallbackError, CallbackList
from prefzoo.train.callbacks.early_stopping import EarlyStopping
from prefzoo.train.callbacks.loading import ENTRY_POINT_GROUP, builtin_callbacks, load_callback, load_callbacks

__all__ = ["ENTRY_POINT_GROUP", "Callback", "CallbackError", "CallbackList", "EarlyStopping", "RunState",
           "builtin_callbacks", "load_callback", "load_callbacks"]  # fmt: skip
