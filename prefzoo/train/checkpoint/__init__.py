"""Everything a run writes to keep or hand over its work, and reads back to continue.

- :mod:`.save`: a checkpoint folder per saved step, written in a temp folder, fsynced, then sealed by a marker
  and renamed (never half-written); the newest complete one; retention.
- :mod:`.verify`: the sha256 of every file of a checkpoint, recorded in its marker and checked before loading.
- :mod:`.resume`: the checkpoint every rank resumes from, checked against the run, its state loaded.
- :mod:`.state`: no file of a checkpoint runs code when read: a loss's state in safetensors, torch data with
  ``weights_only=True``, every pickle-capable file checked before the model loads.
- :mod:`.nodes`: shared or node-local output dirs, and what the ranks agree on before training.
- :mod:`.outdir`: one run per output dir (a lock, taken before any work; no other run's files, no symbolic link),
  and the marker of a finished run.
- :mod:`.final`: the final model folder (full, adapter or merged), its run card and model card.
- :mod:`.hub`: pushing a folder to the Hugging Face Hub.
"""

from __future__ import annotations

from prefzoo.train.checkpoint.final import load_final_model, save_model_folder, versions, write_final_model
from prefzoo.train.checkpoint.hub import HubPushError, push_folder
from prefzoo.train.checkpoint.nodes import Storage, detect_storage, lost_ranks
from prefzoo.train.checkpoint.outdir import (
    OutputDirHoldsRunError,
    OutputDirLockedError,
    claim_output_dir,
    finished_run,
    mark_finished,
    output_dir_lock,
)
from prefzoo.train.checkpoint.resume import (
    check_resumable,
    fit_batch_to_checkpoint,
    load_resumed_state,
    resume_point,
)
from prefzoo.train.checkpoint.save import (
    COMPLETE_MARKER,
    DiskFullError,
    ResumeError,
    checkpoint_step,
    complete_checkpoints,
    find_latest_checkpoint,
    is_complete,
    read_marker,
    save_checkpoint,
    verify_checkpoint,
)
from prefzoo.train.checkpoint.state import LOSS_STATE_FILE, load_loss_state, refuse_pickles, save_loss_state

__all__ = [
    "COMPLETE_MARKER",
    "LOSS_STATE_FILE",
    "DiskFullError",
    "HubPushError",
    "OutputDirHoldsRunError",
    "OutputDirLockedError",
    "ResumeError",
    "Storage",
    "check_resumable",
    "checkpoint_step",
    "claim_output_dir",
    "complete_checkpoints",
    "detect_storage",
    "find_latest_checkpoint",
    "finished_run",
    "fit_batch_to_checkpoint",
    "is_complete",
    "load_final_model",
    "load_loss_state",
    "load_resumed_state",
    "lost_ranks",
    "mark_finished",
    "output_dir_lock",
    "push_folder",
    "read_marker",
    "refuse_pickles",
    "resume_point",
    "save_checkpoint",
    "save_loss_state",
    "save_model_folder",
    "verify_checkpoint",
    "versions",
    "write_final_model",
]
