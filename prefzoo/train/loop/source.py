"""Where a run's micro-batches come from: one loop (:meth:`prefzoo.train.loop.run.Run.train`) fed by a data source.

A data source hands the loop *chunks*: (1-based epoch, the micro-batches to train on next).  After each chunk the
loop asks whether a pass over the data ended (then it evaluates and calls ``on_epoch_end``), and it calls
``save``/``load`` with every checkpoint folder, so a resumed run picks up where the source was:

- :class:`EpochBatches` (offline data): one chunk per epoch of the prepared DataLoader, the first one of a resumed
  run without the micro-batches already trained on; every chunk ends a pass; nothing to save beyond the run's own
  state (the data position is the step count);
- :class:`prefzoo.train.online.OnlineRounds` (``--online``): one chunk per round (sample → judge → the round's
  micro-batches); a pass ends when the step count reaches a multiple of the steps per pass over the prompts; the
  round in flight is saved into each checkpoint.

The loop itself knows neither: no branch on on-policy or offline training.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

__all__ = ["DataSource", "EpochBatches"]


class DataSource(Protocol):
    """What :meth:`prefzoo.train.loop.run.Run.train` reads its micro-batches from."""

    def chunks(self, state: Any, callbacks: Any) -> Iterator[tuple[int, Iterable[dict[str, Any]]]]:
        """(1-based epoch, micro-batches) from ``state.global_step`` on; called once, after setup (``callbacks``:
        the run's CallbackList, for a source's own hooks)."""
        ...

    def pass_ended(self, state: Any) -> bool:
        """After a chunk trained to its end: whether a pass over the data ended (evaluate, ``on_epoch_end``)."""
        ...

    def save(self, folder: Path) -> None:
        """Main process, into a checkpoint folder being written: what a resumed run needs of this source."""
        ...

    def load(self, folder: Path) -> None:
        """On resume, from the checkpoint folder: what :meth:`save` wrote."""
        ...


@dataclass
class EpochBatches:
    """Offline data: the epochs of the run's prepared training DataLoader."""

    parts: Any  # prefzoo.train.setup.Parts (train_dl, steps_per_epoch, num_epochs)

    def chunks(self, state: Any, callbacks: Any) -> Iterator[tuple[int, Iterable[dict[str, Any]]]]:
        p = self.parts
        start_epoch = state.global_step // p.steps_per_epoch
        skip = (state.global_step - start_epoch * p.steps_per_epoch) * p.cfg.grad_accum  # micro-batches seen
        for epoch in range(start_epoch, p.num_epochs):
            p.train_dl.set_epoch(epoch)
            yield epoch + 1, p.accelerator.skip_first_batches(p.train_dl, skip) if skip else p.train_dl
            skip = 0

    def pass_ended(self, state: Any) -> bool:
        return True  # a chunk is a whole epoch (or its rest, resumed)

    def save(self, folder: Path) -> None:
        pass  # the position in the data is the step count, in the checkpoint marker

    def load(self, folder: Path) -> None:
        pass
