"""On-policy training: each round the policy samples n completions per prompt, a judge scores them, the loss trains.

A round covers ``online_every`` optimizer steps (``--online-every 1``: fully on-policy; larger: semi-online, as
iterative DPO).  Round ``r``:

1. **prompts**: the r-th window of a seeded order of the prompt set (a new order each pass over it).  The window holds
   one micro-batch of prompts per process per micro-step; process ``rank`` takes its own micro-batches.
2. **sample**: the generation engine (``--engine hf``: ``model.generate`` on the unwrapped policy under no_grad with
   the KV cache; ``vllm`` on GPU) draws ``samples_per_prompt`` completions per prompt.  Prompts are sampled in chunks
   of ``generation_batch_size`` whose seed is derived from (seed, round, the chunk's place in the window), never from
   the rank: 2 processes draw exactly the samples 1 process draws for the same global batch.
3. **judge**: :func:`prefzoo.judge.scoring.score_groups` (a pointwise judge's scores, or round-robin Borda scores from
   a pairwise one); a prompt the judge fails on is a counted skip, too many skips stop the run in one line.
4. **train**: the samples become list rows ``{id, prompt, completions, scores}`` and reach the loss through the run's
   :class:`~prefzoo.train.setup.shape_plan.ShapePlan` like offline lists do: list losses on all n, pairwise losses
   on the pairs of ``--pairs-from-lists``, unpaired losses on labels from ``desirable_threshold`` (default: above
   the prompt's mean score is desirable, below undesirable, equal left out).  Normalized, paired and tokenized by
   the row functions offline data goes through (:func:`prefzoo.train.setup.splits.prepare_rows`: in memory, no
   ``datasets`` pass or cache file per round), collated by the run's collator.

The reference stays the starting policy (frozen copy, or the adapter-disabled policy with LoRA), computed for each
generated completion as it is trained on.  The rows of every process are gathered after judging, so the main
process writes the whole round into each checkpoint (``online.json``); a run resumed mid-round trains on the same
rows from the same micro-batch as the uninterrupted run (a round that starts at the resumed step is sampled anew,
from the restored weights).  Callbacks see ``on_generation_begin``/``on_generation_end``/``on_judged``.
:class:`OnlineRounds` is the run's data source (:mod:`prefzoo.train.loop.source`): the same loop as offline epochs.
"""

from __future__ import annotations

import dataclasses
import json
import math
import random
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from prefzoo.data.shapes import LISTS, UNPAIRED
from prefzoo.train.config import ConfigError

__all__ = ["ONLINE_STATE_FILE", "OnlineError", "OnlineRounds", "online_prompts", "parse_judge", "rows_to_unpaired"]

ONLINE_STATE_FILE = "online.json"


class OnlineError(ConfigError):
    """An on-policy run cannot go on (no prompts, no learning signal in a round, a judge that keeps failing)."""


def online_prompts(ds: Any) -> list[Any]:
    """The distinct prompts of a dataset with a ``prompt`` column (prompts only, pairs, lists or unpaired), in order."""
    if ds is None or "prompt" not in getattr(ds, "column_names", ()):
        cols = ", ".join(getattr(ds, "column_names", ()) or ["none"])
        raise OnlineError(
            f"--online trains on prompts: the dataset needs a 'prompt' column (it has: {cols}); give a prompt column, "
            "or a preference dataset whose prompts are used"
        )
    seen: set[str] = set()
    out = []
    for p in ds["prompt"]:
        key = json.dumps(p, sort_keys=True)
        if key not in seen:
            seen.add(key)
            out.append(p)
    if not out:
        raise OnlineError("--online: the dataset holds no prompt; give at least one")
    return out


def parse_judge(spec: str, params: Sequence[str] = ()) -> tuple[str, dict[str, Any]]:
    """``"oracle"`` / ``"reward-model:PATH"`` / ``"llm:PATH"`` plus ``KEY=VALUE`` options -> (name, options)."""
    from prefzoo.judge import judge_spec, parse_judge_params

    name, _, path = spec.partition(":")
    try:
        judge_spec(name)
    except Exception as e:  # the registry's own one-line error names the registered judges
        raise OnlineError(f"--judge {spec!r}: {e}") from None
    opts = parse_judge_params(list(params), "--judge-params")
    if path:
        opts.setdefault("model_path", path)
    return name, opts


def rows_to_unpaired(rows: list[dict[str, Any]], threshold: float | None) -> list[dict[str, Any]]:
    """Unpaired examples from scored lists: score >= ``threshold`` desirable; without one, above the prompt's mean
    desirable, below it undesirable, equal to it (e.g. all samples tie) left out."""
    out = []
    for row in rows:
        mean = sum(row["scores"]) / len(row["scores"])
        for k, (text, s) in enumerate(zip(row["completions"], row["scores"], strict=True)):
            if threshold is not None:
                label = s >= threshold
            elif s == mean:
                continue
            else:
                label = s > mean
            out.append({"id": f"{row['id']}:{k}", "prompt": row["prompt"], "completion": text, "label": label})
    return out


@dataclass
class RoundStats:
    """What one round produced on all processes together (logged as ``online/...``)."""

    round: int
    prompts: int = 0
    samples: int = 0
    skipped: int = 0
    all_tied: int = 0
    truncated: int = 0
    tokens: int = 0
    score_mean: float = math.nan
    score_spread: float = math.nan  # mean over prompts of (max − min) of their samples' scores
    generation_s: float = 0.0
    judging_s: float = 0.0
    rows: int = 0

    def metrics(self) -> dict[str, float]:
        return {
            "online/round": float(self.round),
            "online/prompts": float(self.prompts),
            "online/samples": float(self.samples),
            "online/skipped_prompts": float(self.skipped),
            "online/all_tied_fraction": self.all_tied / max(self.prompts - self.skipped, 1),
            "online/truncated_samples": float(self.truncated),
            "online/score_mean": self.score_mean,
            "online/score_spread": self.score_spread,
            "online/generation_tokens_per_s": self.tokens / max(self.generation_s, 1e-9),
            "online/generation_s": self.generation_s,
            "online/judging_s": self.judging_s,
            "online/train_rows": float(self.rows),
        }


@dataclass
class OnlineRounds:
    """The rounds of an on-policy run: prompts -> samples -> scores -> the micro-batches of each round."""

    cfg: Any
    parts: Any  # prefzoo.train.setup.Parts
    prompts: list[Any]
    judge: Any
    engine: Any
    plan: Any  # the ShapePlan of list data for this loss
    limits: Any  # ContextLimits of the model
    history: list[dict[str, float]] = field(default_factory=list)
    current: dict[str, Any] | None = None  # {"round": r, "rows": [...all processes' rows...]} of the round in flight
    checked: bool = False  # the log-prob self-check ran (on the first round's first micro-batch)

    @property
    def max_new_tokens(self) -> int:
        """``--max-new-tokens``, or (unset) the completion token limit of the run: samples fit what training keeps."""
        return int(self.cfg.max_new_tokens or self.limits.max_completion_length)

    # -- geometry ------------------------------------------------------------------------------------------------
    @property
    def micro_per_round(self) -> int:
        return self.cfg.online_every * self.cfg.grad_accum

    @property
    def prompts_per_round(self) -> int:
        """Prompts of one round on all processes: one micro-batch of prompts per process per micro-step."""
        return self.micro_per_round * self.parts.accelerator.num_processes * self.cfg.per_device_batch_size

    def window(self, r: int) -> list[int]:
        """Indices into ``prompts`` of round ``r``: consecutive slices of seeded permutations (one per pass)."""
        n, size = len(self.prompts), self.prompts_per_round
        out: list[int] = []
        pos = r * size
        while len(out) < size:
            epoch, offset = divmod(pos, n)
            order = list(range(n))
            random.Random(self.cfg.seed * 1_000_003 + epoch).shuffle(order)
            take = order[offset : offset + size - len(out)]
            out += take
            pos += len(take)
        return out

    def my_prompts(self, r: int) -> list[int]:
        """This process's prompts of round ``r``, micro-batch by micro-batch (micro-step m: slot m·P + rank)."""
        acc, b = self.parts.accelerator, self.cfg.per_device_batch_size
        win, world = self.window(r), acc.num_processes
        return [i for m in range(self.micro_per_round) for i in win[(m * world + acc.process_index) * b :][:b]]

    # -- one round -----------------------------------------------------------------------------------------------
    def sample_and_judge(self, r: int, state: Any, callbacks: Any) -> list[dict[str, Any]]:
        """Round ``r``'s scored list rows of every process (gathered), with its metrics logged."""
        from accelerate.utils import gather_object

        from prefzoo.data.chat import render_prompt
        from prefzoo.judge import JudgeFailure, SamplingParams, score_groups

        cfg, acc = self.cfg, self.parts.accelerator
        mine = self.my_prompts(r)
        chunk = cfg.generation_batch_size or cfg.per_device_batch_size
        win_pos = {i: k for k, i in enumerate(self.window(r))}
        callbacks.call("on_generation_begin", state)
        t0 = time.perf_counter()
        texts: list[list[str]] = []
        truncated = tokens = 0
        for start in range(0, len(mine), chunk):
            ids = mine[start : start + chunk]
            params = SamplingParams(
                n=cfg.samples_per_prompt, temperature=cfg.temperature, top_p=cfg.top_p,
                max_new_tokens=self.max_new_tokens, batch_size=chunk,
                seed=(cfg.seed * 7_919 + r) * 1_000_003 + win_pos[ids[0]],
            )  # fmt: skip
            got = self.engine.sample([self.prompts[i] for i in ids], params)
            texts += got.texts
            truncated += got.n_truncated
            tokens += got.n_tokens
        gen_s = time.perf_counter() - t0
        callbacks.call("on_generation_end", state)
        t0 = time.perf_counter()
        tok = self.parts.tokenizer
        asked = [self.prompts[i] for i in mine]
        shown = [p if isinstance(p, str) else tok.decode(render_prompt(tok, p)) for p in asked]  # what a judge reads
        try:
            scored = score_groups(self.judge, shown, texts, max_skip_fraction=cfg.judge_max_skip)
        except JudgeFailure as e:
            raise OnlineError(f"round {r}: {e}") from None
        judge_s = time.perf_counter() - t0
        rows = []
        for slot, (i, group, scores) in enumerate(zip(mine, texts, scored.scores, strict=True)):
            if scores is None:
                continue
            order = sorted(range(len(group)), key=lambda k: -scores[k])  # best first, ties keep their order
            rows.append({"id": f"r{r}:p{i}:s{slot}:rank{acc.process_index}", "prompt": self.prompts[i],
                         "completions": [group[k] for k in order], "scores": [float(scores[k]) for k in order],
                         "rank": acc.process_index, "slot": slot})  # fmt: skip
        local = {"rows": rows, "skipped": scored.skipped, "tied": scored.all_tied, "prompts": len(mine),
                 "truncated": truncated, "tokens": tokens, "gen_s": gen_s, "judge_s": judge_s,
                 "reasons": list(scored.reasons.values())[:1]}  # fmt: skip
        every: list[dict[str, Any]] = gather_object([local]) if acc.num_processes > 1 else [local]
        callbacks.call("on_judged", state)
        all_rows = [row for part in every for row in part["rows"]]
        self._log_round(r, every, all_rows, state)
        return all_rows

    def _log_round(self, r: int, every: list[dict[str, Any]], rows: list[dict[str, Any]], state: Any) -> None:
        st = RoundStats(r)
        for part in every:
            st.prompts += part["prompts"]
            st.skipped += part["skipped"]
            st.all_tied += part["tied"]
            st.truncated += part["truncated"]
            st.tokens += part["tokens"]
            st.generation_s = max(st.generation_s, part["gen_s"])
            st.judging_s = max(st.judging_s, part["judge_s"])
        scores = [s for row in rows for s in row["scores"]]
        st.samples = len(scores)
        if scores:
            st.score_mean = sum(scores) / len(scores)
            st.score_spread = sum(max(row["scores"]) - min(row["scores"]) for row in rows) / len(rows)
        st.rows = len(rows)
        m = {**st.metrics(), "step": float(state.global_step)}
        self.history.append(m)
        state.log_metrics(m)
        reason = next((p["reasons"][0] for p in every if p["reasons"]), None)
        self.parts.accelerator.print(
            f"prefzoo train: round {r}: {st.prompts} prompts × {self.cfg.samples_per_prompt} samples in "
            f"{st.generation_s:.1f} s ({m['online/generation_tokens_per_s']:.0f} tokens/s), judged in "
            f"{st.judging_s:.1f} s; score mean {st.score_mean:.3f}, spread {st.score_spread:.3f}; "
            f"{st.all_tied} prompts all tied, {st.skipped} skipped"
            + (f" (first: {reason})" if reason else "")
            + (f", {st.truncated} samples hit max_new_tokens={self.max_new_tokens}" if st.truncated else "")
        )

    def batches(self, rows: list[dict[str, Any]], r: int) -> list[dict[str, Any]]:
        """This process's ``micro_per_round`` collated micro-batches of a round's rows (cycled when fewer)."""
        import torch

        from prefzoo.train.setup.splits import prepare_rows

        cfg, acc = self.cfg, self.parts.accelerator
        mine = [{k: v for k, v in row.items() if k not in ("rank", "slot")}
                for row in sorted(rows, key=lambda x: x["slot"]) if row["rank"] == acc.process_index]  # fmt: skip
        if self.plan.batches == UNPAIRED:
            mine = rows_to_unpaired(mine, cfg.desirable_threshold)
        n = len(mine)
        counts = acc.gather(torch.tensor([n], device=acc.device)) if acc.num_processes > 1 else [n]
        if min(int(c) for c in counts) == 0:
            raise OnlineError(
                f"round {r}: a process has no example to train on (every prompt skipped by the judge, or every sample "
                "tied); raise --samples-per-prompt or --temperature, or check the judge"
            )
        plan = dataclasses.replace(self.plan, data=UNPAIRED if self.plan.batches == UNPAIRED else LISTS)
        tok, stats, _ = prepare_rows(self.parts.tokenizer, mine, self.limits, plan)  # in memory: no datasets pass
        if not tok:
            raise OnlineError(
                f"round {r}: no generated example survived tokenization ({stats.total} made, {stats.identical} with "
                "identical completions, the rest with no completion token or no strict preference); raise "
                "--max-new-tokens, --samples-per-prompt or --temperature"
            )
        b = cfg.per_device_batch_size
        order = list(range(len(tok)))
        out: list[dict[str, Any]] = []
        k = 0
        while len(out) < self.micro_per_round:
            idx = [order[(k + j) % len(order)] for j in range(b)]
            k += b
            batch = self.parts.collate([tok[i] for i in idx])
            out.append({key: (v.to(acc.device) if torch.is_tensor(v) else v) for key, v in batch.items()})
        return out

    # -- the run's data source (prefzoo.train.loop.source) ------------------------------------------------------
    def chunks(self, state: Any, callbacks: Any) -> Iterator[tuple[int, list[dict[str, Any]]]]:
        """(epoch, the micro-batches of each round) from ``state.global_step`` on (resumed mid-round: the saved
        rows); the epoch counts passes over the prompts."""
        every = self.cfg.online_every
        while state.global_step < self.parts.total_steps:
            r, done = divmod(state.global_step, every)
            if self.current is not None and self.current["round"] == r:
                rows = self.current["rows"]  # resumed inside this round: the rows the interrupted run trained on
            else:
                rows = self.sample_and_judge(r, state, callbacks)
                self.current = {"round": r, "rows": rows}
            batches = self.batches(rows, r)
            if not self.checked:  # the log-prob fast path against the model's own forward, on the first samples
                self.checked = True
                from prefzoo.model import run_self_check

                p = self.parts
                if p.engine.self_check:
                    run_self_check(p.policy, p.reference, batches[0], self.cfg.logps_fallback, p.accelerator.print)
            yield state.global_step // self.parts.steps_per_epoch + 1, batches[done * self.cfg.grad_accum :]

    def pass_ended(self, state: Any) -> bool:
        """A round ends a pass over the prompts when the step count reaches a multiple of the steps per pass."""
        return state.global_step % state.steps_per_epoch == 0 or state.global_step >= state.total_steps

    def save(self, folder: Path) -> None:
        """Write the round in flight (its rows on every process) into a checkpoint folder."""
        if self.current is not None:
            (Path(folder) / ONLINE_STATE_FILE).write_text(json.dumps(self.current))

    def load(self, folder: Path) -> None:
        path = Path(folder) / ONLINE_STATE_FILE
        if path.is_file():
            self.current = json.loads(path.read_text())
