"""Errors any layer may raise about a user's settings (the CLI turns them into one line naming the key and the fix)."""

from __future__ import annotations

__all__ = ["ConfigError"]


class ConfigError(ValueError):
    """A training setting is unknown or out of range (the message names the key and the fix)."""
