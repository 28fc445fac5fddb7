"""pytest plugin (entry point ``pytest11``): prefzoo's Hypothesis profiles, registered only when a session asks.

Profiles: ``prefzoo-dev`` (fast), ``prefzoo-ci`` (Hypothesis' built-in ``ci`` profile, derandomized, more
examples), ``prefzoo-thorough`` (>= 1000 examples per property) and ``prefzoo-mutation`` (10 derandomized
examples: the suite runs once per mutant, docs/properties.md).  All four have no deadline (a loss on
64 pairs under a loaded 2-core machine is slow but not wrong); ``prefzoo-ci`` and ``prefzoo-thorough`` print
the reproduction blob of a failure.  Select one with ``--hypothesis-profile prefzoo-ci``.

Every pytest session of an environment with prefzoo installed loads this module, so it imports nothing but
pytest: not torch, not Hypothesis, not the rest of :mod:`prefzoo.testing`.  Hypothesis is imported and the
profiles registered only when ``--hypothesis-profile`` names one of them; any other session (a project that
merely has prefzoo installed, with or without Hypothesis) keeps its own settings and its own ``ci`` profile.
prefzoo's own test suite selects a profile in ``tests/conftest.py`` (``HYPOTHESIS_PROFILE=dev|ci|thorough|mutation``,
default ``dev``).
"""

from __future__ import annotations

import pytest

PROFILES = ("prefzoo-dev", "prefzoo-ci", "prefzoo-thorough", "prefzoo-mutation")


def register_profiles(prefix: str = "prefzoo-") -> None:
    """Register ``{prefix}dev``, ``ci``, ``thorough`` and ``mutation`` (prefixed); a no-op without Hypothesis."""
    try:
        from hypothesis import HealthCheck, settings
    except ImportError:  # hypothesis is an optional extra; without it there is nothing to register
        return
    quiet = [HealthCheck.too_slow, HealthCheck.data_too_large]
    builtin_ci = settings.get_profile("ci")
    settings.register_profile(f"{prefix}dev", max_examples=30, deadline=None, suppress_health_check=quiet)
    settings.register_profile(
        f"{prefix}ci", builtin_ci, max_examples=100, print_blob=True, deadline=None, suppress_health_check=quiet
    )
    settings.register_profile(
        f"{prefix}thorough", max_examples=1000, print_blob=True, deadline=None, suppress_health_check=quiet
    )
    # mutation testing runs the suite once per mutant: few examples, a fixed seed (same verdict each run), no database
    settings.register_profile(
        f"{prefix}mutation", max_examples=10, derandomize=True, database=None, deadline=None,
        suppress_health_check=quiet,
    )


@pytest.hookimpl(tryfirst=True)  # before Hypothesis' own plugin loads the profile the option names
def pytest_configure(config: pytest.Config) -> None:
    """Register the profiles when ``--hypothesis-profile`` names one of :data:`PROFILES`; otherwise do nothing."""
    if config.getoption("--hypothesis-profile", default=None) in PROFILES:  # None where Hypothesis is absent
        register_profiles()
