"""transformers' learning-rate schedules, as ``torch.optim.lr_scheduler.LambdaLR`` built without importing
``transformers.optimization``.

That module imports ``transformers.trainer_utils``, which imports peft (and, through peft, bitsandbytes) whenever they
are installed: measured on the 12M-parameter benchmark run (UltraFeedback ``simpo``, one thread), building the
schedule that way took the run's start from 7.4 to 11.7 s and its peak RSS from ~1,497 to 1,538 MB, in a run that
trains no adapter.  The factors below are transformers' (``transformers/optimization.py``, 4.46 to 5.x) term for
term, except where theirs raises (a polynomial decay whose warm-up fills the run ends at ``lr_end`` instead of
dividing by zero at its last step), as ``functools.partial`` objects like theirs, so a scheduler state saved by either
loads into the other.  ``tests/train/setup/test_schedules.py`` checks every name against ``transformers.get_scheduler``:
equal learning rates (``==``, not approximately), equal state dicts, and a resume across the two.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from functools import partial
from typing import Any

__all__ = ["SCHEDULES", "get_schedule"]


def _warmup(step: int, warmup: int) -> float:
    return float(step) / float(max(1, warmup))


def _constant(_: Any = None) -> float:
    return 1


def _constant_with_warmup(step: int, *, num_warmup_steps: int) -> float:
    if step < num_warmup_steps:
        return float(step) / float(max(1.0, num_warmup_steps))
    return 1.0


def _linear(step: int, *, num_warmup_steps: int, num_training_steps: int) -> float:
    if step < num_warmup_steps:
        return _warmup(step, num_warmup_steps)
    return max(0.0, float(num_training_steps - step) / float(max(1, num_training_steps - num_warmup_steps)))


def _warmed(step: int, warmup: int, total: int, curve: Callable[[float], float]) -> float:
    """The linear warm-up, then ``curve`` of the fraction of the post-warm-up steps done at ``step``."""
    if step < warmup:
        return _warmup(step, warmup)
    return curve(float(step - warmup) / float(max(1, total - warmup)))


def _cosine(step: int, *, num_warmup_steps: int, num_training_steps: int, num_cycles: float) -> float:
    def curve(progress: float) -> float:
        return max(0.0, 0.5 * (1.0 + math.cos(math.pi * float(num_cycles) * 2.0 * progress)))

    return _warmed(step, num_warmup_steps, num_training_steps, curve)


def _cosine_with_restarts(step: int, *, num_warmup_steps: int, num_training_steps: int, num_cycles: int) -> float:
    def curve(progress: float) -> float:
        if progress >= 1.0:
            return 0.0
        return max(0.0, 0.5 * (1.0 + math.cos(math.pi * ((float(num_cycles) * progress) % 1.0))))

    return _warmed(step, num_warmup_steps, num_training_steps, curve)


def _polynomial(
    step: int, *, num_warmup_steps: int, num_training_steps: int, lr_end: float, power: float, lr_init: float
) -> float:
    if step < num_warmup_steps:
        return _warmup(step, num_warmup_steps)
    decay_steps = num_training_steps - num_warmup_steps
    if step > num_training_steps or decay_steps <= 0:  # transformers divides by 0 when warm-up fills the run
        return lr_end / lr_init  # LambdaLR multiplies by lr_init
    lr_range = lr_init - lr_end
    pct_remaining = 1 - (step - num_warmup_steps) / decay_steps
    decay = lr_range * pct_remaining**power + lr_end
    return decay / lr_init


def _inverse_sqrt(step: int, *, num_warmup_steps: int, timescale: int) -> float:
    if step < num_warmup_steps:
        return _warmup(step, num_warmup_steps)
    shift = timescale - num_warmup_steps
    return 1.0 / math.sqrt((step + shift) / timescale)


def _factor(name: str, optimizer: Any, warmup: int, total: int) -> Callable[..., float]:
    """The LambdaLR factor of schedule ``name`` with transformers' defaults for its extra arguments."""
    if name == "constant":
        return _constant
    if name == "constant_with_warmup":
        return partial(_constant_with_warmup, num_warmup_steps=warmup)
    if name == "inverse_sqrt":
        return partial(_inverse_sqrt, num_warmup_steps=warmup, timescale=warmup or 10_000)
    if name == "linear":
        return partial(_linear, num_warmup_steps=warmup, num_training_steps=total)
    if name == "cosine":
        return partial(_cosine, num_warmup_steps=warmup, num_training_steps=total, num_cycles=0.5)
    if name == "cosine_with_restarts":
        return partial(_cosine_with_restarts, num_warmup_steps=warmup, num_training_steps=total, num_cycles=1)
    if name == "polynomial":
        lr_init, lr_end = optimizer.defaults["lr"], 1e-7
        if not lr_init > lr_end:
            raise ValueError(f"lr={lr_init}: the polynomial schedule decays to 1e-7; choose a larger --lr")
        return partial(_polynomial, num_warmup_steps=warmup, num_training_steps=total, lr_end=lr_end, power=1.0,
                       lr_init=lr_init)  # fmt: skip
    raise ValueError(f"lr_scheduler_type={name!r}: choose {', '.join(SCHEDULES)}")


SCHEDULES = ("cosine", "linear", "constant", "constant_with_warmup", "cosine_with_restarts", "polynomial",
             "inverse_sqrt")  # fmt: skip  # transformers.get_scheduler's names that need no extra arguments


def get_schedule(name: str, optimizer: Any, num_warmup_steps: int, num_training_steps: int) -> Any:
    """``transformers.get_scheduler(name, optimizer, num_warmup_steps, num_training_steps)``: the same LambdaLR."""
    from torch.optim.lr_scheduler import LambdaLR

    return LambdaLR(optimizer, _factor(name, optimizer, num_warmup_steps, num_training_steps))
