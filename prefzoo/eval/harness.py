"""The lm-eval bridge: zero-shot ``lm_eval.simple_evaluate`` on a saved model folder, results as JSON and a table."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

__all__ = ["PAPER_TASKS", "TASK_SETS", "format_table", "resolve_tasks", "run_lm_eval", "summarize"]

# The ten zero-shot LM-Harness tasks the MMPO paper averages for "general capability".
PAPER_TASKS = (
    "winogrande",
    "arc_easy",
    "piqa",
    "hellaswag",
    "openbookqa",
    "arc_challenge",
    "mmlu",
    "mathqa",
    "race",
    "commonsense_qa",
)
TASK_SETS = {"paper": PAPER_TASKS}
_PREFERRED_METRICS = ("acc,none", "acc_norm,none", "exact_match,none")


def resolve_tasks(tasks: Sequence[str] | str | None) -> tuple[list[str], list[str]]:
    """(task names, include paths): named sets ("paper"), task names, or local task YAML files / folders.

    A ``.yaml`` file contributes its folder to lm-eval's ``include_path`` and its ``task:`` name;
    a folder contributes itself and every ``task:`` name in its YAML files.
    """
    import yaml

    if tasks is None:
        tasks = ["paper"]
    if isinstance(tasks, str):
        tasks = [t for t in tasks.split(",") if t.strip()]
    names: list[str] = []
    include: list[str] = []
    for t in (t.strip() for t in tasks):
        path = Path(t).expanduser()
        if t in TASK_SETS:
            names.extend(TASK_SETS[t])
        elif path.suffix in (".yaml", ".yml") or path.is_dir():
            if not path.exists():
                raise ValueError(f"lm-eval task file {t!r} does not exist")
            files = [path] if path.is_file() else sorted(path.glob("*.y*ml"))
            found = [yaml.safe_load(f.read_text()).get("task") for f in files]
            found = [n for n in found if isinstance(n, str)]
            if not found:
                raise ValueError(f"lm-eval task path {t!r} holds no YAML with a 'task:' name")
            include.append(str((path if path.is_dir() else path.parent).resolve()))
            names.extend(found)
        else:
            names.append(t)
    if not names:
        raise ValueError("no lm-eval tasks given; use --tasks paper, a task name list, or a task YAML file")
    return list(dict.fromkeys(names)), list(dict.fromkeys(include))


def _model_args(path: Path, dtype: str) -> dict[str, str]:
    """lm-eval ``hf`` model args; a LoRA adapter folder loads its base model with ``peft=`` (lm-eval's own option)."""
    import json

    cfg = path / "adapter_config.json"
    if cfg.is_file():
        base = json.loads(cfg.read_text()).get("base_model_name_or_path")
        if not base:
            raise ValueError(f"lm-eval: adapter folder {str(path)!r} names no base_model_name_or_path")
        args = {"pretrained": str(base), "peft": str(path), "dtype": dtype}
        if (path / "tokenizer_config.json").is_file():
            args["tokenizer"] = str(path)
        return args
    return {"pretrained": str(path), "dtype": dtype}


def _local_task_names(include: Sequence[str]) -> list[str]:
    import yaml

    names = []
    for folder in include:
        for f in sorted(Path(folder).glob("*.y*ml")):
            task = yaml.safe_load(f.read_text()).get("task")
            if isinstance(task, str):
                names.append(task)
    return names


def run_lm_eval(
    model_path: str | Path,
    tasks: Sequence[str] | str | None = None,
    *,
    include_path: Sequence[str] | None = None,
    batch_size: int | str = 8,
    device: str = "cpu",
    limit: int | float | None = None,
    dtype: str = "float32",
    seed: int = 0,
) -> dict[str, Any]:
    """Zero-shot lm-eval on the ``save_pretrained`` folder ``model_path``; returns :func:`summarize`'s dict.

    ``tasks``: "paper" (the default, :data:`PAPER_TASKS`), task names, or local task YAML files/folders
    (their data files must be ABSOLUTE paths: lm-eval resolves relative ones against the working directory).
    Offline use: set ``HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1`` and use local tasks, or a warm datasets cache.
    """
    import lm_eval
    from lm_eval.tasks import TaskManager

    if not Path(model_path).is_dir():
        raise ValueError(f"lm-eval: model folder {str(model_path)!r} does not exist (a save_pretrained folder)")
    names, include = resolve_tasks(tasks)
    local = set(_local_task_names(include))
    include = [*include, *(str(Path(p).resolve()) for p in include_path or [])]
    # indexing lm-eval's own ~thousands of task YAMLs takes ~10 s: skip it when every task is local
    tm = TaskManager(include_path=include or None, include_defaults=bool(include_path) or not set(names) <= local)
    missing = [n for n in names if n not in tm.all_tasks]
    if missing:
        raise ValueError(f"lm-eval does not know task(s) {missing}; give a task YAML file or check the spelling")
    res = lm_eval.simple_evaluate(
        model="hf",
        model_args=_model_args(Path(model_path), dtype),
        tasks=names,
        num_fewshot=0,
        batch_size=batch_size,
        device=device,
        limit=limit,
        task_manager=tm,
        log_samples=False,
        random_seed=seed,
        numpy_random_seed=seed,
        torch_random_seed=seed,
        fewshot_random_seed=seed,
    )
    if res is None:  # non-zero ranks under several processes
        return {}
    return summarize(res, names, str(model_path))


def summarize(res: dict[str, Any], tasks: Sequence[str], model: str = "") -> dict[str, Any]:
    """``{"model", "tasks": {name: {metric: value}}, "average_acc", "lm_eval_version"}`` from lm-eval's results."""
    import lm_eval

    per_task: dict[str, dict[str, float]] = {}
    for name in tasks:
        raw = res["results"].get(name, {})
        per_task[name] = {k.split(",")[0]: float(v) for k, v in raw.items() if isinstance(v, int | float) and "," in k}
    accs = [
        next(float(res["results"][n][m]) for m in _PREFERRED_METRICS if m in res["results"].get(n, {}))
        for n in tasks
        if any(m in res["results"].get(n, {}) for m in _PREFERRED_METRICS)
    ]
    return {
        "model": model,
        "tasks": per_task,
        "average_acc": sum(accs) / len(accs) if accs else float("nan"),
        "num_fewshot": 0,
        "lm_eval_version": getattr(lm_eval, "__version__", "unknown"),
    }


def format_table(summary: dict[str, Any]) -> str:
    """A markdown table: one row per task with acc (± stderr) and acc_norm where present, then the average."""
    lines = ["| task | acc | acc_stderr | acc_norm |", "|---|---|---|---|"]
    for name, m in summary.get("tasks", {}).items():
        acc = m.get("acc", m.get("exact_match", float("nan")))
        se = m.get("acc_stderr", float("nan"))
        norm = m.get("acc_norm", float("nan"))
        lines.append(f"| {name} | {acc:.4f} | {se:.4f} | {norm:.4f} |")
    lines.append(f"| **average** | {summary.get('average_acc', float('nan')):.4f} | | |")
    return "\n".join(lines)
