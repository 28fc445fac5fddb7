"""``WinRateCallback``: the policy's win-rate against the starting model on held-out prompts, every few epochs.

A trainer callback (``--callback win-rate:prompts=prompts.txt,judge=oracle``) built on the judge registry
(:mod:`prefzoo.judge.registry`) and :func:`prefzoo.eval.winrate.win_rate`.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from prefzoo.callbacks import Callback, RunState

__all__ = ["WinRateCallback", "read_prompts"]


def read_prompts(source: str | Path) -> list[str]:
    """Prompts from a text file (one per line) or a .jsonl file (a ``prompt`` field per line)."""
    path = Path(source)
    if not path.is_file():
        raise FileNotFoundError(f"prompts={source}: no such file (give a .txt with one prompt per line, or .jsonl)")
    lines = [s for s in path.read_text().splitlines() if s.strip()]
    if path.suffix == ".jsonl":
        return [str(json.loads(s)["prompt"]) for s in lines]
    return lines


class WinRateCallback(Callback):
    """At every ``every_epochs``-th epoch end, generate from the policy and the starting model and judge them.

    Main process only (the other processes wait at the next collective); not under an engine that partitions the
    weights (they cannot generate on one process).  Records ``winrate/win_rate``, ``winrate/lc_win_rate``, ... in
    ``self.history``, metrics.jsonl and the trackers.  ``judge`` is a registered judge name, ``judge_options``
    its options (e.g. ``{"model_path": "./rm"}`` for ``reward-model``).
    """

    name = "win-rate"

    def __init__(
        self,
        prompts: Sequence[str] | str | Path,
        judge: str = "oracle",
        judge_options: dict[str, Any] | None = None,
        max_new_tokens: int = 32,
        batch_size: int = 32,
        every_epochs: int = 1,
        judge_timeout_s: float | None = 300.0,  # per judge call: a hung or slow judge is skipped and counted
        judge_batch_size: int = 8,  # prompts per judge call (the unit a timeout skips)
    ) -> None:
        from prefzoo.judge import get_judge

        self.prompts = read_prompts(prompts) if isinstance(prompts, str | Path) else [str(p) for p in prompts]
        if not self.prompts:
            raise ValueError("prompts is empty: give at least one held-out prompt")
        if int(every_epochs) < 1:
            raise ValueError(f"every_epochs={every_epochs} must be >= 1")
        self.judge = get_judge(judge, **(judge_options or {}))  # an unknown judge fails before training
        self.max_new_tokens, self.batch_size = int(max_new_tokens), int(batch_size)
        self.every_epochs = int(every_epochs)
        self.judge_timeout_s = None if judge_timeout_s is None else float(judge_timeout_s)
        self.judge_batch_size = int(judge_batch_size)
        self.baseline: Any = None
        self.history: list[dict[str, float]] = []

    def on_train_begin(self, state: RunState) -> None:
        engine = state.engine
        if engine is not None and engine.partitions_params:
            raise ValueError(
                f"the win-rate callback cannot generate from {engine.label} partitioned weights; drop it or "
                f"{engine.option}"
            )
        if state.is_main_process:  # the starting policy, frozen: the baseline every epoch is compared with
            self.baseline = copy.deepcopy(state.accelerator.unwrap_model(state.model).lm).eval().requires_grad_(False)

    def on_epoch_end(self, state: RunState, model: Any) -> None:
        if not state.is_main_process or state.epoch % self.every_epochs:
            return
        from prefzoo.eval.winrate import win_rate

        res = win_rate(model, self.baseline, state.tokenizer, self.prompts, self.judge,
                       max_new_tokens=self.max_new_tokens, batch_size=self.batch_size,
                       judge_timeout_s=self.judge_timeout_s, judge_batch_size=self.judge_batch_size)  # fmt: skip
        summary = res.summary()
        record = {f"winrate/{k}": float(v) for k, v in summary.items()}
        record.update(epoch=state.epoch, step=state.global_step)
        self.history.append(record)
        state.log_metrics(record)
        state.accelerator.print(
            f"prefzoo train: epoch {state.epoch}: win-rate vs start {summary['win_rate']:.3f} "
            f"(length-controlled {summary['lc_win_rate']:.3f}) on {len(self.prompts)} prompts"
            + (f"; {res.skipped} skipped: the judge did not answer within {self.judge_timeout_s:g}s per call"
               if res.skipped else "")
        )  # fmt: skip
