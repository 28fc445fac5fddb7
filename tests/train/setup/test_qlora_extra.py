"""bitsandbytes lives in the ``qlora`` extra (README command 1 installs ``[train]`` only): the two features that need
it say so in one line (issue 16, "The first minutes")."""

from __future__ import annotations

import sys

import pytest

from prefzoo.cli.main import main


@pytest.fixture
def no_bitsandbytes(monkeypatch):
    monkeypatch.setitem(sys.modules, "bitsandbytes", None)  # `import bitsandbytes` now fails as if not installed


FLAGS = [["--optim", "adamw8bit"], ["--lora", "--load-in-4bit"], ["--lora", "--load-in-8bit"]]


@pytest.mark.parametrize("flags", FLAGS)
def test_without_bitsandbytes_each_feature_names_the_qlora_extra(
    no_bitsandbytes, flags, tmp_path, tiny_dir, pairs_file, capsys
):
    cfg = ["--model", str(tiny_dir), "--dataset", str(pairs_file), "--output-dir", str(tmp_path), "--report-to",
           "none", "--max-steps", "1", "--no-progress", "--threads", "1", *flags]  # fmt: skip
    assert main(["train", *cfg]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1, err
    assert "needs bitsandbytes" in err or "need bitsandbytes" in err, err
    assert 'pip install -e ".[qlora]"' in err and "pip install 'prefzoo[qlora]'" in err and "Traceback" not in err, err
