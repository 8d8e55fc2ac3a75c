"""The pytest plugin, through pytester: in this process where a test proves options and outcomes
(the pools are warm: a fresh pytest process costs 8-12 CPU-s of start-up), in a subprocess where
it proves what only a process shows (Ctrl-C, the entry point loading the plugin in a fresh
interpreter: ``test_ctrl_c_after_a_finding_reports_it_and_fails_the_run``)."""

import os
import signal
import subprocess
import sys
import time

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
def run(inprocess):
    inprocess.makepyfile(test_user=TEST_FILE)

    def go(*args):
        return inprocess.runpytest_inprocess("-p", "no:cacheprovider", "--import-mode=importlib", *args)

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
    # where its failure file is (the CLI's summary says; pytest's output did not)
    lines = [x for x in result.outlines if "shardfuzz: failure file: " in x]
    paths = {x.split("shardfuzz: failure file: ", 1)[1].split(" (shardfuzz replay")[0] for x in lines}
    (path,) = paths
    assert path.endswith("row_mean-mean_of_means-gloo-mismatch.json") and os.path.exists(path), lines


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
    result = run("--shardfuzz-tolerance=out=rtol:abc")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(
        [
            "*--shardfuzz-tolerance 'out=rtol:abc': rtol value 'abc' is not a number; expected OUTPUT=rtol:X,atol:Y*"
        ]
    )
    result = run("--shardfuzz-dtypes=float32,fp8")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*--shardfuzz-dtypes 'float32,fp8': 'fp8' is not a dtype*"])


def test_dtypes_and_tolerance_options_are_applied_and_echoed(run):
    """bf16 only with an absurdly tight fixed tolerance: the correct reference "fails"."""
    result = run(
        "--hypothesis-profile=ci", "--shardfuzz-dtypes=bfloat16", "--shardfuzz-tolerance=mean=atol:0", "-k", "reference"
    )  # fmt: skip
    result.stdout.fnmatch_lines(
        ["*--shardfuzz-dtypes=bfloat16 --shardfuzz-tolerance=mean=rtol:0.0,atol:0.0*"]
    )
    result.assert_outcomes(failed=1, deselected=2)
    result.stdout.fnmatch_lines(["*dtype='bfloat16'*", "*mismatched elements*"])


def test_a_tolerance_for_no_output_of_the_targets_tested_is_a_usage_error(run):
    result = run(
        "--hypothesis-profile=ci", "--shardfuzz-dtypes=float64", "--shardfuzz-tolerance=mean=rtol:1,atol:1",
        "--shardfuzz-tolerance=maen=rtol:1", "-k", "reference",
    )  # fmt: skip
    result.assert_outcomes(passed=1, deselected=2)  # the loose 'mean' tolerance applied
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stdout.fnmatch_lines(
        [
            "shardfuzz: error: --shardfuzz-tolerance names output 'maen', which target 'row_mean' does not have*"
        ]
    )  # on a line of its own (it followed the progress line's "[100%]")


def test_an_exclusion_that_excluded_nothing_for_a_misspelt_key_is_a_warning(run):
    # the CLI's summary says so; pytest said nothing (a new user's sizes['innr'])
    result = run("--hypothesis-profile=ci", "--shardfuzz-exclude=sizes['rowz'] > 100", "-k", "reference")
    result.assert_outcomes(passed=1, deselected=2, warnings=1)
    text = result.stdout.str()
    assert "shardfuzz row_mean/reference/gloo: exclude \"sizes['rowz'] > 100\" excluded nothing: " in text, (
        text
    )
    assert "had no 'rowz' (a misspelling?)" in text, text


def test_an_unregistered_hypothesis_profile_is_a_usage_error_that_says_what_to_use(run):
    # Hypothesis registers only "default" and "ci": "fuzz" was Hypothesis' INTERNALERROR
    result = run("--hypothesis-profile=fuzz")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(
        [
            "*--hypothesis-profile='fuzz' is not a registered Hypothesis profile*a long run is --shardfuzz-profile=shardfuzz-fuzz"
        ]
    )
    result = run("--hypothesis-profile=shardfuzz-ci", "-k", "reference")  # ours, registered first
    result.stdout.fnmatch_lines(["shardfuzz: profile shardfuzz-ci; *"])
    result.assert_outcomes(passed=1, deselected=2)


def test_the_header_reproduces_a_hypothesis_seed(run):
    """--hypothesis-seed=5 changed the run but was left out of the header's "reproduce with"."""
    result = run("--hypothesis-seed=5", "-k", "reference")
    result.stdout.fnmatch_lines(["shardfuzz: profile *; reproduce with: pytest *--hypothesis-seed=5*"])


def test_help_lists_the_option_group(run):
    result = run("--help")
    result.stdout.fnmatch_lines(["shardfuzz: differential fuzzing of sharded code:", "*--shardfuzz-backend*"])


def test_dev_profile_is_the_fallback(run):
    # Hypothesis' "default" profile: what a run without --hypothesis-profile and without $CI loads
    # (in this process the outer run's profile is loaded, so it is named)
    result = run("--hypothesis-profile=default", "-k", "reference")
    result.stdout.fnmatch_lines(
        ["shardfuzz: profile shardfuzz-dev; reproduce with: pytest --shardfuzz-backend=gloo"]
    )
    result.assert_outcomes(passed=1, deselected=2)


TOY = os.path.join(os.path.dirname(__file__), "data", "toy_target.py")


def test_an_expected_failure_is_an_xfail_only_while_its_finding_is_the_recorded_one(inprocess):
    """An implementation a target records as an expected failure is a strict xfail; a finding of
    another kind is a failure (a new user's known mismatch became a rank error, and the suite stayed
    green behind the xfail); under --runxfail the finding itself fails the test (it said "but
    passed")."""
    inprocess.makepyfile(
        known=f"""
import shardfuzz
from shardfuzz.spec.registry import get_target

TOY = get_target({TOY + "::TOY"!r})
MISMATCH = shardfuzz.Expect(kind="mismatch", world_size=2, mesh=(2,))
AS_RECORDED = TOY.derive(
    "toy_known", expected_failures=[shardfuzz.ExpectedFailure("wrong_rank1", "rank 1 is off", MISMATCH, p95=5)]
)
ANOTHER_BUG = TOY.derive(
    "toy_crash_known", expected_failures=[shardfuzz.ExpectedFailure("crash_rank1", "rank 1 is off", MISMATCH, p95=5)]
)
""",
        test_known="""
import shardfuzz
test_as_recorded = shardfuzz.test_for("known.py::AS_RECORDED", "wrong_rank1", world_sizes=(1, 2), max_examples=10)
test_another_bug = shardfuzz.test_for("known.py::ANOTHER_BUG", "crash_rank1", world_sizes=(1, 2), max_examples=10)
""",
    )
    failures = str(inprocess.path / "failures")  # this test's own: the session's holds other tests' files
    args = (
        "-p", "no:cacheprovider", "--import-mode=importlib", "--hypothesis-profile=ci", "-rA",
        f"--shardfuzz-failures-dir={failures}", "test_known.py",
    )  # fmt: skip
    result = inprocess.runpytest_inprocess(*args)
    result.assert_outcomes(xfailed=1, failed=1)
    # one at a time: the second is whole in the failure's section, and in the short summary after
    # the first only where pytest does not cut summary lines ($CI set)
    result.stdout.fnmatch_lines(["*XFAIL*test_as_recorded*expected failure: rank 1 is off*"])
    result.stdout.fnmatch_lines(
        [
            "*toy_crash_known/crash_rank1/gloo is listed as an expected failure (rank 1 is off), but this "
            "finding is another: a 'rank-error' finding, where the record expects 'mismatch'*",
        ]
    )
    result = inprocess.runpytest_inprocess(*args, "--runxfail", "-k", "as_recorded")
    result.assert_outcomes(failed=1)
    assert "but passed" not in result.stdout.str() and "Mismatch" in result.stdout.str()
    # the failure files those runs wrote, replayed by the docs' one-line regressions(): known
    # failures that still fail are xfails (the suite went red on its second run); trust_refs: the
    # toy implementations live in this repository's tests/data, outside the pytester project
    inprocess.makepyfile(
        test_regress=f"import shardfuzz\ntest_regressions = shardfuzz.regressions({failures!r}, trust_refs=True)\n"
    )
    result = inprocess.runpytest_inprocess(
        "-p", "no:cacheprovider", "--import-mode=importlib", "-rA", "test_regress.py"
    )
    # the crash's file fails: it is a rank error where the record expects a mismatch
    result.assert_outcomes(xfailed=1, failed=1)
    result.stdout.fnmatch_lines(
        ["*XFAIL*toy_known-wrong_rank1-gloo-mismatch*expected failure (rank 1 is off)*"]
    )
    result.stdout.fnmatch_lines(
        [
            "*toy_crash_known-crash_rank1-gloo-rank-error.json is a file of an expected failure (rank 1 "
            "is off), but it now fails as a 'rank-error' finding, where the record expects 'mismatch'*",
        ]
    )


def test_a_test_judges_an_implementation_lossy_by_design_at_its_precision(inprocess):
    """``test_for(precision=)``: a sum sent as bfloat16 whatever the case dtype (as DDP's
    bf16_compress_hook sends float32 gradients) passes at bfloat16's rounding; without it, found."""
    compressed = os.path.join(os.path.dirname(__file__), "data", "compressed_target.py") + "::TARGET"
    inprocess.makepyfile(
        test_lossy=f"""
import shardfuzz
test_strict = shardfuzz.test_for({compressed!r}, max_examples=10)
test_lossy = shardfuzz.test_for({compressed!r}, max_examples=10, precision="bfloat16")
# a test's own per-output tolerance, as the CLI's --tolerance (a loose one: passes); a misspelt one fails
test_fixed = shardfuzz.test_for({compressed!r}, max_examples=10, tolerance={{"total": {{"rtol": 0.1, "atol": 1.0}}}})
test_typo = shardfuzz.test_for({compressed!r}, max_examples=10, tolerance={{"totl": (0.1, 1.0)}})
"""
    )
    result = inprocess.runpytest_inprocess(
        "-p", "no:cacheprovider", "--import-mode=importlib", "--hypothesis-profile=ci"
    )
    result.assert_outcomes(passed=2, failed=2)
    result.stdout.fnmatch_lines(["*tolerance names output 'totl'*"])
    assert (
        "test_strict FAILED" in result.stdout.str()
        or "FAILED test_lossy.py::test_strict" in result.stdout.str()
    )


def test_a_test_sets_its_own_dtypes_and_known_failures(inprocess, monkeypatch):
    """``test_for(dtypes=, exclude=)``: per test, beside the session's options (a new user fuzzing
    torch past a known crash had to exclude it for every test of the session)."""
    inprocess.makepyfile(
        test_own=f"""
import shardfuzz
# wrong on rank 1: found unless the cases with a rank 1 are set aside
test_found = shardfuzz.test_for({TOY!r}, "wrong_rank1", world_sizes=(1, 2), dtypes="float64", max_examples=10)
test_known = shardfuzz.test_for({TOY!r}, "wrong_rank1", world_sizes=(1, 2), exclude="world_size == 2", max_examples=10)
"""
    )
    result = inprocess.runpytest_inprocess(
        "-p", "no:cacheprovider", "--import-mode=importlib", "--hypothesis-profile=ci"
    )
    result.assert_outcomes(passed=1, failed=1)
    result.stdout.fnmatch_lines(["*test_found*", "*dtype='float64'*"])
    assert "test_known FAILED" not in result.stdout.str()
    inprocess.makepyfile(
        test_bad=f"import shardfuzz\ntest_bad = shardfuzz.test_for({TOY!r}, exclude='open(1)')\n"
    )
    result = inprocess.runpytest_inprocess("-p", "no:cacheprovider", "--import-mode=importlib", "test_bad.py")
    result.stdout.fnmatch_lines(["*exclude*open(1)*"])  # at collection, naming the argument
    assert result.ret == pytest.ExitCode.INTERRUPTED  # a collection error
    # every argument (world_sizes=[0, 2] failed only when its test ran, a new user's audit)
    for arg, shown in (
        ("world_sizes=[0, 2]", "*world_sizes=*0, 2*"),
        ("timeout=-1", "*timeout=-1*"),
        ("max_examples=0", "*max_examples=0*"),
        ("precision='bf16'", "*precision='bf16'*"),
        ("tolerance={'y': (1, -1)}", "*tolerance*atol=-1*"),
    ):
        inprocess.makepyfile(test_bad=f"import shardfuzz\ntest_bad = shardfuzz.test_for({TOY!r}, {arg})\n")
        result = inprocess.runpytest_inprocess(
            "-p", "no:cacheprovider", "--import-mode=importlib", "test_bad.py"
        )
        result.stdout.fnmatch_lines(["*ERROR collecting*", shown])
        assert result.ret == pytest.ExitCode.INTERRUPTED, arg
    # a target file that is not there fails the collection; an implementation name that the target
    # does not have fails the test, with its message and no shardfuzz frames (a new user's typos
    # failed at run time behind 76 lines of them)
    inprocess.makepyfile(test_bad="import shardfuzz\ntest_bad = shardfuzz.test_for('nope_target.py')\n")
    result = inprocess.runpytest_inprocess("-p", "no:cacheprovider", "--import-mode=importlib", "test_bad.py")
    result.stdout.fnmatch_lines(["*ERROR collecting*", "*test_for(target='nope_target.py'): no file*"])
    inprocess.makepyfile(test_bad=f"import shardfuzz\ntest_bad = shardfuzz.test_for({TOY!r}, 'nosuch')\n")
    result = inprocess.runpytest_inprocess("-p", "no:cacheprovider", "--import-mode=importlib", "test_bad.py")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["*impl='nosuch' is not an implementation of target 'toy'; known: *"])
    assert "registry.py" not in result.stdout.str() and "target.py:" not in result.stdout.str()
    assert "During handling of the above exception" not in result.stdout.str()  # said once, not twice
    inprocess.makepyfile(  # an @example that is not a Case: named, not 'str' has no attribute 'world_size'
        test_bad=f"import shardfuzz\nfrom hypothesis import example\n"
        f"test_bad = example(case='Case(target=1)')(shardfuzz.test_for({TOY!r}))\n"
    )
    result = inprocess.runpytest_inprocess("-p", "no:cacheprovider", "--import-mode=importlib", "test_bad.py")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["*@example(case='Case(target=1)') on a shardfuzz test: give one case=*"])
    inprocess.makepyfile(test_bad="import shardfuzz\ntest_bad = shardfuzz.test_for(42)\n")  # at collection
    result = inprocess.runpytest_inprocess("-p", "no:cacheprovider", "--import-mode=importlib", "test_bad.py")
    result.stdout.fnmatch_lines(
        ["*ERROR collecting*", "*test_for(target=42); expected a Target, a target name*"]
    )
    # a test's own exclusion is meant for its target: a key it does not have fails the test
    inprocess.makepyfile(
        test_bad=f"import shardfuzz\ntest_bad = shardfuzz.test_for({TOY!r}, exclude=\"sizes['m'] > 0\")\n"
    )
    result = inprocess.runpytest_inprocess("-p", "no:cacheprovider", "--import-mode=importlib", "test_bad.py")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(
        ["*exclude=*reads sizes*, which no case of target 'toy' has (a misspelling?)*"]
    )
    assert "Traceback" not in result.stdout.str() and "config.py" not in result.stdout.str()
    # a world size above this machine's limit is the test's to meet when it runs: the file still
    # collects, and its other tests run (a suite written for a larger machine)
    inprocess.makepyfile(
        test_big=f"import shardfuzz\ntest_big = shardfuzz.test_for({TOY!r}, world_sizes=(2, 9))\n"
        "def test_other():\n    pass\n"
    )
    monkeypatch.setenv("SHARDFUZZ_MAX_WORLD", "8")
    result = inprocess.runpytest_inprocess("-p", "no:cacheprovider", "--import-mode=importlib", "test_big.py")
    result.assert_outcomes(passed=1, failed=1)
    result.stdout.fnmatch_lines(["*world_sizes=9 is above the largest world size allowed here, 8*"])
    # its message alone, not shardfuzz's frames (limits.py, config.py, dataclasses.replace)
    assert "Traceback" not in result.stdout.str() and "limits.py" not in result.stdout.str(), (
        result.stdout.str()
    )


@pytest.mark.skipif(sys.platform != "linux", reason="reads /proc to find leftover processes")
@pytest.mark.timing
def test_ctrl_c_after_a_finding_reports_it_and_fails_the_run(pytester, procs, slack):
    failures = pytester.path / "failures"
    pytester.makepyfile(
        test_hang=f"import shardfuzz\ntest_hang = shardfuzz.test_for({TOY!r}, 'hang_rank0', timeout=1)\n"
    )
    proc = pytester.popen(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "--import-mode=importlib",
         "--hypothesis-profile=ci", f"--shardfuzz-failures-dir={failures}"],
        stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        end = time.monotonic() + 90 * slack
        while not list(failures.glob("*.json")):  # the first hang is found; Hypothesis goes on
            assert proc.poll() is None, proc.communicate(timeout=30)
            assert time.monotonic() < end, "no finding within 90 s"
            time.sleep(0.2)
        everything = procs.descendants(proc.pid)
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 1, out + err
    # a fresh interpreter: the plugin loads from its entry point, after Hypothesis' (its profile)
    header = "shardfuzz: profile shardfuzz-ci; reproduce with: pytest --hypothesis-profile=ci --shardfuzz-backend=gloo"
    assert header in out, out
    assert "shrinking was cut short" in out + err and "Rerun this case: shardfuzz case" in out + err
    assert procs.wait_gone(everything) == []


def test_a_budget_below_the_covering_rows_says_that_every_row_ran(inprocess):
    """test_for(max_examples=2) ran every covering row and one Hypothesis example, silently more
    than asked (a new user's pytest audit): the statistics say why."""
    inprocess.makepyfile(
        test_small=f"import shardfuzz\ntest_small = shardfuzz.test_for({TOY!r}, max_examples=2)\n"
    )
    result = inprocess.runpytest_inprocess(
        "-p", "no:cacheprovider", "--import-mode=importlib", "--hypothesis-profile=ci",
        "--hypothesis-show-statistics", "test_small.py",
    )  # fmt: skip
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines(
        ["*run as * covering rows, then 1 Hypothesis run*examples for a budget of 2: every covering row "
         "runs, then Hypothesis at least once*"]
    )  # fmt: skip


def test_a_deadline_on_a_shardfuzz_test_is_one_line_not_the_plugins_frames(inprocess):
    """@settings(deadline=500) on a test_for test is refused (shardfuzz times examples itself); a
    new user's refusal came after about 75 lines of the plugin's frames and locals."""
    inprocess.makepyfile(
        test_dl=(
            "import shardfuzz\nfrom hypothesis import settings\n"
            f"test_dl = settings(deadline=500)(shardfuzz.test_for({TOY!r}))\n"
        )
    )
    result = inprocess.runpytest_inprocess("-p", "no:cacheprovider", "--import-mode=importlib", "test_dl.py")
    result.assert_outcomes(failed=1)
    text = "\n".join(result.outlines)
    failures = text.split("short test summary info")[0]  # the summary line repeats it once more
    assert failures.count("@settings(deadline=timedelta(milliseconds=500)) on a shardfuzz test") == 1, text
    assert "During handling of the above exception" not in text, text  # it came twice so
    assert "pytest_compose.py" not in text and "compose_settings" not in text, text
