"""`prefzoo check NAME`: run the conformance kit on a registered loss and print a table (exit 1 on failure)."""

from __future__ import annotations

import argparse
import json
import sys

from prefzoo.cli.main import CLIError
from prefzoo.errors import install_hint


def add_parser(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    p = subparsers.add_parser(
        "check",
        help="run the property conformance kit on a loss (built-in or plugin)",
        description="Run prefzoo's generic loss properties (finite, shape, permutation, low precision, "
        "monotonicity, shift invariance, sharded gather, ...) on a registered loss with Hypothesis and print "
        "one line per property. Exit status 0 when all hold, 1 when any fails (with its falsifying example).",
    )
    p.add_argument("name", nargs="+", help="registered loss name(s), e.g. dpo or cal-dpo; 'all' for every loss, "
                   "'plugins' for every loss registered by a third-party plugin")
    p.add_argument("--max-examples", type=int, default=50, metavar="N",
                   help="Hypothesis examples per property (default 50; the 'thorough' profile uses 1000)")
    p.add_argument("--property", action="append", dest="properties", metavar="NAME",
                   help="run only this property (repeatable); default all that apply")
    p.add_argument("--dtypes", default="float64,float32,bfloat16",
                   help="comma-separated input dtypes to draw (default float64,float32,bfloat16)")
    p.add_argument("--max-batch", type=int, default=64, metavar="B", help="largest batch drawn (default 64)")
    p.add_argument("--json", action="store_true", help="print the reports as JSON instead of tables")
    return p


def run(args: argparse.Namespace) -> int:
    try:
        import hypothesis  # noqa: F401
    except ImportError:
        raise CLIError(f"prefzoo check needs hypothesis: {install_hint('testing')}") from None
    from prefzoo.registry import get_registry, list_losses, loss_spec
    from prefzoo.testing.conformance import check_loss
    from prefzoo.testing.strategies import DTYPES

    if args.max_examples < 1:
        raise CLIError(f"--max-examples must be >= 1, got {args.max_examples}")
    if args.max_batch < 1:
        raise CLIError(f"--max-batch must be >= 1, got {args.max_batch}")
    dtypes = [d.strip() for d in args.dtypes.split(",") if d.strip()]
    bad = [d for d in dtypes if d not in DTYPES]
    if bad or not dtypes:
        raise CLIError(f"--dtypes: unknown dtype {bad[0] if bad else '(none)'!r}; choose from {', '.join(DTYPES)}")
    if args.name == ["all"]:
        names = list_losses()
    elif args.name == ["plugins"]:
        names = [n for n in list_losses() if not loss_spec(n).builtin]
        if not names:
            raise CLIError("'plugins': no loss is registered by a third-party plugin; install one (pip install "
                           "./plugins/prefzoo-caldpo) and check PREFZOO_DISABLE_PLUGIN_AUTOLOAD is unset")
    else:
        names = args.name
    for n in names:
        loss_spec(n)  # unknown names fail here, with suggestions (exit 2)
    for failed in get_registry().failed:
        print(f"warning: plugin {failed.plugin!r} failed to load: {failed.error}", file=sys.stderr)
    reports = []
    for n in names:
        try:
            report = check_loss(n, max_examples=args.max_examples, dtypes=dtypes, properties=args.properties,
                                max_batch=args.max_batch, derandomize=True)
        except ValueError as e:  # an unknown --property
            raise CLIError(f"--property: {e}") from None
        reports.append(report)
        if not args.json:
            print(report.table())
            if not report.passed:
                print(report.failures_text())
            print()
            sys.stdout.flush()
    if args.json:
        print(json.dumps([{"loss": r.loss, "plugin": r.plugin, "passed": r.passed,
                           "results": [vars(x) for x in r.results]} for r in reports], indent=2))
    return 0 if all(r.passed for r in reports) else 1
