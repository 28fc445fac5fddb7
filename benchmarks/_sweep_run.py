"""Runs of the β sweep: train one (loss, β, seed) on the default task and evaluate the policy after every epoch."""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import io
import os
import tempfile
import time
from dataclasses import dataclass
from typing import Any

__all__ = [
    "ABLATION_LOSSES",
    "BETAS",
    "METHODS",
    "RunSpec",
    "SweepConfig",
    "flat_weights",
    "nsample_lists",
    "plan_runs",
    "run_one",
    "weights_path",
    "weights_sha",
]

METHODS = ("mmpo", "dpo", "simpo")  # the paper's Figures 1-2 and Tables 1-2
BETAS = (0.01, 0.05, 0.5)  # the paper's β grid, used for all three methods (SimPO's own default is β = 2.0)
ABLATION_LOSSES = ("mmpo", "mmpo-no-aux", "mmpo-no-norm", "mmpo-length-norm", "mmpo-entropy")  # Figure 3
ABLATION_BETA = 0.05
NSAMPLE_KS = (2, 4, 8)  # completions per prompt of the n-sample arms (issue 11: the paper's Eq. 4 with n > 2)


@dataclass(frozen=True)
class SweepConfig:
    """Sizes of the miniature: full mode defaults; ``quick()`` is the CI smoke size."""

    epochs: int = 5  # the paper traces 5 epochs
    pairs: int = 300  # training pairs per epoch (the first N of task.train's 600): 300 / 8 = 38 steps per epoch
    eval_prompts: int = 200  # held-out addition prompts for the win-rate and reversal prompts for retention (all)
    seeds: tuple[int, ...] = (0, 1, 2, 3, 4)  # training seeds: data order only (the starting policy is the same)
    lr: float = 3e-4  # peak AdamW lr, cosine with 10% warm-up over all 5 epochs (190 steps)
    batch_size: int = 8  # pairs per optimizer step (1 process, no accumulation)
    task_seed: int = 0  # the default task (starting policy, splits, pairs) is the same for every run
    methods: tuple[str, ...] = METHODS
    betas: tuple[float, ...] = BETAS
    ablation: tuple[str, ...] = ABLATION_LOSSES
    ablation_beta: float = ABLATION_BETA
    # n-sample arms: list losses on K i.i.d. oracle-ranked drafts per prompt, each K at the same number of optimizer
    # steps and completions seen as the pairs (2·batch_size completions per step, 2·pairs per epoch)
    list_losses: tuple[str, ...] = ()
    ks: tuple[int, ...] = NSAMPLE_KS

    @classmethod
    def quick(cls) -> SweepConfig:
        return cls(epochs=2, pairs=96, eval_prompts=50, seeds=(0,))


@dataclass(frozen=True)
class RunSpec:
    """One training run: a loss at one β with one data-order seed."""

    loss: str
    beta: float
    seed: int
    group: str  # 'sweep' (methods × β), 'ablation' (MMPO's parts at the ablation β) or 'nsample' (lists of k)
    k: int = 0  # completions per prompt of an n-sample run (list data); 0: the task's preference pairs


def plan_runs(cfg: SweepConfig) -> list[RunSpec]:
    """Every run of the sweep, each (loss, β, seed) once (mmpo at the ablation β serves both groups)."""
    runs = [RunSpec(m, b, s, "sweep") for s in cfg.seeds for m in cfg.methods for b in cfg.betas]
    have = {(r.loss, r.beta, r.seed) for r in runs}
    runs += [
        RunSpec(a, cfg.ablation_beta, s, "ablation")
        for s in cfg.seeds
        for a in cfg.ablation
        if (a, cfg.ablation_beta, s) not in have
    ]
    runs += [
        RunSpec(lo, b, s, "nsample", k) for s in cfg.seeds for lo in cfg.list_losses for k in cfg.ks for b in cfg.betas
    ]
    return runs


def nsample_lists(task: Any, k: int, groups: int) -> Any:
    """``groups`` lists of ``k`` i.i.d. drafts each, on the first prompts of the pairs' training prompts.

    The drafts come from the pairs' draft distribution (``synthetic.draft_answer``: errors −3..+3 around the truth),
    drawn independently (the z_1..z_K of the paper's Eq. 4; repeats allowed, so K = 8 exists although only 7 answers
    are within ±3), and a list whose K drafts are all the same answer is drawn again (it carries no ranking and the
    list tokenizer drops it).  Scores are −|answer − truth|.  Deterministic in (task seed, k).
    """
    import random

    import datasets

    from prefzoo.data import synthetic

    problems = synthetic.make_splits(task.seed).pref_train
    if groups > len(problems):
        raise ValueError(f"{groups} lists of k={k}: the default task has only {len(problems)} training prompts")
    rng = random.Random(f"prefzoo-nsample-{task.seed}-{k}")
    rows = []
    for i, p in enumerate(problems[:groups]):
        while True:
            drafts = [synthetic.draft_answer(p.truth, rng) for _ in range(k)]
            if len(set(drafts)) > 1:
                break
        rows.append({"id": f"nsample-k{k}-{i}", "prompt": p.prompt, "completions": [str(d) for d in drafts],
                     "scores": [float(-abs(d - p.truth)) for d in drafts]})  # fmt: skip
    return datasets.Dataset.from_list(rows)


def weights_sha(model: Any) -> str:
    """SHA-256 (first 16 hex digits) of every parameter and buffer's bytes, in state_dict order."""
    h = hashlib.sha256()
    for name, t in model.state_dict().items():
        h.update(name.encode())
        h.update(t.detach().contiguous().cpu().numpy().tobytes())
    return h.hexdigest()[:16]


_TASK_CACHE: dict[tuple[Any, ...], Any] = {}


def _task(cfg: SweepConfig) -> tuple[Any, Any, Any]:
    """(task with the eval prompt sets cut to size, tokenizer, baseline model), loaded once per process."""
    key = (cfg.task_seed, cfg.eval_prompts)
    if key not in _TASK_CACHE:
        from prefzoo.model import load_default_task

        full = load_default_task(seed=cfg.task_seed)
        n = cfg.eval_prompts
        task = dataclasses.replace(
            full,
            heldout_prompts=full.heldout_prompts[:n],
            retention_prompts=full.retention_prompts[:n],
            retention_targets=full.retention_targets[:n],
        )
        _TASK_CACHE[key] = (task, task.load_tokenizer(), task.load_model())
    return _TASK_CACHE[key]


def flat_weights(model: Any) -> Any:
    """Every parameter and buffer of ``model`` as one float32 numpy vector (state_dict order)."""
    import torch

    return torch.cat([t.detach().reshape(-1).float().cpu() for t in model.state_dict().values()]).numpy()


def weights_path(weights_dir: str, spec: RunSpec, epoch: int) -> str:
    k = f"_k{spec.k}" if spec.k else ""
    return os.path.join(weights_dir, f"{spec.loss}{k}_b{spec.beta:g}_s{spec.seed}_e{epoch}.npy")


def run_one(spec: RunSpec, cfg: SweepConfig, weights_dir: str | None = None) -> list[dict[str, Any]]:
    """Train ``spec`` for ``cfg.epochs`` epochs; one row per epoch (0 = the starting policy) with the oracle metrics.

    With ``weights_dir`` the policy's weights after every epoch are saved there (``weights_path``), so that runs at
    different β can be compared weight for weight.
    """
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    import torch

    torch.set_num_threads(1)
    from prefzoo.eval.default_task import evaluate_policy
    from prefzoo.train import Callback, TrainConfig, train

    task, tokenizer, baseline = _task(cfg)
    if cfg.pairs > len(task.train):
        raise ValueError(f"pairs={cfg.pairs}: the default task has only {len(task.train)} training pairs")
    rows: list[dict[str, Any]] = []
    t0 = time.perf_counter()
    base = {"loss": spec.loss, "beta": spec.beta, "seed": spec.seed, "group": spec.group, "k": spec.k or 2}
    data, batch_size = task.train.select(range(cfg.pairs)), cfg.batch_size
    if spec.k:  # the same completions per step and per epoch as the pairs: 2·batch_size / k lists per step
        if (2 * cfg.batch_size) % spec.k or (2 * cfg.pairs) % spec.k:
            raise ValueError(f"k={spec.k} must divide 2·batch_size={2 * cfg.batch_size} and 2·pairs={2 * cfg.pairs}")
        data, batch_size = nsample_lists(task, spec.k, 2 * cfg.pairs // spec.k), 2 * cfg.batch_size // spec.k

    def record(epoch: int, model: Any) -> None:
        t_eval = time.perf_counter()
        if weights_dir is not None and epoch > 0:
            import numpy as np

            os.makedirs(weights_dir, exist_ok=True)
            np.save(weights_path(weights_dir, spec, epoch), flat_weights(model))
        m = evaluate_policy(task, model, tokenizer, baseline_model=baseline)
        rows.append(
            {
                **base,
                "epoch": epoch,
                "win_rate": m["win_rate"],
                "lc_win_rate": m["lc_win_rate"],
                "retention": m["retention"],
                "addition_accuracy": m["addition_accuracy"],
                "addition_mae": m["addition_mae"],
                "malformed": m["malformed"],
                "mean_policy_length": m["mean_policy_length"],
                "weights_sha": weights_sha(model),
                "seconds": round(time.perf_counter() - t0, 2),
                "eval_seconds": round(time.perf_counter() - t_eval, 2),
            }
        )

    class _EachEpoch(Callback):
        """The oracle evaluation of every epoch's policy (``state.epoch`` is the epoch just completed)."""

        def __init__(self, fn: Any) -> None:
            self.fn = fn

        def on_epoch_end(self, state: Any, model: Any) -> None:
            self.fn(state.epoch, model)

    start_key = (cfg.task_seed, cfg.eval_prompts, "start")
    if start_key not in _TASK_CACHE:  # the starting policy against itself: the same for every run, evaluated once
        record(0, task.load_model())
        _TASK_CACHE[start_key] = {k: v for k, v in rows[0].items() if k not in base}
    else:
        rows.append({**base, **_TASK_CACHE[start_key], "seconds": 0.0})
    with tempfile.TemporaryDirectory(prefix="prefzoo-sweep-") as out:
        tc = TrainConfig(
            loss=spec.loss,
            loss_params={"beta": spec.beta},
            model=str(task.model_dir),
            epochs=cfg.epochs,
            per_device_batch_size=batch_size,
            grad_accum=1,
            lr=cfg.lr,
            warmup_ratio=float(task.recommended["warmup_ratio"]),
            max_prompt_length=int(task.recommended["max_prompt_length"]),
            max_completion_length=int(task.recommended["max_completion_length"]),
            eval_fraction=0.0,  # the oracle evaluation below replaces the reward-accuracy split
            seed=spec.seed,
            output_dir=out,
            save_total_limit=1,
            progress=False,
            report_to="none",
            cpu=True,
        )
        with contextlib.redirect_stdout(io.StringIO()):  # the trainer's per-run banner lines
            train(tc, data, None, callbacks=[_EachEpoch(record)])
    return rows
