"""The ``prefzoo`` pytest plugin registers its Hypothesis profiles only when asked and never fails a foreign session."""

from __future__ import annotations

import importlib.metadata
import subprocess
import sys

import hypothesis._settings
import hypothesis.errors
import pytest

FOREIGN_TEST = '''
import pytest
from hypothesis import HealthCheck, errors, settings

def test_prefzoo_plugin_leaves_my_settings_alone(request):
    assert request.config.pluginmanager.get_plugin("prefzoo") is not None  # the plugin did load
    with pytest.raises(errors.InvalidArgument):
        settings.get_profile("prefzoo-thorough")  # and registered nothing: no session asked for a prefzoo profile
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


def test_a_foreign_session_that_asks_for_a_prefzoo_profile_gets_it(foreign_project, monkeypatch) -> None:
    """``--hypothesis-profile prefzoo-thorough`` (a plugin author's session) registers and loads prefzoo's profiles."""
    monkeypatch.delenv("HYPOTHESIS_PROFILE", raising=False)
    foreign_project.makepyfile(
        test_author="""
from hypothesis import settings

def test_profile():
    assert settings.get_current_profile_name() == "prefzoo-thorough"
    assert settings.default.max_examples == 1000 and settings.default.deadline is None
"""
    )
    result = foreign_project.runpytest_subprocess("-p", "no:cacheprovider", "--hypothesis-profile", "prefzoo-thorough")
    result.assert_outcomes(passed=1)


# A project's own pytest run in an environment without Hypothesis (prefzoo installed with only [train]): Hypothesis
# and its plugin cannot be imported, prefzoo's plugin loads through its entry point, and the session runs.
_NO_HYPOTHESIS_SESSION = """
import sys

class NotInstalled:  # a finder that makes importing Hypothesis fail, as where it is not installed
    def find_spec(self, name, path=None, target=None):
        if name == "hypothesis" or name.startswith(("hypothesis.", "_hypothesis")):
            raise ModuleNotFoundError(f"No module named {name!r}")

sys.meta_path.insert(0, NotInstalled())
import pytest
code = pytest.main(["-q", "-p", "no:cacheprovider", "-p", "no:hypothesispytest", "-p", "no:randomly", sys.argv[1]])
loaded = [m for m in ("torch", "transformers") if m in sys.modules]
print("heavy modules loaded:", loaded)
sys.exit(code)
"""


def test_a_foreign_session_without_hypothesis_runs(foreign_project, tmp_path) -> None:
    (tmp_path / "test_mine.py").write_text("def test_one():\n    assert 1 + 1 == 2\n")
    proc = subprocess.run(
        [sys.executable, "-c", _NO_HYPOTHESIS_SESSION, str(tmp_path)],
        cwd=tmp_path, capture_output=True, text=True, timeout=120,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "1 passed" in proc.stdout and "heavy modules loaded: []" in proc.stdout, proc.stdout


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
