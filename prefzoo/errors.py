"""Errors any layer may raise about a user's settings (the CLI turns them into one line naming the key and the fix)."""

from __future__ import annotations

__all__ = ["ConfigError", "install_hint"]


class ConfigError(ValueError):
    """A training setting is unknown or out of range (the message names the key and the fix)."""


def install_hint(extra: str) -> str:
    """The command that adds prefzoo's ``extra`` to the environment, for an error message: from a clone of the
    repository (an editable install, how the docs install prefzoo), or from a package index that has prefzoo."""
    return f"pip install -e \".[{extra}]\" from the prefzoo clone, or pip install 'prefzoo[{extra}]'"
