"""The README's feature table: generated from the registries, and its prefzoo column true."""

from __future__ import annotations

import re
from dataclasses import dataclass, replace
from pathlib import Path

import prefzoo
from prefzoo.cli.features import feature_table_markdown, readme_block
from prefzoo.cli.main import main
from prefzoo.spec import LossParams, param

README = Path(__file__).resolve().parents[2] / "README.md"
_ROW = re.compile(r"^\| `(?P<name>[^`]+)` \| (?P<ours>[^|]+) \|", re.M)


def claimed(table: str) -> dict[str, set[str]]:
    """Per table (``loss``, ``modifier``): the names whose prefzoo cell says ✓."""
    out: dict[str, set[str]] = {}
    for part in table.split("\n\n"):
        head = re.match(r"^\| (\w+) \| prefzoo \|", part)
        if head:
            out[head[1]] = {m["name"] for m in _ROW.finditer(part) if m["ours"].strip().startswith("✓")}
    return out


def builtin_losses() -> set[str]:
    return {n for n in prefzoo.list_losses() if prefzoo.loss_spec(n).builtin}


def test_readme_table_is_generated():
    assert readme_block(README.read_text(encoding="utf-8")) == feature_table_markdown(), (
        "README.md's feature table is stale: paste `prefzoo losses --features` between its markers"
    )


def test_readme_prefzoo_column_is_true():
    """Every registered built-in loss has a ✓ row, and no ✓ row names a loss prefzoo does not register."""
    ours = claimed(readme_block(README.read_text(encoding="utf-8")))
    assert ours["loss"] == builtin_losses(), (
        f"missing from the table: {sorted(builtin_losses() - ours['loss'])}; "
        f"claimed but not registered: {sorted(ours['loss'] - builtin_losses())}"
    )


def test_claims_check_catches_a_false_or_missing_row():
    """The check above bites: a table claiming a loss prefzoo lacks, or dropping one it has, fails it."""
    table = feature_table_markdown()
    false = table.replace("| `kto-pair` | — |", "| `kto-pair` | ✓ |")
    dropped = "\n".join(line for line in table.splitlines() if not line.startswith("| `simper` |"))
    assert claimed(false)["loss"] - builtin_losses() == {"kto-pair"}
    assert builtin_losses() - claimed(dropped)["loss"] == {"simper"}


@dataclass(frozen=True, kw_only=True)
class _Params(LossParams):
    gain: float = param(1.0, "a test knob", gt=0.0)


class _FakeRegistry:
    """A registry-shaped object: names() and specs, as the modifier registry will be."""

    def __init__(self, specs):
        self.specs = {s.name: s for s in specs}

    def names(self):
        return sorted(self.specs)


def test_rows_come_from_registries_including_modifiers():
    """A new built-in loss gets a ✓ row with its parameters; a modifier registry's built-ins fill the modifier
    table, found by their registry and not by a list of names; plugins (builtin=False) are not claimed."""
    dpo = prefzoo.loss_spec("dpo")
    losses = _FakeRegistry([replace(dpo, name="new-loss", params_cls=_Params, builtin=True),
                            replace(dpo, name="a-plugin", builtin=False)])
    modifier = replace(dpo, name="wpo", params_cls=_Params, builtin=True)  # anything with name, params_cls, builtin
    table = feature_table_markdown(losses=losses, modifiers=[_FakeRegistry([modifier])])
    assert claimed(table) == {"loss": {"new-loss"}, "modifier": {"wpo"}}
    assert "| `new-loss` | ✓ (`gain`) | — |" in table and "| `wpo` | ✓ (`gain`) | `use_weighting` |" in table
    assert "`a-plugin`" not in table


def test_cli_prints_the_table(capsys):
    assert main(["losses", "--features"]) == 0
    assert capsys.readouterr().out.strip() == feature_table_markdown()
