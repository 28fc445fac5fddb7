"""`prefzoo check NAME`: a table and exit 0 for a sound loss, exit 1 with the failing property for a broken one."""

from __future__ import annotations

import pytest

import prefzoo
from prefzoo.cli.main import main
from tests.properties.mutants import mutant_registry


def test_check_passes_for_a_builtin(capsys):
    assert main(["check", "dpo", "--max-examples", "5"]) == 0
    out = capsys.readouterr().out
    assert "conformance of loss 'dpo'" in out and "PASSED" in out and "sharded-gather" in out
    rows = [line.split()[1] for line in out.splitlines()[3:] if line.split()[1:2] in (["PASSED"], ["N/A"])]
    tally = f"PASSED: {rows.count('PASSED')} passed, {rows.count('N/A')} not applicable"  # counted apart
    assert rows.count("N/A") > 0 and tally in out.splitlines(), out


def test_check_fails_for_a_broken_loss(capsys):
    prefzoo.reset_registry(mutant_registry())
    try:
        rc = main(["check", "mutant-nan-on-tie", "--max-examples", "50", "--max-batch", "8"])
    finally:
        prefzoo.reset_registry()
    out = capsys.readouterr().out
    assert rc == 1
    assert "FAILED" in out and "finite" in out and "falsifying example" in out and "not finite" in out


def test_check_unknown_loss_and_bad_flags(capsys):
    assert main(["check", "dpoo"]) == 2
    assert "did you mean 'dpo'" in capsys.readouterr().err
    assert main(["check", "dpo", "--dtypes", "float8"]) == 2
    assert "--dtypes" in capsys.readouterr().err
    assert main(["check", "dpo", "--property", "nope"]) == 2
    assert main(["check", "dpo", "--max-examples", "0"]) == 2


def test_check_json(capsys):
    import json

    assert main(["check", "sft", "--max-examples", "3", "--property", "finite", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data[0]["loss"] == "sft" and data[0]["results"][0]["status"] == "passed"


@pytest.mark.skipif("cal-dpo" not in prefzoo.list_losses(), reason="plugins/prefzoo-caldpo is not installed")
def test_check_example_plugin(capsys):
    assert main(["check", "cal-dpo", "--max-examples", "10"]) == 0
    assert "plugin caldpo" in capsys.readouterr().out
