"""A run builds its loss once: the CLI builds it while it reads its flags and hands the same object to train(),
setup and the resume check; the modifiers are checked against the run's settings once.

Counted in process on the embedded default task (one step), fresh and resumed, by wrapping the registry's
``get_loss`` (every loss build goes through it) and the modifier check.
"""

from __future__ import annotations

import pytest

import prefzoo.registry
import prefzoo.train.setup.preflight
from prefzoo.cli.main import main


@pytest.fixture()
def counted(monkeypatch: pytest.MonkeyPatch) -> dict[str, int]:
    calls = {"get_loss": 0, "check_modifiers": 0}
    build, check = prefzoo.registry.get_loss, prefzoo.train.setup.preflight.check_modifiers

    def get_loss(*args, **kwargs):
        calls["get_loss"] += 1
        return build(*args, **kwargs)

    def check_modifiers(*args, **kwargs):
        calls["check_modifiers"] += 1
        return check(*args, **kwargs)

    monkeypatch.setattr(prefzoo.registry, "get_loss", get_loss)
    monkeypatch.setattr(prefzoo.train.setup.preflight, "check_modifiers", check_modifiers)
    return calls


@pytest.mark.slow  # two default-task runs of one and two steps (about 20 s on a loaded 2-core machine)
def test_one_loss_build_per_run_fresh_and_resumed(tmp_path, counted) -> None:
    out = tmp_path / "default"
    argv = ["train", "--output-dir", str(out), "--save-steps", "1", "--no-progress", "--modifier", "wpo"]
    assert main([*argv, "--max-steps", "1"]) == 0
    assert counted == {"get_loss": 1, "check_modifiers": 1}
    assert (out / "checkpoints" / "step-00000001").is_dir()
    counted.update(get_loss=0, check_modifiers=0)
    assert main([*argv, "--max-steps", "2", "--resume", "auto"]) == 0  # the resume check compares the built loss
    assert counted == {"get_loss": 1, "check_modifiers": 1}
