"""--report-to: accelerate's trackers when installed, a one-line error naming the package when not (no fallback)."""

from __future__ import annotations

import importlib.util

import pytest

from prefzoo.cli.main import main
from prefzoo.train.config import ConfigError
from prefzoo.train.setup.trackers import TRACKERS, resolve_trackers

MISSING = [n for n, (module, _) in TRACKERS.items() if importlib.util.find_spec(module) is None]


def test_none_auto_and_lists():
    assert resolve_trackers("none") is None and resolve_trackers(None) is None
    has_tb = importlib.util.find_spec("tensorboard") is not None
    assert resolve_trackers("auto") == (["tensorboard"] if has_tb else None)
    with pytest.raises(ConfigError, match=r"not a tracker; choose none, auto or .*wandb"):
        resolve_trackers("tensorbord")
    installed = [n for n in TRACKERS if n not in MISSING]
    if installed:
        assert resolve_trackers(",".join(installed)) == installed


@pytest.mark.skipif(not MISSING, reason="every tracker is installed")
def test_an_asked_tracker_that_is_not_installed_is_a_one_line_error(capsys, tmp_path, tiny_dir, pairs_file):
    name = "wandb" if "wandb" in MISSING else MISSING[0]
    argv = ["train", "--model", str(tiny_dir), "--dataset", str(pairs_file), "--report-to", name]
    rc = main([*argv, "--output-dir", str(tmp_path), "--max-steps", "1"])
    err = capsys.readouterr().err
    assert rc == 2 and err.count("\n") == 1
    assert f"--report-to {name}: " in err and f"pip install {TRACKERS[name][1]}" in err
    assert not (tmp_path / "final").exists()  # it did not train and log elsewhere
