"""`prefzoo modifiers`, `inspect --modifier` and the one-line errors of `train --modifier`, as a user runs them."""

from __future__ import annotations

from pathlib import Path

import pytest

import prefzoo
from prefzoo.cli.main import main
from prefzoo.cli.modifiers import catalogue_markdown


def test_modifiers_lists_every_modifier(capsys):
    assert main(["modifiers"]) == 0
    out = capsys.readouterr().out
    for name in ("wpo", "ld-dpo", "beta-dpo", "alphapo", "odpo", "tr-dpo"):
        assert name in out
    assert set(prefzoo.list_modifiers()) >= {"wpo", "ld-dpo", "beta-dpo", "alphapo", "odpo", "tr-dpo"}


def test_modifiers_shows_one_with_its_compatible_losses(capsys):
    assert main(["modifiers", "odpo"]) == 0
    out = capsys.readouterr().out
    assert (
        "reward-difference losses with β" in out
        and "dpo" in out
        and "simpo" not in out.split("registered losses:")[1].split("\n")[0]
    )


def test_docs_modifiers_md_is_generated():
    committed = (Path(__file__).resolve().parents[2] / "docs" / "modifiers.md").read_text(encoding="utf-8")
    assert committed == catalogue_markdown(), (
        "docs/modifiers.md is stale: run `prefzoo modifiers --markdown > docs/modifiers.md`"
    )


def _table(capsys, argv):
    assert main(argv) == 0
    out = capsys.readouterr().out
    return [line for line in out.splitlines() if line.startswith(("-", "+")) and line[1:2].isdigit()]


def test_inspect_modifier_changes_the_fingerprint(capsys):
    plain = _table(capsys, ["inspect", "dpo", "--points", "5"])
    modified = _table(capsys, ["inspect", "dpo", "--modifier", "ld-dpo:alpha=0.5", "--points", "5"])
    assert len(plain) == len(modified) == 5
    assert plain != modified  # |y_l| = 15 > |y_w| = 10: LD-DPO weighs y_l's last 5 tokens by α


@pytest.mark.parametrize(("argv", "names"), [
    (["--loss", "dpo", "--modifier", "tr-dpo", "--precompute-ref"], ("tr-dpo", "--precompute-ref")),
    (["--loss", "dpo", "--modifier", "tr-dpo", "--lora"], ("tr-dpo", "--lora")),
    (["--loss", "simpo", "--modifier", "odpo"], ("odpo", "simpo", "reward-difference losses with β")),
    (["--loss", "sft", "--modifier", "beta-dpo"], ("beta-dpo", "sft", "with β")),
    (["--loss", "dpo", "--modifier", "ld-dpo", "--precompute-ref"], ("ld-dpo", "--precompute-ref")),
    (["--loss", "dpo", "--modifier", "wpo", "--modifier", "wpo"], ("wpo", "twice")),
    (["--loss", "dpo", "--modifier", "ld-dpo:alpha=2"], ("ld-dpo", "alpha")),
])  # fmt: skip
def test_incompatible_combinations_are_one_line_errors_before_loading(capsys, argv, names):
    # no --model: a model load would be the default task's; the error must come first (exit 2, one line)
    assert main(["train", *argv, "--max-steps", "1"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and all(n in err[0] for n in names), err


def test_yaml_modifiers_and_flags_add_up(tmp_path, capsys):
    pytest.importorskip("yaml")  # the train extra (the unit env has none)
    run = tmp_path / "run.yaml"
    run.write_text("loss: dpo\nmodifiers:\n  - {modifier: ld-dpo, alpha: 0.5}\n")
    assert main(["train", "--config", str(run), "--modifier", "ld-dpo:alpha=0.3"]) == 2
    err = capsys.readouterr().err  # the YAML's ld-dpo and the flag's both reached the loss: one modifier, twice
    assert "'ld-dpo' is given twice" in err
