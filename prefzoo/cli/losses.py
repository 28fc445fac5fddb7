"""`prefzoo losses [NAME]` (alias `show`): the registry as a table, or one loss in full."""

from __future__ import annotations

import argparse
import re
from pathlib import Path
from typing import Any

from prefzoo.cli.families import GROUPS, group_of
from prefzoo.registry import get_registry, loss_spec
from prefzoo.spec import LossSpec, ModifierSpec, param_infos, text_of
from prefzoo.types import Shape


def add_parser(sub: argparse._SubParsersAction) -> argparse.ArgumentParser:
    p = sub.add_parser(
        "losses",
        aliases=["show"],
        help="list registered losses, or show one (formula, parameters, paper)",
        description="Without NAME: a table of every registered loss. With NAME: its formula, parameters with "
        "defaults and meaning, what it needs, and its source paper.",
    )
    p.add_argument("name", nargs="?", help="a registered loss name (default: list all)")
    p.add_argument("--markdown", action="store_true",
                   help="print the whole loss catalogue as one Markdown page (the site's pages: --markdown-dir)")
    p.add_argument(
        "--markdown-dir",
        metavar="DOCS",
        help="write the catalogue as the site's pages into DOCS: losses.md (the index) and losses/FAMILY.md, one page "
        "per family of the atlas (this is how docs/losses.md and docs/losses/ are generated)",
    )
    p.add_argument(
        "--features",
        action="store_true",
        help="print the feature table (prefzoo vs TRL 1.16, LLaMA-Factory, OpenRLHF) as Markdown, as in README.md",
    )
    return p


def add_markdown_flag(p: argparse.ArgumentParser, what: str, doc: str) -> None:
    """``--markdown``: print ``what`` as Markdown, the way ``doc`` is generated."""
    p.add_argument("--markdown", action="store_true", help=f"print {what} as Markdown (this is how {doc} is generated)")


def with_failures(text: str, reg: Any) -> str:
    """``text`` followed by one warning line per plugin of the registry ``reg`` that failed to load."""
    for f in reg.failed:
        text += f"\nwarning: plugin {f.plugin!r} failed to load: {f.error}"
    return text


def format_table(rows: list[list[str]], header: list[str]) -> str:
    widths = [max(len(str(r[i])) for r in [header, *rows]) for i in range(len(header))]
    line = "  ".join(h.ljust(w) for h, w in zip(header, widths, strict=True))
    out = [line, "  ".join("-" * w for w in widths)]
    out += ["  ".join(str(c).ljust(w) for c, w in zip(r, widths, strict=True)) for r in rows]
    return "\n".join(s.rstrip() for s in out)


def source_of(spec: LossSpec) -> str:
    return "built-in" if spec.builtin else "plugin"


_BATCH_TEXT = {
    "yes": "coupled (in-batch, gathered across processes)",
    "no": "per-example",
    "by params": "per-example or coupled, depending on its parameters (e.g. nll_reduction)",
}


def coupling(spec: LossSpec) -> str:
    """"yes", "no" or "by params": whether an example's loss depends on the rest of its batch."""
    if callable(spec.batch_coupled):
        return "by params"
    return "yes" if spec.batch_coupled else "no"


def list_table() -> str:
    reg = get_registry()
    rows = []
    for name in reg.names():
        s = reg.specs[name]
        rows.append(
            [
                name,
                s.family,
                "yes" if s.needs_reference else "no",
                ",".join(sorted(n.value for n in s.needs)) or "-",
                coupling(s),
                source_of(s),
                s.plugin,
            ]
        )
    text = format_table(rows, ["name", "family", "reference", "needs", "batch-coupled", "source", "plugin"])
    return with_failures(text, reg)


_SHAPE_TEXT = {Shape.PAIR: "pairs "
    "(PreferenceBatch)", Shape.LIST: "lists of $K \\geq 2$ ranked completions (GroupBatch)",
               Shape.UNPAIRED: "unpaired labelled completions (UnpairedBatch)"}


def takes(spec: LossSpec) -> str:
    """The batch shapes a loss takes, in words (pairs reach a list-only loss as K = 2 groups)."""
    text = "; ".join(_SHAPE_TEXT[x] for x in Shape if x in spec.shapes)
    if Shape.PAIR not in spec.shapes and spec.accepts(Shape.PAIR):
        text += "; pairs as $K = 2$ groups"
    return text


def describe(spec: LossSpec) -> str:
    lines = [
        f"{spec.name}  ({spec.family} family, {source_of(spec)}: {spec.plugin})",
        "",
        f"  loss:    L = {spec.formula}",
        f"  scores:  {text_of(spec.scores)}",
        f"  needs:   {', '.join(sorted(n.value for n in spec.needs)) or 'policy log-probs only'}",
        f"  batch:   {_BATCH_TEXT[coupling(spec)]}",
        f"  paper:   {spec.paper}",
    ]
    if spec.shapes != {Shape.PAIR}:
        lines.insert(5, f"  takes:   {text_of(takes(spec))}")
    return "\n".join(lines + describe_tail(spec.description, spec.notes, spec.params_cls, "--loss-param KEY=VALUE"))


def describe_tail(description: str, notes: str, params_cls: type, usage: str) -> list[str]:
    """The lines every ``describe`` ends with (losses and modifiers alike): description, note, parameters."""
    lines = ["", f"  {text_of(description)}"] if description else []
    if notes:
        lines += [f"  Note: {text_of(notes)}"]
    infos = param_infos(params_cls)
    lines += ["", f"  parameters ({usage}):" if infos else "  parameters: none"]
    lines += [f"    {i.name} = {i.default!r}   [{i.range_text()}]  {text_of(i.doc)}" for i in infos]
    return lines


def parameter_table(params_cls: type) -> list[str]:
    """The Markdown table of a params class's parameters (default, valid range, meaning), or "No parameters."."""
    infos = param_infos(params_cls)
    if not infos:
        return ["No parameters."]
    return ["| parameter | default | valid | meaning |", "|---|---|---|---|",
            *[f"| `{i.name}` | `{i.default!r}` | {i.range_text()} | {i.doc} |" for i in infos]]


def notes_and_parameters(spec: LossSpec | ModifierSpec) -> list[str]:
    """A catalogue entry's note (when it has one) and its parameter table, in Markdown."""
    return ([f"**Note:** {spec.notes}", ""] if spec.notes else []) + parameter_table(spec.params_cls)
def formula_markdown(spec: LossSpec) -> list[str]:
    """The loss's formula for a docs page: ``formula_tex`` as display math (the LaTeX `prefzoo losses NAME` prints
    as text), or the plain-text ``formula`` as code when a plugin gives no LaTeX."""
    if spec.formula_tex:
        return ["**Loss:**", "", "$$", display_lines(f"L = {spec.formula_tex}"), "$$", ""]
    return [f"**Loss:** `L = {spec.formula}`", ""]


def paper_links(text: str) -> str:
    """A citation for a docs page: each ``arXiv:NNNN.NNNNN`` in it a link to the paper's abstract."""
    return re.sub(r"arXiv:(\d{4}\.\d{4,5})", r"[arXiv:\1](https://arxiv.org/abs/\1)", text)


DISPLAY_WIDTH = 70  # characters of LaTeX above which a formula's clauses (split at \quad) go on lines of their own


def display_lines(tex: str) -> str:
    """A long formula's clauses one below the other (``\\quad`` separates them in ``formula_tex``), so that it reads
    on a phone without scrolling sideways; a short one as it is."""
    parts = [p.strip() for p in re.split(r"\\quad(?![a-z])", tex) if p.strip()]
    if len(tex) <= DISPLAY_WIDTH or len(parts) < 2:
        return tex
    return r"\begin{gathered}" + r" \\ ".join(parts) + r"\end{gathered}"


NOTATION = (
    r"Notation: $\rho = \log\pi_\theta(y\mid x) - \log\pi_{\mathrm{ref}}(y\mid x)$; "
    r"$\Delta = \rho_w - \rho_l$ (or f-DPO's $f'_w - f'_l$); $s = \log\pi_\theta(y\mid x) + \hat{R}$ for MMPO; "
    r"$\lvert y\rvert$ is the completion length in tokens. Every loss returns per-example losses; the trainer "
    "takes the mean."
)


def catalogue_markdown(builtin_only: bool = True) -> str:
    """The loss catalogue, generated from the registry so that it cannot drift from the code."""
    reg = get_registry()
    specs = [reg.specs[n] for n in reg.names() if not builtin_only or source_of(reg.specs[n]) == "built-in"]
    out = [
        "# Loss catalogue",
        "",
        "<!-- Generated by `prefzoo losses --markdown`. -->",
        "",
        NOTATION + " Each loss's [atlas page](atlas/index.md) draws its gradient.",
        "",
        "| name | family | reference | needs | batch-coupled | paper |",
        "|---|---|---|---|---|---|",
    ]
    for s in specs:
        needs = ", ".join(sorted(n.value for n in s.needs)) or "-"
        out.append(
            f"| [`{s.name}`](#{s.name}) | {s.family} | {'yes' if s.needs_reference else 'no'} | {needs} | "
            f"{coupling(s)} | {paper_links(s.paper)} |"
        )
    out += _nll_section(specs)
    for s in specs:
        out += _entry(s, "atlas/")
    return "\n".join(out) + "\n"


def _entry(s: LossSpec, atlas: str) -> list[str]:
    """One loss's catalogue entry; ``atlas`` is the path from its page to the atlas folder."""
    out = ["", f"## {s.name}", "", s.description, "", *formula_markdown(s)]
    if s.builtin:
        out += [f"**Atlas:** [its gradient fingerprint]({atlas}{s.name}.md).", ""]
    out += [f"**Scores** (reward accuracy): {s.scores}", ""]
    if s.shapes != {Shape.PAIR}:
        out += [f"**Takes:** {takes(s)}", ""]
    out += notes_and_parameters(s)
    return [*out, "", f"Source: {paper_links(s.paper)}. Registered by `{s.plugin}`."]


def catalogue_page(spec: LossSpec) -> str:
    """The site page (a path under docs/) that holds ``spec``'s catalogue entry: ``losses/FAMILY.md``, FAMILY its
    group in the atlas's overview."""
    return f"losses/{re.sub(r'[^a-z0-9]+', '-', group_of(spec).lower()).strip('-')}.md"


def catalogue_pages(builtin_only: bool = True) -> dict[str, str]:
    """The loss catalogue as the site's pages, {path under docs/: Markdown}: ``losses.md`` (notation, one table of
    every loss, the families) and one page per family (``losses/FAMILY.md``) with its losses' entries."""
    reg = get_registry()
    specs = [reg.specs[n] for n in reg.names() if not builtin_only or source_of(reg.specs[n]) == "built-in"]
    page = {s.name: catalogue_page(s) for s in specs}
    gen = "<!-- Generated by `prefzoo losses --markdown-dir docs`; a test fails if it drifts. -->"
    out = ["# Loss catalogue", "", gen, "", NOTATION + " Each loss's [atlas page](atlas/index.md) draws its gradient.",
           "", "One page per family of losses:", ""]  # fmt: skip
    groups = [g for g in GROUPS if any(group_of(s) == g for s in specs)]
    for g in groups:
        names = ", ".join(f"`{s.name}`" for s in specs if group_of(s) == g)
        out.append(f"- [{g}]({page[next(s.name for s in specs if group_of(s) == g)]}): {names}")
    out += ["", "| name | family | reference | needs | batch-coupled | paper |", "|---|---|---|---|---|---|"]
    for s in specs:
        needs = ", ".join(sorted(n.value for n in s.needs)) or "-"
        out.append(f"| [`{s.name}`]({page[s.name]}#{s.name}) | {s.family} | {'yes' if s.needs_reference else 'no'} "
                   f"| {needs} | {coupling(s)} | {paper_links(s.paper)} |")  # fmt: skip
    out += _nll_section(specs, page)
    pages = {"losses.md": "\n".join(out) + "\n"}
    for g in groups:
        members = [s for s in specs if group_of(s) == g]
        text = ["# Loss catalogue: " + g, "", gen, "", _sentence(GROUPS[g]), "",
                NOTATION.replace("](atlas/", "](../atlas/"), "", "[All losses](../losses.md) ·"
                " [their gradients in the atlas](../atlas/index.md)."]  # fmt: skip
        for s in members:
            text += _entry(s, "../atlas/")
        pages[page[members[0].name]] = "\n".join(text) + "\n"
    return pages


def _sentence(text: str) -> str:
    """The first sentence of a description, capitalised: a family page's introduction."""
    first = text.split(". ")[0].rstrip(".")
    return f"{first[:1].upper()}{first[1:]}."


def _nll_section(specs: list[LossSpec], page: dict[str, str] | None = None) -> list[str]:
    """Which losses take ``nll_reduction``, with their defaults: prefzoo's convention against TRL's, stated once.
    ``page``: where each entry is (its site page), for links from the catalogue's index; else a link on this page."""
    rows = [(s.name, i.default) for s in specs for i in param_infos(s.params_cls) if i.name == "nll_reduction"]
    if not rows:
        return []
    from prefzoo.losses._common import NLL_NOTE

    where = page or {}
    listed = ", ".join(f"[`{n}`]({where.get(n, '')}#{n}) (default `{d!r}`)" for n, d in rows)
    intro = f"Losses with an NLL term on the chosen response take `nll_reduction`: {listed}."
    return ["", "## NLL reduction", "", intro, "", f"{NLL_NOTE} A loss whose default differs says why in its notes."]


def write_catalogue_pages(docs: Path) -> None:
    """:func:`catalogue_pages` into the folder ``docs``; family pages no longer generated are removed."""
    (docs / "losses").mkdir(parents=True, exist_ok=True)
    pages = catalogue_pages()
    for stale in sorted((docs / "losses").glob("*.md")):
        if f"losses/{stale.name}" not in pages:
            stale.unlink()
    for rel, text in pages.items():
        (docs / rel).write_text(text, encoding="utf-8")
    print(f"wrote {len(pages)} catalogue pages under {docs}")


def run(args: argparse.Namespace) -> int:
    if args.features:
        from prefzoo.cli.features import feature_table_markdown

        print(feature_table_markdown())
    elif args.markdown:
        print(catalogue_markdown(), end="")
    elif args.markdown_dir:
        write_catalogue_pages(Path(args.markdown_dir))
    else:
        print(describe(loss_spec(args.name)) if args.name else list_table())
    return 0
