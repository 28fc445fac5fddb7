"""docs/cli.md is generated from the CLI's parsers (scripts/cli_reference.py): it names every command and option."""

from __future__ import annotations

import importlib.util
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _reference():
    spec = importlib.util.spec_from_file_location("cli_reference", ROOT / "scripts" / "cli_reference.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_cli_reference_is_generated_from_the_parsers():
    text = _reference().markdown()
    assert (ROOT / "docs" / "cli.md").read_text(encoding="utf-8") == text, (
        "docs/cli.md is stale: python scripts/cli_reference.py > docs/cli.md")
    for command in ("train", "eval", "losses", "inspect", "atlas", "check"):
        assert f"## prefzoo {command}\n" in text
    assert "| `--loss` `LOSS` |" in text and "| `--loss-param` `KEY=VALUE` |" in text
