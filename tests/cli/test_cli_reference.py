"""docs/cli.md is generated from the CLI's parsers (scripts/cli_reference.py): it names every command and option."""

from __future__ import annotations

import importlib.util
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _script(name: str):
    """scripts/NAME.py loaded as a module (the scripts are not a package)."""
    spec = importlib.util.spec_from_file_location(name, ROOT / "scripts" / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _reference():
    return _script("cli_reference")


def test_cli_reference_is_generated_from_the_parsers():
    text = _reference().markdown()
    assert (ROOT / "docs" / "cli.md").read_text(encoding="utf-8") == text, (
        "docs/cli.md is stale: python scripts/cli_reference.py > docs/cli.md")
    for command in ("train", "eval", "losses", "inspect", "atlas", "check"):
        assert f"## prefzoo {command}\n" in text
    assert "| `--loss` `LOSS` |" in text and "| `--loss-param` `KEY=VALUE` |" in text


def test_cli_reference_keeps_asterisks_and_names_both_output_dirs():
    """A weighted sum reads as typed on the site (``*`` escaped outside code spans), and --output-dir names the
    default task's own folders (`prefzoo train --loss mmpo` writes runs/prefzoo-default/mmpo, not runs/prefzoo)."""
    mod = _reference()
    text = mod.markdown()
    assert "0.8\\*dpo + 0.2\\*sft" in text
    assert mod._cell("a `0.8*dpo` b*c") == "a `0.8*dpo` b\\*c"
    row = next(line for line in text.splitlines() if line.startswith("| `--output-dir`"))
    assert "'runs/prefzoo-default/<loss>' for the embedded default task" in row, row


def _config_reference():
    return _script("config_reference")


def test_configuration_reference_is_generated_from_the_sections():
    """docs/configuration.md lists every TrainConfig key, section by section, with its type, default, meaning and
    TRL's name: generated, so it cannot drift."""
    import dataclasses

    from prefzoo.train.config import SECTIONS, TrainConfig

    text = _config_reference().markdown()
    assert (ROOT / "docs" / "configuration.md").read_text(encoding="utf-8") == text, (
        "docs/configuration.md is stale: python scripts/config_reference.py > docs/configuration.md")
    keys = [f.name for s in SECTIONS.values() for f in dataclasses.fields(s)]
    assert {f.name for f in dataclasses.fields(TrainConfig)} == set(keys)
    missing = [k for k in keys if f"| `{k}` |" not in text]
    assert not missing, f"keys missing from the configuration reference: {missing}"
    assert "| `lr` |" in text and "`learning_rate`" in text.split("| `lr` |", 1)[1].split("\n", 1)[0]
