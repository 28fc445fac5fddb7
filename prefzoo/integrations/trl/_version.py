"""The TRL releases the adapters were proven on, checked when ``prefzoo.integrations.trl`` is imported."""

from __future__ import annotations

from prefzoo.errors import install_hint

__all__ = ["TRL_RANGE", "TRLVersionError", "check_trl_version"]

TRL_RANGE = ">=1.16,<1.17"  # the `trl` extra of pyproject.toml pins the same range (a test compares them)


class TRLVersionError(ImportError):
    """The installed TRL is outside :data:`TRL_RANGE`: its trainers' internals may differ."""


def check_trl_version(version: str) -> None:
    """Raise :class:`TRLVersionError` (one line naming the range) when TRL ``version`` is outside :data:`TRL_RANGE`."""
    from packaging.specifiers import SpecifierSet
    from packaging.version import InvalidVersion, Version

    try:
        ok = Version(version) in SpecifierSet(TRL_RANGE)
    except InvalidVersion:
        ok = False
    if not ok:
        raise TRLVersionError(
            f"prefzoo.integrations.trl supports trl{TRL_RANGE}, found trl {version}: "
            f"{install_hint('trl')} (or 'trl{TRL_RANGE}')"
        )
