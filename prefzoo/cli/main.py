"""`prefzoo` entry point: dispatches to one module per subcommand.

Each subcommand module in :data:`SUBCOMMANDS` defines ``add_parser(subparsers)``
(which returns its argparse parser) and ``run(args) -> int``.  Heavy imports
(transformers, accelerate) stay inside ``run`` so that ``prefzoo losses`` and
``--help`` are fast.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import os
import sys
from collections.abc import Callable, Mapping, Sequence

SUBCOMMANDS = ("losses", "modifiers", "inspect", "atlas", "check", "new-loss", "train", "eval", "export", "checkpoint")


class CLIError(Exception):
    """A user-facing error: printed as one line, exit status 2."""


def build_parser(only: str | None = None) -> argparse.ArgumentParser:
    """The whole CLI, or with ``only`` just that subcommand (``prefzoo train`` then imports no other command's module:
    several import torch at the top, and on a first run, before anything is byte-compiled, that is seconds of silence
    before the command's first line)."""
    parser = argparse.ArgumentParser(
        prog="prefzoo",
        description="Offline preference optimization: a zoo of losses (MMPO, DPO family, SimPO, CPO, ORPO) "
        "and a shared trainer.",
    )
    from prefzoo import __version__

    parser.add_argument("--version", action="version", version=f"prefzoo {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in SUBCOMMANDS if only is None else (only,):
        try:
            mod = importlib.import_module(f"prefzoo.cli.{name.replace('-', '_')}")  # new-loss: new_loss.py
        except ModuleNotFoundError as e:  # a subcommand not shipped in this build
            if e.name == f"prefzoo.cli.{name.replace('-', '_')}":
                continue
            raise
        p = mod.add_parser(sub)
        p.set_defaults(_run=mod.run)
    return parser


# errors that are the user's input, printed as one line: (module, class); a class whose module was never imported
# cannot have been raised, so none is imported here (importing the registry imports torch: seconds on a first run)
_USER_ERRORS = (
    ("prefzoo.registry", "UnknownLossError"),
    ("prefzoo.registry", "RegistryError"),
    ("prefzoo.spec", "ParamError"),
    ("prefzoo.types", "PreferenceBatchError"),
    ("prefzoo._safefs", "SymlinkError"),  # a symbolic link where a run or a cache writes
)


def _is_user_error(e: Exception) -> bool:
    loaded = [getattr(sys.modules[m], name) for m, name in _USER_ERRORS if m in sys.modules]
    return isinstance(e, (CLIError, *loaded))


def end_launched_worker(
    code: int, env: Mapping[str, str] | None = None, exit_now: Callable[[int], object] = os._exit
) -> None:
    """In a process that joined a process group (``RANK`` set: torchrun, accelerate launch and deepspeed set it, and
    so does prefzoo for a one-process DeepSpeed run; or ``WORLD_SIZE`` > 1), end now with ``code``, without the
    interpreter's teardown; elsewhere do nothing.

    accelerate's ``end_training`` destroys the process group, but DDP's reducer (and DeepSpeed's engine) keep the gloo
    group and its worker threads alive until the interpreter finalises them; that teardown aborted finished workers
    now and then (SIGABRT, "terminate called without an active exception"; about one ZeRO-3 run in ten, and once in
    CI's two-node test), which the launcher reports as a failed run.  By the time a command returns, everything
    prefzoo writes is closed (checkpoints, the final model, metrics.jsonl opened per line), so only the standard
    streams and logging need flushing first.
    """
    env = os.environ if env is None else env
    try:
        world = int(env.get("WORLD_SIZE") or 1)
    except ValueError:
        world = 1
    if "RANK" not in env and world <= 1:
        return
    end_now(code, exit_now)


def end_now(code: int, exit_now: Callable[[int], object] = os._exit) -> None:
    """Flush the standard streams and logging, then end the process with ``code`` without the interpreter's
    teardown."""
    logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):  # a closed or broken pipe: nothing left to save
            pass
    exit_now(code)


def main(argv: Sequence[str] | None = None) -> int:
    """Run one command; with ``argv`` None (the program's own command line) a launched worker exits through
    :func:`end_launched_worker`, while in-process callers that pass ``argv`` always get the exit status back."""
    if argv is None:
        _line_buffered()
    code = _dispatch(sys.argv[1:] if argv is None else list(argv), program=argv is None)
    if argv is None:
        end_launched_worker(code)
    return code


def _line_buffered() -> None:
    """Each printed line reaches a log file or pipe when it is printed, not when 8 KiB have gathered: a run's status
    lines stay in order with its progress (stderr) and are there while it runs, or when it is killed."""
    for stream in (sys.stdout, sys.stderr):
        reconfigure = getattr(stream, "reconfigure", None)
        if reconfigure is not None:
            reconfigure(line_buffering=True)


def _dispatch(argv: list[str], program: bool = False) -> int:
    """Parse and run ``argv``; ``program``: this is the process's own command line (it may end the process)."""
    parser = build_parser(argv[0] if argv and argv[0] in SUBCOMMANDS else None)
    args = parser.parse_args(argv)
    if not getattr(args, "_run", None):
        parser.print_help()
        return 0
    try:
        return int(args._run(args) or 0)
    except Exception as e:
        if not _is_user_error(e):
            raise
        sys.stdout.flush()  # what the run printed comes before the error, in a log that holds both streams
        print(f"prefzoo {args.command}: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt as e:  # Ctrl-C; or a signal before training started (its message, its exit code)
        sys.stdout.flush()
        print(f"prefzoo {args.command}: {str(e) or 'interrupted'}", file=sys.stderr)
        code = int(getattr(e, "exit_code", 130))
        if program and hasattr(e, "exit_code"):  # a run stopped before its work began (StoppedBeforeTraining):
            end_now(code)  # its user asked it to stop, and freeing torch's and datasets' state took another 1.5 s
        return code


if __name__ == "__main__":  # `python -m prefzoo.cli.main`: run the imported module, whose CLIError the commands raise
    from prefzoo.cli.main import main as _main

    sys.exit(_main())
