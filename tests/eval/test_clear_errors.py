"""`prefzoo eval` input errors are one line naming the fix (issue 16, "Clear errors")."""

from __future__ import annotations

import sys

from prefzoo.cli.main import main


def test_lm_eval_without_the_extra_names_it(monkeypatch, capsys, tmp_path):
    monkeypatch.setitem(sys.modules, "lm_eval", None)  # `import lm_eval` now fails as if it were not installed
    rc = main(["eval", "--lm-eval", "--model", str(tmp_path)])
    err = capsys.readouterr().err
    assert rc == 2 and err.count("\n") == 1
    assert "pip install 'prefzoo[eval]'" in err and "ModuleNotFoundError" not in err
