"""`prefzoo eval`: reward accuracy, judged win-rate and lm-eval scores of a model (the default task if none)."""

from __future__ import annotations

import argparse
import json
import math
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from prefzoo.cli.main import CLIError
from prefzoo.errors import install_hint

_COUNTS = frozenset({"wins", "ties", "losses", "n", "pairs", "dropped", "max_prompt_length", "max_completion_length",
                     "context_truncated", "prompts_truncated"})  # fmt: skip  # printed as integers
_HELP = "Evaluate a model: reward accuracy, win-rate against a baseline with a judge, lm-eval harness tasks."


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    p = subparsers.add_parser(
        "eval",
        help=_HELP,
        description=_HELP + " Without --model it evaluates the embedded default task's starting policy; without "
        "--dataset/--prompts it uses the default task's held-out pairs and prompts. Without a mode flag it runs "
        "--reward-accuracy and --win-rate.",
    )
    p.add_argument("--model", metavar="PATH", help="save_pretrained folder (or hub name) to evaluate "
                   "(default: the embedded default task's starting policy)")  # fmt: skip
    p.add_argument("--baseline", metavar="PATH", help="baseline model of the win-rate and default reference "
                   "(default: the embedded default task's starting policy)")  # fmt: skip
    p.add_argument("--reference", metavar="PATH", help="reference model for reward scores of losses that need one "
                   "(default: --baseline)")  # fmt: skip
    p.add_argument("--seed", type=int, default=0, help="seed of the default task and of sampling (default: 0)")
    p.add_argument("--batch-size", type=int, default=32, help="pairs or prompts per forward (default: 32)")
    p.add_argument("--output", metavar="results.json", help="write all results as JSON here (default: print only)")

    g = p.add_argument_group("reward accuracy")
    g.add_argument("--reward-accuracy", action="store_true", help="reward accuracy on a preference split")
    g.add_argument("--dataset", metavar="SRC", help="preference data: json/jsonl/parquet/csv file, folder, or hub "
                   "name (default: the default task's held-out pairs)")  # fmt: skip
    g.add_argument("--split", default="train", help="split of --dataset (default: train)")
    g.add_argument("--loss", default="dpo", help="registered loss whose rewards score the pairs (default: dpo)")
    g.add_argument("--loss-param", action="append", default=[], metavar="KEY=VALUE",
                   help="loss parameter, repeatable, e.g. beta=0.1 (default: the loss's defaults)")  # fmt: skip
    g.add_argument("--max-prompt-length", type=int, default=None, help="prompt tokens kept, from the end "
                   "(default: 1800, fitted to the model's context)")  # fmt: skip
    g.add_argument("--max-completion-length", type=int, default=None, help="completion tokens kept, from the start "
                   "(default: 512, fitted to the model's context)")  # fmt: skip

    g = p.add_argument_group("win-rate")
    g.add_argument("--win-rate", action="store_true", help="generate from --model and --baseline and judge")
    g.add_argument("--judge", default=None, help="registered judge (default: oracle); `--judge list` lists them")
    g.add_argument("--judge-param", "--judge-arg", dest="judge_param", action="append", default=[],
                   metavar="KEY=VALUE", help="judge option, repeatable, e.g. model_path=./rm (default: none)")
    g.add_argument("--prompts", metavar="FILE", help="prompts: .txt (one per line) or json/jsonl/parquet/csv with a "
                   "'prompt' column (default: the default task's held-out prompts)")  # fmt: skip
    g.add_argument("--max-new-tokens", type=int, default=64, help="tokens generated per prompt (default: 64)")
    g.add_argument("--sample", action="store_true", help="seeded sampling instead of greedy decoding (default: off)")
    g.add_argument("--temperature", type=float, default=1.0, help="sampling temperature with --sample (1.0)")

    g = p.add_argument_group("lm-eval harness")
    g.add_argument("--lm-eval", action="store_true", help="zero-shot lm-eval tasks on --model (a local folder)")
    g.add_argument("--tasks", default="paper", help="comma list: 'paper' (the paper's 10 tasks), task names, or "
                   "local task YAML files/folders (default: paper)")  # fmt: skip
    g.add_argument("--limit", type=float, default=None, help="examples per task (default: all)")
    g.add_argument("--device", default="cpu", help="torch device for lm-eval (default: cpu)")
    return p


def _load_prompts(path: str) -> list[str]:
    p = Path(path).expanduser()
    if not p.is_file():
        raise CLIError(f"--prompts {path}: no such file")
    if p.suffix == ".txt":
        prompts = [line.rstrip("\n") for line in p.read_text().splitlines() if line.strip()]
    else:
        import datasets

        builder = {".json": "json", ".jsonl": "json", ".parquet": "parquet", ".csv": "csv"}.get(p.suffix)
        if builder is None:
            raise CLIError(f"--prompts {path}: use a .txt, .json, .jsonl, .parquet or .csv file")
        ds = datasets.load_dataset(builder, data_files={"train": str(p)}, split="train")
        if "prompt" not in ds.column_names:
            raise CLIError(f"--prompts {path}: no 'prompt' column (columns: {ds.column_names})")
        prompts = [x if isinstance(x, str) else "\n\n".join(m["content"] for m in x) for x in ds["prompt"]]
    if not prompts:
        raise CLIError(f"--prompts {path}: the file holds no prompts")
    return prompts


def _load(path: str) -> tuple[Any, Any]:
    from prefzoo.model import ModelSourceError, load_model_and_tokenizer

    try:
        model, tok, _ = load_model_and_tokenizer(path)
    except ModelSourceError as e:  # it names the folder or file and the fix
        raise CLIError(str(e)) from None
    except OSError as e:
        raise CLIError(f"cannot load model {path!r}: {e}") from None
    return model.eval(), tok


def _print_block(title: str, values: dict[str, Any]) -> None:
    print(f"== {title}")
    for k, v in values.items():
        if k in _COUNTS and isinstance(v, float) and v.is_integer():
            print(f"  {k:28s} {int(v)}")
        elif isinstance(v, float) and not math.isnan(v):
            print(f"  {k:28s} {v:.4f}")
        elif not isinstance(v, dict):
            print(f"  {k:28s} {v}")


def _adapter_baseline(args: argparse.Namespace) -> None:
    """``--model`` a LoRA adapter folder and no ``--baseline``: the baseline (and default reference) is the base model
    its ``adapter_config.json`` names, said in one line; a base that is a local path not found here is an error."""
    config = Path(args.model).expanduser() / "adapter_config.json" if args.model else None
    if args.baseline or config is None or not config.is_file():
        return
    import json

    base = json.loads(config.read_text()).get("base_model_name_or_path")
    if not base:
        raise CLIError(f"--model {args.model}: {config.name} names no base model; give --baseline PATH")
    looks_local = base.startswith((".", "/", "~")) or base.count("/") > 1
    if looks_local and not Path(base).expanduser().is_dir():
        raise CLIError(
            f"--model {args.model} is a LoRA adapter of {base} ({config.name}), which is not on this machine: pass "
            "--baseline PATH (the base model's folder)"
        )
    args.baseline = base
    print(f"prefzoo eval: baseline: {base}, the base model of the LoRA adapter --model {args.model} ({config.name})")


def _check_own_data(args: argparse.Namespace, needs_ref: bool, modes: list[str]) -> None:
    """A user's model on the user's data never gets the default task's model as its reference or baseline."""
    if not args.model or args.baseline:
        return
    if needs_ref and args.dataset is not None:
        raise CLIError(
            f"--reward-accuracy with --loss {args.loss} needs a reference model for --model {args.model}: pass "
            "--baseline PATH (the model it was trained from) or --reference PATH, or use a reference-free --loss "
            "such as simpo"
        )
    if "win_rate" in modes and args.prompts is not None:
        raise CLIError(f"--win-rate compares --model {args.model} with a baseline: pass --baseline PATH")


@dataclass
class _Subject:
    """What every evaluation mode needs: the model under test and its tokenizer, where they and the baseline come
    from, and the default task when the user's data or models do not cover a mode."""

    model: Any
    tok: Any
    model_path: str
    baseline_path: str | None
    task: Any


def run(args: argparse.Namespace) -> int:
    from prefzoo.judge import judge_spec, list_judges

    if args.judge == "list":
        for name in list_judges():
            print(f"{name:16s} {judge_spec(name).description}")
        return 0
    modes = _modes(args)
    judge_name, spec, judge = _judge(args, modes)
    from prefzoo.registry import get_loss, parse_loss_params
    from prefzoo.types import Need

    loss = get_loss(args.loss, **parse_loss_params(args.loss, args.loss_param)) if "reward_accuracy" in modes else None
    needs_ref = loss is not None and Need.REFERENCE in loss.needs and not args.reference
    _adapter_baseline(args)
    _check_own_data(args, needs_ref, modes)
    subject = _subject(args, modes, needs_ref)
    results: dict[str, Any] = {"model": subject.model_path, "baseline": subject.baseline_path}
    if "reward_accuracy" in modes:
        assert loss is not None
        results["reward_accuracy"] = _reward_accuracy(args, subject, loss)
        _print_block(f"reward accuracy ({args.loss})", results["reward_accuracy"])
    if "win_rate" in modes:
        wr = _win_rate(args, subject, spec, judge, judge_name)
        results["win_rate"] = wr
        _print_block(f"win-rate vs {subject.baseline_path} (judge {wr['judge']})", wr)
    if "lm_eval" in modes:
        results["lm_eval"] = _lm_eval(args, subject.model_path)
    if args.output:
        out = Path(args.output)
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(results, indent=2, default=str))
        print(f"results written to {out}", file=sys.stderr)
    return 0


def _modes(args: argparse.Namespace) -> list[str]:
    """The evaluations asked for, or those the given data allows (on the default task: reward accuracy and
    win-rate); --lm-eval checked for its model and its package."""
    modes = [m for m in ("reward_accuracy", "win_rate", "lm_eval") if getattr(args, m)]
    if not modes:  # what the given data allows; on the default task both
        modes = [m for m, ok in (("reward_accuracy", args.dataset or not args.prompts),
                                 ("win_rate", args.prompts or not args.dataset)) if ok]  # fmt: skip
    if "lm_eval" in modes and not args.model:
        raise CLIError("--lm-eval needs --model PATH (a save_pretrained folder)")
    if "lm_eval" in modes:
        try:
            import lm_eval  # noqa: F401
        except ImportError:
            raise CLIError(f"--lm-eval needs lm-eval, which is not installed: {install_hint('eval')}") from None
    return modes


def _judge(args: argparse.Namespace, modes: list[str]) -> tuple[str, Any, Any]:
    """(judge name, its spec, the judge built for --win-rate or None); a bad --judge is one line."""
    from prefzoo.judge import DEFAULT_JUDGE, UnknownJudgeError, get_judge, judge_spec, parse_judge_params

    judge_name = args.judge or DEFAULT_JUDGE
    try:
        spec = judge_spec(judge_name)
        if args.judge is not None and "win_rate" not in modes and not spec.grades_default_task:
            raise CLIError("--judge is used by --win-rate; add --win-rate")
        judge = get_judge(judge_name, **parse_judge_params(args.judge_param)) if "win_rate" in modes else None
    except (UnknownJudgeError, ValueError) as e:
        raise CLIError(f"--judge: {e}") from None
    return judge_name, spec, judge


def _subject(args: argparse.Namespace, modes: list[str], needs_ref: bool) -> _Subject:
    """The model under test, loaded; the default task where a mode has no user data, model or baseline."""
    need_task = (
        not args.model
        or (("win_rate" in modes or needs_ref) and not args.baseline)
        or ("reward_accuracy" in modes and args.dataset is None)
        or ("win_rate" in modes and args.prompts is None)
    )
    task: Any = None
    if need_task:
        from prefzoo.model import load_default_task

        task = load_default_task(seed=args.seed)
    model_path = args.model or str(task.model_dir)
    model, tok = _load(model_path)
    if args.model and task is not None and tok.get_vocab() != task.load_tokenizer().get_vocab():
        raise CLIError(
            f"--model {args.model} does not use the default task's tokenizer, so the default task's pairs, prompts "
            "and starting policy do not apply to it: pass your --dataset/--prompts and --baseline PATH"
        )
    baseline_path = args.baseline or (str(task.model_dir) if task is not None else None)
    return _Subject(model, tok, model_path, baseline_path, task)


def _reward_accuracy(args: argparse.Namespace, subject: _Subject, loss: Any) -> dict[str, Any]:
    """Reward accuracy of the model on the user's split (or the default task's), scored by ``loss``."""
    from prefzoo.data.formats import DataFormatError, load_preference_dataset
    from prefzoo.eval.reward import reward_accuracy
    from prefzoo.types import Need

    try:
        data = subject.task.eval if args.dataset is None else load_preference_dataset(args.dataset, args.split)
    except DataFormatError as e:
        raise CLIError(str(e)) from None
    ref_path: str = args.reference or subject.baseline_path or ""  # _subject guarantees a baseline when needed
    ref = _load(ref_path)[0] if Need.REFERENCE in loss.needs else None
    try:
        ra: dict[str, Any] = reward_accuracy(
            subject.model, subject.tok, data, loss, reference=ref, batch_size=args.batch_size,
            max_prompt_length=args.max_prompt_length, max_completion_length=args.max_completion_length,
        )  # fmt: skip
    except (ValueError, DataFormatError) as e:
        raise CLIError(f"--reward-accuracy: {e}") from None
    ra.update(
        loss=args.loss, dataset=args.dataset or "default-task:eval", reference=ref_path if ref is not None else None
    )
    if ref is not None and Path(ref_path).resolve() == Path(subject.model_path).resolve():
        ra["note"] = "the model is its own reference: every reward is 0 (pass --model or a reference-free --loss)"
    return ra


def _win_rate(args: argparse.Namespace, subject: _Subject, spec: Any, judge: Any, judge_name: str) -> dict[str, Any]:
    """Win-rate against the baseline: the default task's oracle evaluation, or generate and judge the prompts."""
    assert subject.baseline_path is not None  # _subject guarantees it for --win-rate
    baseline, baseline_tok = _load(subject.baseline_path)
    task = subject.task
    if args.prompts is None and spec.grades_default_task and not args.sample:
        from prefzoo.eval.default_task import evaluate_policy

        wr: dict[str, Any] = evaluate_policy(task, subject.model, subject.tok, baseline, batch_size=args.batch_size)
        wr.update(judge=judge_name, prompts="default-task:heldout", decoding="greedy")
        return wr
    from prefzoo.eval.winrate import win_rate

    prompts = task.heldout_prompts if args.prompts is None else _load_prompts(args.prompts)
    try:
        res = win_rate(
            subject.model, baseline, subject.tok, prompts, judge, max_new_tokens=args.max_new_tokens,
            batch_size=args.batch_size, do_sample=args.sample, temperature=args.temperature, seed=args.seed,
            baseline_tokenizer=baseline_tok,
        )  # fmt: skip
    except ValueError as e:
        raise CLIError(f"--win-rate: {e}") from None
    wr = dict(res.summary())
    decoding = f"sample(T={args.temperature}, seed={args.seed})" if args.sample else "greedy"
    wr.update(judge=judge_name, prompts=args.prompts or "default-task:heldout", decoding=decoding)
    return wr


def _lm_eval(args: argparse.Namespace, model_path: str) -> dict[str, Any]:
    """lm-eval's zero-shot tasks on the saved model folder, printed as a table."""
    from prefzoo.eval.harness import format_table, run_lm_eval

    try:
        limit = int(args.limit) if args.limit and args.limit >= 1 else args.limit
        le = run_lm_eval(model_path, args.tasks, batch_size=args.batch_size, device=args.device, limit=limit,
                         seed=args.seed)  # fmt: skip
    except ValueError as e:
        raise CLIError(f"--lm-eval: {e}") from None
    print("== lm-eval (zero-shot)")
    print(format_table(le))
    return dict(le)
