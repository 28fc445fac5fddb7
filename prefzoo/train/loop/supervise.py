"""``train(cfg)``: one run of the shared trainer for every registered loss, supervised: the output folder's lock,
signal handling and peer-failure messages around it.

The run itself is :class:`prefzoo.train.loop.run.Run` (phases: setup, step, after_step, evaluate, finish); this module
adds what wraps a whole run: the output folder claimed (or a finished run's result returned), SIGTERM/SIGINT turned
into a checkpoint, a failed collective turned into a message, and the callbacks from ``cfg.callbacks`` and the caller.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from prefzoo._dist import local_world_size
from prefzoo.spec import Loss
from prefzoo.train.callbacks import CallbackList, load_callbacks
from prefzoo.train.checkpoint.nodes import lost_ranks
from prefzoo.train.checkpoint.outdir import claim_output_dir, finished_run
from prefzoo.train.checkpoint.save import find_latest_checkpoint
from prefzoo.train.config import TrainConfig
from prefzoo.train.errors import explained
from prefzoo.train.loop.guard import PeerFailureError, is_peer_failure
from prefzoo.train.loop.metrics import last_logged
from prefzoo.train.loop.run import Run, TrainResult
from prefzoo.train.loop.signals import PreemptionHandler
from prefzoo.train.setup.loss import build_loss, modifier_callbacks

__all__ = ["TrainResult", "train"]


def train(
    cfg: TrainConfig,
    train_dataset: Any = None,
    eval_dataset: Any = None,
    *,
    callbacks: Sequence[Any] = (),
    loss: Loss | None = None,
) -> TrainResult:
    """Train ``cfg.model`` on preference pairs with ``cfg.loss``; datasets given here override ``cfg.dataset``.

    ``callbacks`` (:class:`prefzoo.train.Callback` instances or specs) run after those of ``cfg.callbacks``.
    ``loss``: the run's loss as the CLI built and checked it from ``cfg`` (its preflight); built here when None.
    SIGTERM/SIGINT stop the run at the next optimizer step with a checkpoint (``result.stop_reason``), as does a
    callback setting ``state.should_stop``; before the first step (nothing to save yet) they raise
    :class:`prefzoo.train.loop.signals.StoppedBeforeTraining` at once, and during the last step they change nothing (the
    run finishes); a failed or hung peer process raises :class:`PeerFailureError`; too many
    non-finite steps in a row raise :class:`NonFiniteStepsError` after saving a checkpoint.  Another run holding
    ``cfg.output_dir`` raises :class:`OutputDirLockedError`, a folder holding another run's files (without
    ``cfg.resume`` or ``cfg.overwrite_output_dir``) :class:`OutputDirHoldsRunError`, a symbolic link where the run
    writes :class:`prefzoo._safefs.SymlinkError`; resuming a finished run returns at once with
    ``result.already_complete`` and touches nothing.
    """
    if loss is None:  # unknown names, bad params, modifiers that do not fit: before anything loads
        loss = build_loss(cfg)
    installed = modifier_callbacks(loss)  # e.g. TR-DPO's reference sync: read from the modifier specs, never by name
    hooks = CallbackList([*installed, *load_callbacks([*cfg.callbacks, *callbacks])])  # bad specs fail before loading
    with claim_output_dir(cfg):  # not writable, in use, holding another run, a link in it: before anything loads
        finished = finished_run(cfg.checkpointing, cfg.optimization)
        if finished is not None:
            step = int(finished["step"])
            return TrainResult(global_step=step, final_dir=Path(finished["final"]),
                               checkpoint=Path(finished["checkpoint"]), already_complete=True,
                               last_metrics=last_logged(Path(cfg.output_dir) / "metrics.jsonl", step))  # fmt: skip
        return _train(cfg, loss, hooks, train_dataset, eval_dataset)


def _train(cfg: TrainConfig, loss: Any, hooks: CallbackList, train_dataset: Any, eval_dataset: Any) -> TrainResult:
    with PreemptionHandler(immediate=True) as preemption:  # before the first step a signal stops the run at once
        with explained(lambda e: _peer_failure(e, cfg.output_dir, cfg.dist_timeout)):
            return Run(cfg, hooks, preemption, loss).train(train_dataset, eval_dataset)


def _peer_failure(e: Exception, output_dir: str, dist_timeout: float) -> PeerFailureError | None:
    """A collective that failed or timed out, said in one line: which ranks are lost and where to resume (None: the
    error is not a peer's)."""
    if not (_world_size() > 1 and is_peer_failure(e)):
        return None
    latest = find_latest_checkpoint(output_dir)
    lost = lost_ranks(min(5.0, dist_timeout))  # the ranks that do not check in: dead or hung
    who = f"lost rank(s) {', '.join(_rank_names(lost))}" if lost else "another process died or hung"
    return PeerFailureError(
        f"a collective failed or waited longer than --dist-timeout={dist_timeout:g}s: {who} "
        f"(see its log; {type(e).__name__}: {str(e).strip()[:200]!r}). "
        + (f"The newest complete checkpoint is {latest}: rerun with --resume auto." if latest
           else "No checkpoint was written yet.")
    )  # fmt: skip


def _rank_names(ranks: list[int]) -> list[str]:
    """'1 (node 1)': a rank and its node (ranks are numbered node by node, LOCAL_WORLD_SIZE per node)."""
    per_node = max(1, local_world_size())
    return [f"{r} (node {r // per_node})" for r in ranks]


def _world_size() -> int:
    import torch.distributed as dist

    return dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1
