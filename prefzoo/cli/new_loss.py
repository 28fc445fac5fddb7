"""`prefzoo new-loss NAME [DIR]`: write a complete loss plugin package that installs, passes its tests and trains."""

from __future__ import annotations

import argparse
import keyword
import os
import re
from pathlib import Path

from prefzoo.cli.main import CLIError

INDEX_REQUIREMENT = "prefzoo[testing]"  # what the generated tox.ini and CI install when prefzoo's origin is unknown
_REMOTE = re.compile(r"(https://|ssh://)[^\s@'\"]+|git@[\w.-]+:[\w./-]+")  # a URL a CI runner can clone
_NAME = re.compile(r"[a-z][a-z0-9]*(?:-[a-z0-9]+)*")  # a loss name: lower-case words joined by '-'


def add_parser(sub: argparse._SubParsersAction) -> argparse.ArgumentParser:
    p = sub.add_parser(
        "new-loss",
        help="write a new loss plugin package (entry point, loss, LossSpec, conformance tests, tox, CI)",
        description="Write a complete prefzoo plugin package for a new loss into DIR: pyproject.toml with the "
        "entry point, the params dataclass, the loss function and its LossSpec, tests that run the conformance "
        "kit against an independent reference formula, a tox.ini with the property matrix (float64, float32, "
        "bfloat16) and a CI workflow. It installs (pip install -e DIR), is listed by `prefzoo losses`, passes "
        "`prefzoo check NAME` and its own tests, and trains, with no edit (docs/plugin-guide.md).",
    )
    p.add_argument("name", help="the loss name, used as --loss NAME: lower-case words joined by '-' ('My_Loss' "
                   "becomes 'my-loss')")
    p.add_argument("dir", nargs="?", help="the folder to create, new or empty (default: ./prefzoo-NAME)")
    return p


def names(raw: str) -> dict[str, str]:
    """The template values for a loss called ``raw`` (normalised: lower case, '_' and spaces become '-')."""
    name = re.sub(r"[\s_]+", "-", raw.strip().lower())
    if not _NAME.fullmatch(name):
        raise CLIError(f"NAME {raw!r} is not a loss name: use letters, digits and '-', starting with a letter "
                       "(e.g. my-loss)")
    ident = name.replace("-", "_")
    if keyword.iskeyword(ident):
        raise CLIError(f"NAME {raw!r} is a Python keyword; choose another name")
    return {
        "name": name,
        "ident": ident,
        "dist": f"prefzoo-{name}",
        "package": f"prefzoo_{ident}",
        "params": "".join(w.capitalize() for w in name.split("-")) + "Params",
        "requirement": INDEX_REQUIREMENT,
    }


def prefzoo_requirement() -> str:
    """Where the generated plugin's tox.ini and CI install prefzoo from: the git remote prefzoo was installed from.

    pip records a VCS install's URL (``direct_url.json``); an install from a clone (``pip install -e .``) is
    traced to the clone's ``origin`` remote. A remote a CI runner cannot reach (a local path) or none gives the
    index requirement; the files say how to change it (``PREFZOO_REQUIREMENT``).
    """
    import json
    import subprocess
    from importlib import metadata

    try:
        direct = json.loads(metadata.distribution("prefzoo").read_text("direct_url.json") or "{}")
    except (metadata.PackageNotFoundError, ValueError):
        return INDEX_REQUIREMENT
    url = str(direct.get("url", ""))
    if "vcs_info" in direct:
        remote = url
    elif url.startswith("file://"):
        try:
            got = subprocess.run(["git", "-C", url.removeprefix("file://"), "remote", "get-url", "origin"],
                                 capture_output=True, text=True, timeout=10)
        except (OSError, subprocess.SubprocessError):
            return INDEX_REQUIREMENT
        remote = got.stdout.strip() if got.returncode == 0 else ""
    else:
        remote = ""
    if not _REMOTE.fullmatch(remote):
        return INDEX_REQUIREMENT
    if remote.startswith("git@"):  # scp-like syntax: pip needs ssh://git@host/path
        remote = "ssh://" + remote.replace(":", "/", 1)
    return f"{INDEX_REQUIREMENT} @ git+{remote}"


def target_dir(raw: str | None, values: dict[str, str]) -> Path:
    """The folder to write: ``raw`` or ``./prefzoo-NAME``; refused when it is a symlink, a file or not empty."""
    path = Path(raw if raw else values["dist"])
    if path.is_symlink():
        raise CLIError(f"DIR {path} is a symbolic link; give a new folder")
    if path.exists() and (not path.is_dir() or any(path.iterdir())):
        raise CLIError(f"DIR {path} exists and is not an empty folder; give a new folder")
    return path


def write(root: Path, files: dict[str, str]) -> list[Path]:
    """Write each file under ``root`` (created), never replacing one that exists; returns the paths written."""
    root.mkdir(parents=True, exist_ok=True)
    written = []
    for rel, text in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0), 0o644)
        with os.fdopen(fd, "w", encoding="utf-8", newline="\n") as f:
            f.write(text)
        written.append(path)
    return written


def run(args: argparse.Namespace) -> int:
    from prefzoo.cli.new_loss_files import render

    values = names(args.name)
    root = target_dir(args.dir, values)
    values["requirement"] = prefzoo_requirement()
    from prefzoo.registry import list_losses, loss_spec

    if values["name"] in list_losses():  # the registry imports torch: after the checks that need nothing
        owner = loss_spec(values["name"]).plugin
        raise CLIError(f"NAME {values['name']!r} is already a registered loss (plugin {owner}); choose another name")
    try:
        written = write(root, render(values))
    except OSError as e:  # a file appeared since the check, or the folder cannot be written
        raise CLIError(f"DIR {root}: cannot write {e.filename}: {e.strerror}; give a new folder") from None
    print(f"prefzoo new-loss: wrote the plugin package {values['dist']} for the loss {values['name']!r} in {root}/")
    for path in sorted(written):
        print(f"  {path.relative_to(root).as_posix()}")
    if values["requirement"] != INDEX_REQUIREMENT:
        print(f"  (its tox.ini and CI install {values['requirement']}: where this prefzoo came from)")
    print(f"\nnext:\n  pip install -e {_quote(root)}\n  prefzoo losses {values['name']}\n"
          f"  prefzoo check {values['name']}\n  pytest {_quote(root / 'tests')}\n"
          f"  prefzoo train --loss {values['name']} --max-steps 2")
    return 0


def _quote(path: Path) -> str:
    """``path`` for a shell; a relative one starts with ./ (pip reads a bare word as a package name)."""
    import shlex

    return shlex.quote(str(path) if path.is_absolute() else f"./{path}")
