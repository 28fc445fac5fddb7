"""`prefzoo` entry point: dispatches to one module per subcommand.

Each subcommand module in :data:`SUBCOMMANDS` defines ``add_parser(subparsers)``
(which returns its argparse parser) and ``run(args) -> int``.  Heavy imports
(transformers, accelerate) stay inside ``run`` so that ``prefzoo losses`` and
``--help`` are fast.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence

SUBCOMMANDS = ("losses", "modifiers", "inspect", "atlas", "check", "train", "eval", "export")


class CLIError(Exception):
    """A user-facing error: printed as one line, exit status 2."""


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="prefzoo",
        description="Offline preference optimization: a zoo of losses (MMPO, DPO family, SimPO, CPO, ORPO) "
        "and a shared trainer.",
    )
    from prefzoo import __version__

    parser.add_argument("--version", action="version", version=f"prefzoo {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in SUBCOMMANDS:
        try:
            mod = importlib.import_module(f"prefzoo.cli.{name}")
        except ModuleNotFoundError as e:  # a subcommand not shipped in this build
            if e.name == f"prefzoo.cli.{name}":
                continue
            raise
        p = mod.add_parser(sub)
        p.set_defaults(_run=mod.run)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "_run", None):
        parser.print_help()
        return 0
    from prefzoo.registry import RegistryError, UnknownLossError
    from prefzoo.spec import ParamError
    from prefzoo.types import PreferenceBatchError

    try:
        return int(args._run(args) or 0)
    except (CLIError, UnknownLossError, ParamError, RegistryError, PreferenceBatchError) as e:
        print(f"prefzoo {args.command}: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"prefzoo {args.command}: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":  # `python -m prefzoo.cli.main`: run the imported module, whose CLIError the commands raise
    from prefzoo.cli.main import main as _main

    sys.exit(_main())
