"""`prefzoo new-loss`: the package it writes, its loss against the conformance kit and its own reference, and the
one-line refusals.  Installing the package, its own tests, `prefzoo check` and training with it: tox env newloss."""

from __future__ import annotations

import dataclasses
import importlib
import re
import subprocess
import sys
from pathlib import Path

import pytest
import tomllib
import torch

import prefzoo
from prefzoo.testing import check_loss

TREE = [".github/workflows/ci.yml", ".gitignore", "README.md", "pyproject.toml", "src/prefzoo_my_loss/__init__.py",
        "src/prefzoo_my_loss/plugin.py", "tests/test_my_loss.py", "tox.ini"]


def _cli(*args, cwd=None):
    return subprocess.run([sys.executable, "-m", "prefzoo", "new-loss", *args], capture_output=True, text=True,
                          cwd=cwd, timeout=120)


@pytest.fixture(scope="module")
def package(tmp_path_factory):
    root = tmp_path_factory.mktemp("gen") / "plugin"
    root.mkdir()  # an empty folder is filled
    out = _cli("My_Loss", str(root))
    assert out.returncode == 0, out.stderr
    assert f"pip install -e {root}" in out.stdout and "prefzoo check my-loss" in out.stdout
    return root


@pytest.fixture(scope="module")
def modules(package):
    sys.path[:0] = [str(package / "src"), str(package / "tests")]
    try:
        yield importlib.import_module("prefzoo_my_loss.plugin"), importlib.import_module("test_my_loss")
    finally:
        sys.path[:] = [p for p in sys.path if p not in (str(package / "src"), str(package / "tests"))]
        for name in ("prefzoo_my_loss", "prefzoo_my_loss.plugin", "test_my_loss"):
            sys.modules.pop(name, None)


def test_the_file_tree_and_no_placeholder_left(package):
    files = sorted(p.relative_to(package).as_posix() for p in package.rglob("*") if p.is_file())
    assert files == TREE
    for rel in files:
        text = (package / rel).read_text(encoding="utf-8")
        assert "$name" not in text and "$ident" not in text and "${" not in text.replace("${{", ""), rel


def test_pyproject_declares_the_entry_point(package):
    meta = tomllib.loads((package / "pyproject.toml").read_text(encoding="utf-8"))
    assert meta["project"]["name"] == "prefzoo-my-loss" and "prefzoo" in meta["project"]["dependencies"]
    assert meta["project"]["entry-points"]["prefzoo"] == {"my_loss": "prefzoo_my_loss.plugin"}


def test_the_loss_passes_the_kit_with_its_reference(modules):
    plugin, tests = modules
    (spec,) = plugin.prefzoo_register_losses()
    assert spec.name == "my-loss" and spec.params_cls.__name__ == "MyLossParams"
    report = check_loss(spec, max_examples=15, dtypes=("float64", "float32"), reference=tests.reference,
                        derandomize=True)
    report.raise_if_failed()
    assert [r.name for r in report.results if r.status == "passed"][-1] == "reference"


def test_its_reference_catches_a_wrong_formula(modules):
    """The reference is a transcription of its own: the loss with β applied twice fails it, and only it."""
    plugin, tests = modules
    (spec,) = plugin.prefzoo_register_losses()
    wrong = dataclasses.replace(spec, fn=lambda b, p, ctx: spec.fn(b, dataclasses.replace(p, beta=2 * p.beta), ctx))
    report = check_loss(wrong, max_examples=15, dtypes=("float64", "float32"), reference=tests.reference,
                        derandomize=True)
    assert [r.name for r in report.failures()] == ["reference"]
    assert report.table().splitlines()[-1] == "FAILED: 9 passed, 1 failed, 21 not applicable"


def test_the_plugin_guide_shows_the_files_it_writes():
    """docs/plugin-guide.md shows each generated file under its path for `prefzoo new-loss my-loss`: the same text."""
    from prefzoo.cli.new_loss import names
    from prefzoo.cli.new_loss_files import render

    guide = (Path(__file__).resolve().parents[2] / "docs" / "plugin-guide.md").read_text(encoding="utf-8")
    files = render(names("my-loss"))
    shown = re.findall(r"^### `([^`]+)`\n.*?^```[a-z]*\n(.*?)^```$", guide, re.S | re.M)
    assert [path for path, _ in shown] == ["pyproject.toml", "src/prefzoo_my_loss/plugin.py", "tests/test_my_loss.py",
                                           "tox.ini", ".github/workflows/ci.yml"]
    for path, text in shown:
        assert text == files[path], f"docs/plugin-guide.md shows an old {path}: regenerate it from new_loss_files.py"
    tree = re.search(r"^prefzoo-my-loss/\n(.*?)^```$", guide, re.S | re.M).group(1)
    for path in files:
        assert path.rsplit("/", 1)[-1] in tree, path


def test_the_reference_by_hand(modules):
    _, tests = modules
    b = prefzoo.PreferenceBatch(*(torch.tensor(v, dtype=torch.float64) for v in ([0.0, 3.0], [0.0, 1.0],
                                                                                 [0.0, 0.0], [0.0, 0.0])))
    p = type("P", (), {"beta": 0.5})()  # z = 0 and 0.5·2 = 1: log 2, log(1 + e^−1)
    assert tests.reference(b, p).tolist() == pytest.approx([0.6931471805599453, 0.31326168751822286], abs=1e-15)


@pytest.mark.parametrize(("args", "message"), [
    (["a b!"], "NAME 'a b!' is not a loss name"),
    (["class"], "NAME 'class' is a Python keyword"),
    (["dpo"], "NAME 'dpo' is already a registered loss (plugin prefzoo.losses.dpo)"),
    (["fine", "full"], "DIR full exists and is not an empty folder"),
    (["fine", "afile"], "DIR afile exists and is not an empty folder"),
    (["fine", "link"], "DIR link is a symbolic link"),
    (["fine", "afile/sub"], "DIR afile/sub: cannot write afile/sub: Not a directory"),
])  # fmt: skip
def test_refusals_are_one_line_and_write_nothing(tmp_path, args, message):
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "keep.txt").write_text("mine")
    (tmp_path / "afile").write_text("x")
    (tmp_path / "empty").mkdir()
    (tmp_path / "link").symlink_to(tmp_path / "empty")
    before = sorted(p.name for p in tmp_path.rglob("*"))
    out = _cli(*args, cwd=tmp_path)
    assert out.returncode == 2 and out.stdout == ""
    assert out.stderr.startswith(f"prefzoo new-loss: error: {message}") and out.stderr.count("\n") == 1, out.stderr
    assert sorted(p.name for p in tmp_path.rglob("*")) == before


def test_the_default_folder_is_named_after_the_loss():
    from prefzoo.cli.new_loss import names, target_dir

    values = names(" Two_words ")
    assert values["name"] == "two-words" and values["params"] == "TwoWordsParams"
    assert target_dir(None, values) == Path("prefzoo-two-words")


def _installed_from(monkeypatch, direct_url: dict | None) -> None:
    """Make prefzoo's distribution report ``direct_url`` as pip's direct_url.json (None: installed from an index)."""
    import json
    from importlib import metadata

    class Dist:
        def read_text(self, name):
            return json.dumps(direct_url) if direct_url is not None and name == "direct_url.json" else None

    monkeypatch.setattr(metadata, "distribution", lambda name: Dist())


def _clone_with_origin(tmp_path: Path, origin: str | None) -> Path:
    repo = tmp_path / "clone"
    subprocess.run(["git", "init", "-q", str(repo)], check=True)
    if origin is not None:
        subprocess.run(["git", "-C", str(repo), "remote", "add", "origin", origin], check=True)
    return repo


@pytest.mark.parametrize(
    ("origin", "requirement"),
    [
        ("https://github.com/acme/prefzoo.git", "prefzoo[testing] @ git+https://github.com/acme/prefzoo.git"),
        ("git@github.com:acme/prefzoo.git", "prefzoo[testing] @ git+ssh://git@github.com/acme/prefzoo.git"),
        ("/srv/mirrors/prefzoo", "prefzoo[testing]"),  # a path a CI runner cannot reach: the index
        (None, "prefzoo[testing]"),  # a clone without a remote
    ],
)
def test_the_generated_ci_installs_prefzoo_from_the_clone_it_came_from(monkeypatch, tmp_path, origin, requirement):
    from prefzoo.cli.new_loss import prefzoo_requirement

    repo = _clone_with_origin(tmp_path, origin)
    _installed_from(monkeypatch, {"url": repo.as_uri(), "dir_info": {"editable": True}})
    assert prefzoo_requirement() == requirement


def test_a_vcs_install_and_an_index_install(monkeypatch):
    from prefzoo.cli.new_loss import prefzoo_requirement

    _installed_from(monkeypatch, {"url": "https://github.com/acme/prefzoo", "vcs_info": {"vcs": "git"}})
    assert prefzoo_requirement() == "prefzoo[testing] @ git+https://github.com/acme/prefzoo"
    _installed_from(monkeypatch, None)
    assert prefzoo_requirement() == "prefzoo[testing]"


def test_the_requirement_reaches_tox_ini_and_the_workflow():
    from prefzoo.cli.new_loss import names
    from prefzoo.cli.new_loss_files import render

    values = {**names("my-loss"), "requirement": "prefzoo[testing] @ git+https://github.com/acme/prefzoo.git"}
    files = render(values)
    assert "deps = {env:PREFZOO_REQUIREMENT:prefzoo[testing] @ git+https://github.com/acme/prefzoo.git}" in files[
        "tox.ini"]
    assert 'PREFZOO_REQUIREMENT: "prefzoo[testing] @ git+https://github.com/acme/prefzoo.git"' in files[
        ".github/workflows/ci.yml"]
