"""`prefzoo losses [NAME]` (alias `show`): the registry as a table, or one loss in full."""

from __future__ import annotations

import argparse

from prefzoo.registry import get_registry, loss_spec
from prefzoo.spec import LossSpec, param_infos


def add_parser(sub: argparse._SubParsersAction) -> argparse.ArgumentParser:
    p = sub.add_parser(
        "losses",
        aliases=["show"],
        help="list registered losses, or show one (formula, parameters, paper)",
        description="Without NAME: a table of every registered loss. With NAME: its formula, parameters with "
        "defaults and meaning, what it needs, and its source paper.",
    )
    p.add_argument("name", nargs="?", help="a registered loss name (default: list all)")
    return p


def format_table(rows: list[list[str]], header: list[str]) -> str:
    widths = [max(len(str(r[i])) for r in [header, *rows]) for i in range(len(header))]
    line = "  ".join(h.ljust(w) for h, w in zip(header, widths, strict=True))
    out = [line, "  ".join("-" * w for w in widths)]
    out += ["  ".join(str(c).ljust(w) for c, w in zip(r, widths, strict=True)) for r in rows]
    return "\n".join(s.rstrip() for s in out)


def source_of(spec: LossSpec) -> str:
    return "built-in" if spec.plugin.startswith("prefzoo.") else "plugin"


def list_table() -> str:
    reg = get_registry()
    rows = []
    for name in reg.names():
        s = reg.losses[name]
        rows.append(
            [
                name,
                s.family,
                "yes" if s.needs_reference else "no",
                ",".join(sorted(n.value for n in s.needs)) or "-",
                "yes" if s.batch_coupled else "no",
                source_of(s),
                s.plugin,
            ]
        )
    text = format_table(rows, ["name", "family", "reference", "needs", "batch-coupled", "source", "plugin"])
    for f in reg.failed:
        text += f"\nwarning: plugin {f.plugin!r} failed to load: {f.error}"
    return text


def describe(spec: LossSpec) -> str:
    lines = [
        f"{spec.name}  ({spec.family} family, {source_of(spec)}: {spec.plugin})",
        "",
        f"  loss:    L = {spec.formula}",
        f"  scores:  {spec.scores}",
        f"  needs:   {', '.join(sorted(n.value for n in spec.needs)) or 'policy log-probs only'}",
        f"  batch:   {'coupled (in-batch, gathered across processes)' if spec.batch_coupled else 'per-example'}",
        f"  paper:   {spec.paper}",
    ]
    if spec.description:
        lines += ["", f"  {spec.description}"]
    if spec.notes:
        lines += [f"  Note: {spec.notes}"]
    infos = param_infos(spec.params_cls)
    lines += ["", "  parameters (--loss-param KEY=VALUE):" if infos else "  parameters: none"]
    for i in infos:
        lines.append(f"    {i.name} = {i.default!r}   [{i.range_text()}]  {i.doc}")
    return "\n".join(lines)


def run(args: argparse.Namespace) -> int:
    print(describe(loss_spec(args.name)) if args.name else list_table())
    return 0
