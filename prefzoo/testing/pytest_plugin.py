"""pytest plugin (entry point ``pytest11``): registers prefzoo's Hypothesis profiles.

Profiles: ``dev`` (fast default), ``ci`` (Hypothesis' built-in ci profile,
derandomized, more examples), ``thorough`` (>= 1000 examples per property) and ``mutation`` (10 derandomized
examples: the suite runs once per mutant, docs/properties.md).
Select one with ``--hypothesis-profile NAME`` or ``HYPOTHESIS_PROFILE=NAME``; without either, ``dev``.
All three have no deadline (a loss on 64 pairs under a loaded 2-core machine is slow
but not wrong); ``ci`` and ``thorough`` print the reproduction blob of a failure.
"""

from __future__ import annotations

import os

try:
    from hypothesis import HealthCheck, settings
except ImportError:  # hypothesis is an optional extra; without it there is nothing to register
    settings = None  # type: ignore[assignment]


def register_profiles() -> None:
    if settings is None:
        return
    common = dict(deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
    settings.register_profile("dev", max_examples=30, **common)
    settings.register_profile("ci", parent=settings.get_profile("ci"), max_examples=100, print_blob=True, **common)
    settings.register_profile("thorough", max_examples=1000, print_blob=True, **common)
    # mutation testing runs the suite once per mutant: few examples, fixed seed (same verdict on every run), no database
    settings.register_profile("mutation", max_examples=10, derandomize=True, database=None, **common)


register_profiles()


def pytest_configure(config) -> None:
    if settings is None:
        return
    if config.getoption("hypothesis_profile", default=None):
        return  # --hypothesis-profile NAME wins
    settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE") or "dev")
