"""The pytest plugin, run in subprocesses through pytester."""

import os

import pytest

pytest_plugins = ["pytester"]

EXAMPLE = os.path.join(os.path.dirname(os.path.dirname(__file__)), "examples", "mean_target.py")

TEST_FILE = f"""
import shardfuzz
from hypothesis import given, settings, strategies as st

test_reference = shardfuzz.test_for({EXAMPLE!r})
test_bug = shardfuzz.test_for({EXAMPLE!r}, impl="mean_of_means")

@given(st.integers())
def test_other_hypothesis_tests_keep_their_profile(x):
    # the ci profile that Hypothesis ships, not shardfuzz-ci (which has max_examples=30)
    assert settings().max_examples == settings.get_profile("ci").max_examples
    assert settings().derandomize
"""


@pytest.fixture
def run(pytester):
    pytester.makepyfile(test_user=TEST_FILE)

    def go(*args):
        return pytester.runpytest_subprocess("-p", "no:cacheprovider", "--import-mode=importlib", *args)

    return go


def test_one_line_target_test_with_ci_profile(run):
    result = run("--hypothesis-profile=ci", "-v")
    result.stdout.fnmatch_lines(
        [
            "shardfuzz: profile shardfuzz-ci; reproduce with: pytest --hypothesis-profile=ci --shardfuzz-backend=gloo*"
        ]
    )
    result.assert_outcomes(passed=2, failed=1)
    result.stdout.fnmatch_lines(
        ["*test_bug*FAILED*", "*Rerun this case: shardfuzz case*--impl mean_of_means*"]
    )


def test_namespaced_options_are_applied_and_echoed(run):
    result = run(
        "--hypothesis-profile=ci", "--shardfuzz-world-sizes=1", "--shardfuzz-timeout=20", "-k", "bug"
    )
    result.stdout.fnmatch_lines(["*--shardfuzz-world-sizes=1 --shardfuzz-timeout=20*"])
    result.assert_outcomes(passed=1, deselected=2)  # one rank cannot show the bug


def test_bad_option_values_are_usage_errors(run):
    result = run("--shardfuzz-world-sizes=0,x")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*--shardfuzz-world-sizes='0,x'; expected comma-separated integers >= 1*"])
    result = run("--shardfuzz-backend=mpi")
    assert result.ret == pytest.ExitCode.USAGE_ERROR


def test_help_lists_the_option_group(run):
    result = run("--help")
    result.stdout.fnmatch_lines(["shardfuzz: differential fuzzing of sharded code:", "*--shardfuzz-backend*"])


def test_dev_profile_is_the_fallback(run, monkeypatch):
    monkeypatch.delenv("CI", raising=False)  # with CI set, Hypothesis loads its own "ci" profile
    result = run("-k", "reference")
    result.stdout.fnmatch_lines(
        ["shardfuzz: profile shardfuzz-dev; reproduce with: pytest --shardfuzz-backend=gloo"]
    )
    result.assert_outcomes(passed=1, deselected=2)
