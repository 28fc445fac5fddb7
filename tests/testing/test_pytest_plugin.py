"""The ``prefzoo`` pytest plugin registers its Hypothesis profiles and loads none in other projects' sessions."""

from __future__ import annotations

import importlib.metadata

import hypothesis._settings
import hypothesis.errors
import pytest

FOREIGN_TEST = '''
from hypothesis import HealthCheck, settings

def test_prefzoo_plugin_leaves_my_settings_alone(request):
    assert request.config.pluginmanager.get_plugin("prefzoo") is not None  # the plugin did load
    assert settings.get_profile("prefzoo-thorough").max_examples == 1000  # and registered its profiles
    assert settings.get_current_profile_name() == EXPECTED_PROFILE
    assert settings.default.max_examples == 100  # Hypothesis' default, not prefzoo's 30
    assert HealthCheck.data_too_large not in settings.default.suppress_health_check
'''


@pytest.fixture
def foreign_project(pytester: pytest.Pytester) -> pytest.Pytester:
    if not any(ep.name == "prefzoo" for ep in importlib.metadata.entry_points(group="pytest11")):
        pytest.skip("prefzoo is not installed, so its pytest11 entry point is not either")
    return pytester


@pytest.mark.parametrize(("ci", "profile"), [("", "default"), ("1", "ci")])
def test_a_foreign_session_keeps_hypothesis_defaults(foreign_project, monkeypatch, ci, profile) -> None:
    """A project with prefzoo installed runs under its own profile: Hypothesis' default, or its ci profile on CI."""
    # every variable by which Hypothesis detects CI (tox keeps CI as __TOX_ENVIRONMENT_VARIABLE_ORIGINAL_CI)
    ci_vars = set(getattr(hypothesis._settings, "_CI_VARS", {})) | {"CI", "__TOX_ENVIRONMENT_VARIABLE_ORIGINAL_CI"}
    for var in ("HYPOTHESIS_PROFILE", *sorted(ci_vars)):
        monkeypatch.delenv(var, raising=False)
    if ci:
        monkeypatch.setenv("CI", ci)
    foreign_project.makepyfile(test_foreign=f"EXPECTED_PROFILE = {profile!r}\n" + FOREIGN_TEST)
    result = foreign_project.runpytest_subprocess("-p", "no:cacheprovider")
    result.assert_outcomes(passed=1)


def test_prefzoo_own_tests_run_under_the_selected_profile() -> None:
    """tests/conftest.py loads HYPOTHESIS_PROFILE (tox: ci) or dev; the names tox and the docs use exist."""
    import os

    from hypothesis import settings

    expected = os.environ.get("HYPOTHESIS_PROFILE") or "dev"
    if settings.get_current_profile_name() != expected:  # --hypothesis-profile NAME was given: it wins
        pytest.skip(f"this session runs under --hypothesis-profile {settings.get_current_profile_name()}")
    assert {settings.get_profile(n).max_examples for n in ("dev", "ci", "thorough")} == {30, 100, 1000}
    assert settings.default.deadline is None


def test_without_hypothesis_registering_profiles_is_a_no_op(monkeypatch) -> None:
    import sys

    from prefzoo.testing.pytest_plugin import register_profiles

    monkeypatch.setitem(sys.modules, "hypothesis", None)  # importing it raises ImportError, as when not installed
    assert register_profiles(prefix="absent-") is None
    monkeypatch.undo()
    from hypothesis import settings

    with pytest.raises(hypothesis.errors.InvalidArgument):
        settings.get_profile("absent-dev")  # nothing was registered


def test_the_profiles_are_what_the_module_promises() -> None:
    """Each profile has the settings its docstring and docs/properties.md promise: dev 30 examples; ci Hypothesis'
    own ci profile (derandomized) with 100 and the reproduction blob; thorough 1000 with the blob; mutation 10,
    derandomized, no database; none has a deadline, and all let slow or large data through."""
    from hypothesis import HealthCheck, settings

    from prefzoo.testing.pytest_plugin import register_profiles

    previous = settings.get_current_profile_name()
    settings.load_profile("default")  # as at pytest's start, when the plugin registers them: nothing inherited
    try:
        register_profiles("probe-")
    finally:
        settings.load_profile(previous)
    got = {n: settings.get_profile(f"probe-{n}") for n in ("dev", "ci", "thorough", "mutation")}
    want = {  # max_examples, derandomize, print_blob, database is None
        "dev": (30, False, False, False),
        "ci": (100, True, True, settings.get_profile("ci").database is None),
        "thorough": (1000, False, True, False),
        "mutation": (10, True, False, True),
    }
    for name, s in got.items():
        assert (s.max_examples, s.derandomize, s.print_blob, s.database is None) == want[name], name
        assert s.deadline is None, name
        assert set(s.suppress_health_check) == {HealthCheck.too_slow, HealthCheck.data_too_large}, name
