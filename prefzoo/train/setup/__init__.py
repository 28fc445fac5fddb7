"""The setup phase of a run: ``setup(cfg, train, eval)`` returns the :class:`Parts` every step uses.

:mod:`.pipeline` holds the steps in order; :mod:`.data` and :mod:`.model` the helpers they call.
"""

from __future__ import annotations

from prefzoo.train.setup.parts import Parts
from prefzoo.train.setup.pipeline import setup, skip_batches_left

__all__ = ["Parts", "setup", "skip_batches_left"]
