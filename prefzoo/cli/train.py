"""`prefzoo train`: train a policy with any registered loss (flags from TrainConfig, YAML config, default task)."""

from __future__ import annotations

import argparse
import dataclasses
import os
import typing
from typing import Any

from prefzoo._dist import is_rank_zero
from prefzoo.cli.main import CLIError

# flags whose CLI spelling differs from the config key, and the few flags that are not config keys
_RENAMED = {"loss_params": "loss-param", "callbacks": "callback", "modifiers": "modifier"}
_SHORT_HELP = (
    "Train a policy on preference pairs with any registered loss (the embedded default task without --model/--dataset)."
)


def _field_types() -> dict[str, Any]:
    from prefzoo.train.config import TrainConfig

    return typing.get_type_hints(TrainConfig)


class _TRLRedirect(argparse.Action):
    """A TRL flag that means something else in prefzoo: remembered, and reported by run() as a one-line error."""

    def __call__(self, parser: Any, namespace: Any, values: Any, option_string: str | None = None) -> None:
        namespace.trl_redirects = [*getattr(namespace, "trl_redirects", []), self.dest]


def _flag(name: str) -> str:
    return "--" + _RENAMED.get(name, name.replace("_", "-"))


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    from prefzoo.train.config import SECTIONS, field_docs

    p = subparsers.add_parser(
        "train",
        help=_SHORT_HELP,
        description=_SHORT_HELP + " Precedence: defaults < the default task's "
        "recommended settings < --config YAML < flags. Several processes: `accelerate launch -m prefzoo train ...`.",
        argument_default=argparse.SUPPRESS,
    )
    p.add_argument("--config", metavar="RUN.yaml", help="YAML file with the same keys as these flags (default: none)")
    p.add_argument(
        "--threads",
        type=int,
        metavar="N",
        help="CPU threads for torch (default: OMP_NUM_THREADS if set, else the cores the 1-minute load leaves free, "
        "at least 1; the choice is printed at the start)",
    )
    aliases = _trl_spellings(p)
    docs = field_docs()
    types = _field_types()
    for title, section in SECTIONS.items():  # one --help group per section of TrainConfig, as in the docs
        group = p.add_argument_group(title, (section.__doc__ or "").strip())
        for f in dataclasses.fields(section):
            default = f.default_factory() if callable(f.default_factory) else f.default
            shown = DEFAULT_SHOWN.get(f.name, repr(default))
            help_text = f"{docs.get(f.name, '')} (default: {shown})".replace("%", "%%")
            _add_key(group, f.name, [_flag(f.name), *aliases.get(f.name, [])], types[f.name], help_text, docs)
    return p


def _trl_spellings(p: argparse.ArgumentParser) -> dict[str, list[str]]:
    """key -> TRL's spellings of its flag (docs/training.md, "Coming from TRL"); TRL options that mean something
    else here become hidden flags that answer with what to write instead."""
    from prefzoo.train.config.aliases import TRL_OPTIONS

    aliases: dict[str, list[str]] = {}
    for trl, opt in TRL_OPTIONS.items():
        if opt.key is None:
            p.add_argument("--" + trl, dest=trl, nargs="?", action=_TRLRedirect, help=argparse.SUPPRESS)
            continue
        spellings = {"--" + trl, "--" + trl.replace("_", "-")} - {_flag(opt.key)}
        aliases.setdefault(opt.key, []).extend(sorted(spellings))
    return aliases


# keys whose default depends on the run: key -> what --help (and docs/cli.md) says instead of the field's default
DEFAULT_SHOWN = {
    "output_dir": "'runs/prefzoo' with --model, 'runs/prefzoo-default/<loss>' for the embedded default task",
}

# keys given several times on the command line: key -> (metavar, what to add to the key's own doc)
_REPEATED = {
    "loss_params": ("KEY=VALUE", "; repeat for several, e.g. --loss-param beta=0.1 (default: none)"),
    "dataset": ("PATH[:WEIGHT]", " (default: none)"),
    "callbacks": ("SPEC", ": a trainer callback, module:Class or a built-in name (early-stopping, win-rate) or an "
                  "entry point of group prefzoo.callbacks; repeat for several, e.g. --callback "
                  "early-stopping:metric=eval/loss,patience=2 (default: none)"),
    "modifiers": ("NAME[:KEY=VALUE,...]", "; repeat for several, applied in order, e.g. --modifier ld-dpo:alpha=0.5 "
                  "--modifier wpo (`prefzoo modifiers` lists them) (default: none)"),
}  # fmt: skip


def _add_key(
    p: argparse._ActionsContainer, name: str, flags: list[str], typ: Any, help_text: str, docs: dict[str, str]
) -> None:
    """The flag(s) of one TrainConfig key: repeated, an auto|on|off switch, a boolean, or a value."""
    from prefzoo.model import SWITCHES

    if name in _REPEATED:
        metavar, more = _REPEATED[name]
        names = flags if name == "dataset" else flags[:1]  # the data alone keeps its TRL spellings
        p.add_argument(*names, dest=name, action="append", metavar=metavar, help=docs[name].replace("%", "%%") + more)
    elif name in SWITCHES:  # --share-prompt [auto|on|off], --share-prompt alone = on, --no-share-prompt = off
        p.add_argument(*flags, dest=name, nargs="?", const="on", choices=("auto", "on", "off"),
                       metavar="auto|on|off", help=help_text)  # fmt: skip
        p.add_argument("--no-" + flags[0][2:], dest=name, action="store_const", const="off", help=f"{flags[0]} off")
    elif typ is bool:
        p.add_argument(*flags, dest=name, action=argparse.BooleanOptionalAction, help=help_text)
    else:
        p.add_argument(*flags, dest=name, metavar=name.upper(), help=help_text)


def _collect(args: argparse.Namespace) -> tuple[dict[str, Any], list[str]]:
    """(config values from --config and flags, --loss-param pairs); flags override the YAML file."""
    from prefzoo.train.config import TrainConfig, load_yaml_config, resolve_aliases
    from prefzoo.train.config.aliases import TRL_OPTIONS

    for trl in getattr(args, "trl_redirects", []):
        raise CLIError(f"--{trl} is TRL's option; in prefzoo: {TRL_OPTIONS[trl].instead}")
    values: dict[str, Any] = {}
    if getattr(args, "config", None):
        values.update(resolve_aliases(load_yaml_config(args.config), f"--config {args.config}"))
    flags = {k: v for k, v in vars(args).items() if k in TrainConfig.keys()}
    pairs = list(flags.pop("loss_params", None) or [])
    for key in ("callbacks", "modifiers"):  # --callback / --modifier add to the YAML file's list
        if key in flags:
            flags[key] = [*_as_list(values.get(key)), *flags[key]]
    values.update(flags)
    return values, pairs


def _as_list(value: Any) -> list[Any]:
    return [] if value is None else [value] if isinstance(value, str | dict) else list(value)


def _validate_loss(values: dict[str, Any], pairs: list[str]) -> tuple[dict[str, Any], Any]:
    """(loss params from YAML and --loss-param, typed, and the run's loss they build), validated by the loss's params
    class before any model loads.  The loss is built here once and handed to train(); its modifiers are checked
    against the run's settings in preflight, once the config is whole."""
    from prefzoo.registry import parse_loss_params
    from prefzoo.train.setup.loss import make_loss

    loss = str(values.get("loss", "mmpo"))
    params = dict(values.get("loss_params") or {})
    if not isinstance(params, dict):
        raise CLIError("config key loss_params must be a mapping of parameter names to values")
    params = parse_loss_params(loss, {str(k): v for k, v in params.items()}) | parse_loss_params(loss, pairs)
    return params, make_loss(loss, params, _as_list(values.get("modifiers")))  # ranges, choices, modifier fit


def run(args: argparse.Namespace) -> int:
    from prefzoo.cli.runtime import check_launcher, describe_threads, huge_pages, set_threads

    check_launcher()
    n_threads, threads = describe_threads(getattr(args, "threads", None))
    pages = huge_pages()  # before torch loads: torch reads the setting at its first allocation
    if _is_main():  # before torch and the libraries load: on a first run their imports are the first slow step
        print(f"prefzoo train: {threads}", flush=True)
        if pages is not None:
            print(f"prefzoo train: {pages}", flush=True)
        print("prefzoo train: loading torch, transformers, datasets and accelerate", flush=True)
    set_threads(n_threads)
    from prefzoo.data.formats import DataFormatError
    from prefzoo.model import LoadOptionError, LoRATargetError
    from prefzoo.spec import LossOutputError
    from prefzoo.train.checkpoint.hub import HubPushError
    from prefzoo.train.checkpoint.save import ResumeError
    from prefzoo.train.config import ConfigError, TrainConfig
    from prefzoo.train.engines.deepspeed import DeepSpeedMissingError
    from prefzoo.train.errors import TrainingAborted
    from prefzoo.train.setup.preflight import preflight

    _quiet_libraries()
    try:
        values, pairs = _collect(args)
        values["loss_params"], loss = _validate_loss(values, pairs)
        default_data = _default_data(values)
        if default_data is not None:  # --dataset default[:pairs|lists|unpaired] without --model: the default task
            return _run_default({**values, "dataset": None}, _where(args), _flag_names(args), loss, default_data)
        if (values.get("model") is None) != (values.get("dataset") is None):
            missing = "--model" if values.get("model") is None else "--dataset"
            raise CLIError(
                f"{missing} is not set: give both --model and --dataset, or neither to train the embedded default task"
            )
        if values.get("model") is None:
            return _run_default(values, _where(args), _flag_names(args), loss)
        cfg = TrainConfig.from_dict(values, where=_where(args), names=_flag_names(args))
        preflight(loss, cfg)  # modifiers, options the loss ignores, the output folder: before anything loads
        from prefzoo.train.checkpoint.outdir import claim_output_dir
        from prefzoo.train.loop import train

        with claim_output_dir(cfg):  # the lock, no other run's files, no link: before any work
            result = train(cfg, loss=loss)
        _print_summary(result)
        if _is_main() and not result.already_complete:  # a finished run resumed wrote nothing
            print(_produced(result, cfg.output_dir))
        return 0
    except (
        ConfigError,
        DataFormatError,
        ResumeError,
        LoRATargetError,
        HubPushError,  # --push-to-hub: the model is saved, the upload failed (the message says how to retry)
        LoadOptionError,  # --attn-implementation flash_attention_2 without CUDA, --load-in-4bit without bitsandbytes
        DeepSpeedMissingError,
        FileNotFoundError,
        TrainingAborted,  # non-finite steps in a row, a dead or hung peer: one line saying why and how to resume
        LossOutputError,  # a plugin loss broke the LossOutput contract (the message names the plugin)
    ) as e:
        raise CLIError(str(e)) from None


def _default_data(values: dict[str, Any]) -> str | None:
    """The shape of ``--dataset default:SHAPE`` (``default`` alone: pairs) when --model is not set, else None."""
    from prefzoo.data.default import DEFAULT_DATA

    given = values.get("dataset")
    name = given[0] if isinstance(given, list) and len(given) == 1 else given
    if values.get("model") is not None or not isinstance(name, str) or name.split(":")[0] != "default":
        return None
    shape = name.partition(":")[2] or "pairs"
    if shape not in DEFAULT_DATA:
        raise CLIError(
            f"--dataset {name}: the default task offers {', '.join('default:' + d for d in DEFAULT_DATA)} "
            "(default alone = pairs)"
        )
    return shape


def _where(args: argparse.Namespace) -> str:
    """How errors name a key that did not come from a flag."""
    return f"--config {args.config}" if getattr(args, "config", None) else "prefzoo train"


def _flag_names(args: argparse.Namespace) -> dict[str, str]:
    """Config keys set by a flag -> the flag, so a bad value's error names the flag."""
    return {k: _flag(k) for k in vars(args) if k in _field_types()}


def _is_main() -> bool:
    """The launcher's RANK, not PartialState(): creating the state here would start the process group before
    train() can give it --dist-timeout."""
    return is_rank_zero()


def _quiet_libraries() -> None:
    """One progress bar (ours) instead of one per datasets.map and weight load, and no warnings that are not."""
    from prefzoo.cli.runtime import quiet_library_noise

    quiet_library_noise()
    try:
        import datasets
        import transformers

        datasets.disable_progress_bars()
        transformers.utils.logging.disable_progress_bar()
        transformers.utils.logging.set_verbosity_error()
    except ImportError:  # the [train] extra is missing: train() reports it
        pass


def _print_summary(result: Any) -> None:
    from accelerate import PartialState

    if not PartialState().is_main_process:
        return
    last = result.last_metrics or (result.history[-1] if result.history else {})  # a resume with nothing to train
    numbers = (f"final loss {last.get('loss', float('nan')):.4f}, "
               f"reward accuracy {last.get('rewards/accuracies', float('nan')):.3f}")  # fmt: skip
    if result.already_complete:
        print(
            f"prefzoo train: this run is already complete (step {result.global_step} of {result.global_step}"
            f"{'; ' + numbers if 'loss' in last else ''}); its model is in {result.final_dir}. Nothing was changed: "
            "to train further give a larger --max-steps or --epochs with --resume auto, or start a new --output-dir"
        )
        return
    if result.stop_reason and result.final_dir is None:  # preempted: the loop said where the checkpoint is
        print(f"prefzoo train: stopped at step {result.global_step} ({result.stop_reason}); no final model yet")
        return
    print(f"prefzoo train: {result.global_step} steps; {numbers}")


def _produced(result: Any, output_dir: str, took: float | None = None) -> str:
    """The last line of a run: everything it wrote, by path."""
    from pathlib import Path

    out = Path(output_dir)
    parts = []
    if result.final_dir is not None:
        parts.append(f"final model {result.final_dir}")
    if (out / "metrics.jsonl").exists():
        parts.append(f"metrics {out / 'metrics.jsonl'}")
    if (out / "tb").is_dir():
        parts.append(f"TensorBoard {out / 'tb'}")
    if result.checkpoint is not None:
        parts.append(f"last checkpoint {result.checkpoint}")
    when = f"done in {took:.1f} s" if took is not None else "done"
    return f"prefzoo train: {when}; wrote " + (", ".join(parts) if parts else "nothing")


def _run_default(values: dict[str, Any], where: str, names: dict[str, str], loss: Any, data: str = "pairs") -> int:
    """The embedded default task: tiny warmed-up Llama + synthetic pairs (``data``: or lists, or unpaired examples)
    with an exact oracle, fully offline.  Its output folder (default ``runs/prefzoo-default/<loss>``: losses compared
    on the task do not meet in one folder) is claimed first, before the task loads."""
    import time

    from prefzoo.data.default import RECOMMENDED
    from prefzoo.train.checkpoint.outdir import claim_output_dir
    from prefzoo.train.config import TrainConfig
    from prefzoo.train.setup.preflight import preflight

    t0 = time.perf_counter()
    seed = TrainConfig.from_dict({"seed": values.get("seed", 0)}, where, names).seed
    folder = "runs/prefzoo-default/" + str(values.get("loss", "mmpo")).replace(os.sep, "_")  # one per loss compared
    merged = {**RECOMMENDED, "eval_at_start": True, "output_dir": folder, "seed": seed, **values}
    cfg = TrainConfig.from_dict({**merged, "model": None, "dataset": None}, where, names)
    preflight(loss, cfg)  # before the task loads and the starting policy is scored
    with claim_output_dir(cfg):
        return _train_default(cfg, data, t0, loss)


def _train_default(cfg: Any, data: str, t0: float, loss: Any) -> int:
    """Load the default task, score the starting policy, train ``cfg`` on it, and print the before/after table."""
    import dataclasses
    import time

    from prefzoo.model import load_default_task
    from prefzoo.train.loop import train

    main = _is_main()
    if main:
        print("prefzoo train: loading the embedded default task (tiny model, synthetic data)", flush=True)
    task = load_default_task(seed=cfg.seed, progress=main)
    cfg = dataclasses.replace(cfg, model=str(task.model_dir))
    train_data, eval_data = task.data(data)
    if main:
        what = {"pairs": "pairs", "lists": "lists of 4 drafts", "unpaired": "unpaired examples"}[data]
        print(
            f"prefzoo train: embedded default task (model {task.model_dir}, {len(train_data)} train {what}, "
            f"{len(eval_data)} held-out, {len(task.heldout_prompts)} win-rate prompts)"
        )
    from prefzoo.eval.default_task import evaluate_policy

    tokenizer = task.load_tokenizer()
    if main:
        print(
            f"prefzoo train: scoring the starting policy on {len(task.heldout_prompts)} win-rate and "
            f"{len(task.retention_prompts)} retention prompts (greedy generation)",
            flush=True,
        )
    before = evaluate_policy(task, task.load_model(), tokenizer) if main else {}
    result = train(cfg, train_dataset=train_data, eval_dataset=eval_data, loss=loss)
    _print_summary(result)
    if main and not result.already_complete and result.final_dir is not None and result.evals:
        _print_report(task, tokenizer, before, result)
        print(_produced(result, cfg.output_dir, time.perf_counter() - t0))
    return 0


def _print_report(task: Any, tokenizer: Any, before: dict[str, float], result: Any) -> None:
    """Score the saved final model (whole whatever the engine: under --fsdp or ZeRO-3 ``result.model`` holds this
    rank's shards) and print the before/after table of the default task."""
    from prefzoo.eval.default_task import evaluate_policy
    from prefzoo.train.checkpoint.final import load_final_model

    print("prefzoo train: scoring the trained policy", flush=True)
    after = evaluate_policy(task, load_final_model(result.final_dir), tokenizer)
    acc = [e["eval/reward_accuracy"] for e in result.evals]
    print(f"{'':24}{'before':>10}{'after':>10}")
    print(f"{'eval reward accuracy':24}{acc[0]:>10.3f}{acc[-1]:>10.3f}")
    ties = [e.get("eval/ties", 0.0) for e in result.evals]
    if ties[0] > 0 or ties[-1] > 0:  # a tie counts as wrong: before training every pair ties under a reference
        print(f"{'  pairs tied (wrong)':24}{ties[0]:>10.3f}{ties[-1]:>10.3f}")
    print(f"{'win-rate vs start':24}{before.get('win_rate', 0.5):>10.3f}{after.get('win_rate', float('nan')):>10.3f}")
    print(
        f"{'retention (skill B)':24}{before.get('retention', float('nan')):>10.3f}"
        f"{after.get('retention', float('nan')):>10.3f}"
    )
