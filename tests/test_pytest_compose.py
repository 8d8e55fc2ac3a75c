"""shardfuzz tests compose with the user's own pytest and Hypothesis set-up (issue 30): a user
profile and ``@settings`` on ``test_for``, Hypothesis' statistics with shardfuzz's own, readable
failures, ``run_case`` from the user's own ``@given``, filtered ``regressions()``, pytest-xdist.

One pytester run under ``-n 2`` covers the end-to-end path (tiny toy target, a few examples); the
rest are in-process checks that start no ranks."""

import gc
import json
import os
import re
import shutil
import warnings

import pytest
from hypothesis import HealthCheck, settings

from shardfuzz.engine.settings import (
    SETTING_NAMES,
    build_settings,
    compose_settings,
    profile_for,
    register_profiles,
)
from shardfuzz.errors import InvalidArgument, Mismatch
from shardfuzz.frontends.pytest_compose import select_failure_files
from shardfuzz.report.tracebacks import hide_for_findings

pytest_plugins = ["pytester"]

TOY = os.path.join(os.path.dirname(__file__), "data", "toy_target.py")


@pytest.fixture(scope="module")
def profiles():
    register_profiles()
    settings.register_profile("i30-nightly", max_examples=300, suppress_health_check=[HealthCheck.too_slow])
    return settings.get_profile


def test_ci_profile_keeps_shardfuzz_ci_so_the_ci_suite_runs_what_it_ran(profiles):
    """``--hypothesis-profile=ci``: derandomized, no database, shardfuzz-ci's 30 examples; every
    setting that decides what runs (and so the ci suite's time) is shardfuzz-ci's, as before."""
    ours = profiles("shardfuzz-ci")
    composed = compose_settings(build_settings("shardfuzz-ci"), "shardfuzz-ci", active=profiles("ci"))
    assert composed.derandomize and composed.database is None and composed.max_examples == 30
    for name in set(SETTING_NAMES) - {"print_blob", "suppress_health_check"}:
        assert getattr(composed, name) == getattr(ours, name), name
    assert set(composed.suppress_health_check) == set(ours.suppress_health_check)
    assert composed.print_blob  # Hypothesis' ci profile asks for it: @reproduce_failure works on test_for


def test_profile_names_that_hypothesis_derives_keep_their_shardfuzz_profile():
    assert profile_for("ci-with-verbose-verbosity") == "shardfuzz-ci"
    assert profile_for("fuzz-with-debug-verbosity-with-explain-phase") == "shardfuzz-fuzz"
    assert profile_for("nightly") == "shardfuzz-dev"
    assert profile_for("default") == "shardfuzz-dev"  # no --hypothesis-profile, no $CI


def test_layers_user_profile_then_options_then_settings_then_arguments(profiles):
    nightly = profiles("i30-nightly")
    dev = build_settings("shardfuzz-dev")
    s = compose_settings(dev, "shardfuzz-dev", active=nightly)
    assert s.max_examples == 300 and s.deadline is None  # the user's profile beats shardfuzz-dev's 100
    assert set(s.suppress_health_check) >= {HealthCheck.data_too_large, HealthCheck.too_slow}  # union
    s = compose_settings(build_settings("shardfuzz-dev", max_examples=9), "shardfuzz-dev", active=nightly)
    assert s.max_examples == 9  # --shardfuzz-max-examples beats the profile
    applied = settings(nightly, max_examples=20)
    s = compose_settings(
        build_settings("shardfuzz-dev", max_examples=9), "shardfuzz-dev", active=nightly, applied=applied
    )
    assert s.max_examples == 20  # the test's own @settings beats the options
    s = compose_settings(dev, "shardfuzz-dev", active=nightly, applied=applied, max_examples=4)
    assert s.max_examples == 4  # test_for(max_examples=) beats everything
    s = compose_settings(dev, "shardfuzz-dev", active=nightly, applied=settings(nightly, derandomize=True))
    assert s.derandomize and s.database is None and s.max_examples == 300
    with pytest.raises(InvalidArgument, match=r"@settings\(deadline=.*--shardfuzz-timeout"):
        compose_settings(dev, "shardfuzz-dev", active=nightly, applied=settings(nightly, deadline=500))


def test_engine_frames_are_hidden_for_findings_only():
    class Info:
        def __init__(self, value):
            self.value = value

    finding = Mismatch("report")
    assert hide_for_findings(Info(finding))
    group = ExceptionGroup  # noqa: F821 (a builtin since 3.11; ruff targets 3.10)
    assert hide_for_findings(Info(group("two", [finding, Mismatch("other")])))
    assert not hide_for_findings(Info(group("mixed", [finding, ValueError("x")])))
    assert not hide_for_findings(Info(AttributeError("a bug of ours keeps its frames")))
    assert not hide_for_findings(None)


def _record(tmp_path, name, **fields):
    rec = {"format": "shardfuzz-failure", "target": "toy", "impl": "wrong_rank1", "kind": "mismatch"}
    (tmp_path / f"{name}.json").write_text(json.dumps(dict(rec, **fields)))
    return str(tmp_path / f"{name}.json")


def test_regression_filters_and_planted_bug_files(tmp_path):
    files = [
        _record(tmp_path, "a"),
        _record(tmp_path, "b", kind="hang", impl="hang_rank0"),
        _record(tmp_path, "c", target="other", planted=False),
        _record(tmp_path, "d", planted=True),
    ]
    (tmp_path / "broken.json").write_text("{not json")
    files.append(str(tmp_path / "broken.json"))
    # a security review: these stopped the whole session at collection (unhashable list, recursion)
    (tmp_path / "deep.json").write_text("[" * 200_000)
    files += [str(tmp_path / "deep.json"), _record(tmp_path, "listed", target=[])]
    stem = lambda paths: sorted(
        n for n in (os.path.basename(p)[:-5] for p in paths) if n not in ("deep", "listed")
    )
    for planted in (False, True):  # kept, whatever the filters: their tests say why they cannot load
        assert {"deep", "listed"} <= {
            os.path.basename(p)[:-5] for p in select_failure_files(files, target="x", planted=planted)
        }
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always", ResourceWarning)  # each file closed (a user's -W default saw one)
        kept = select_failure_files(files)
        gc.collect()
    assert not [w for w in seen if issubclass(w.category, ResourceWarning)], [str(w.message) for w in seen]
    assert stem(kept) == ["a", "b", "broken", "c"]  # planted left out, broken kept
    assert stem(select_failure_files(files, planted=True)) == ["a", "b", "broken", "c", "d"]
    assert stem(select_failure_files(files, kind="hang")) == ["b", "broken"]
    assert stem(select_failure_files(files, target=["other"], impl="wrong_rank1")) == ["broken", "c"]
    with pytest.raises(
        InvalidArgument, match=r"regressions\(kind='hung'\): 'hung' is not one; allowed: mismatch"
    ):
        select_failure_files(files, kind="hung")
    with pytest.raises(InvalidArgument, match=r"regressions\(target=3\); must be a name or a list of names"):
        select_failure_files(files, target=3)
    with pytest.raises(InvalidArgument, match=r"regressions\(planted='yes'\); must be True or False"):
        select_failure_files(files, planted="yes")


def test_regressions_collects_only_the_files_its_filters_keep(pytester, tmp_path):
    _record(tmp_path, "mine")
    _record(tmp_path, "hung", kind="hang", impl="hang_rank0")
    _record(tmp_path, "planted", planted=True)
    pytester.makepyfile(
        test_reg=f"import shardfuzz\n"
        f"test_all = shardfuzz.regressions({str(tmp_path)!r})\n"
        f"test_hangs = shardfuzz.regressions({str(tmp_path)!r}, kind='hang')\n"
        f"test_planted = shardfuzz.regressions({str(tmp_path)!r}, impl='wrong_rank1', planted=True)\n"
    )
    result = pytester.runpytest_inprocess("--collect-only", "-q")
    ids = sorted(line.split("::")[1] for line in result.outlines if "::" in line)
    assert ids == [
        "test_all[hung]", "test_all[mine]", "test_hangs[hung]", "test_planted[mine]", "test_planted[planted]",
    ]  # fmt: skip


def test_regressions_finds_a_relative_folder_from_any_start_folder_and_says_why_when_none(
    pytester, monkeypatch
):
    """The docs' CI recipe ``regressions("tests/failures")`` read the folder against the current
    one: started from ``tests/`` it silently collected nothing ("got empty parameter set")."""
    pytester.makepyprojecttoml("[project]\nname = 'user-project'\n")  # pytest's rootdir: the project's
    tests = pytester.path / "tests"
    (tests / "failures").mkdir(parents=True)
    _record(tests / "failures", "mine")
    (tests / "planted").mkdir()
    _record(tests / "planted", "deliberate", planted=True)
    (tests / "test_reg.py").write_text(
        "import shardfuzz\n"
        "test_kept = shardfuzz.regressions('tests/failures')\n"
        "test_hangs = shardfuzz.regressions('tests/failures', kind='hang')\n"
        "test_typo = shardfuzz.regressions('tests/failure')\n"
        "test_planted_only = shardfuzz.regressions('tests/planted')\n"
    )
    for start in (pytester.path, tests):
        monkeypatch.chdir(start)
        result = pytester.runpytest_inprocess(str(tests / "test_reg.py"), "-rs", "-k", "not test_kept")
        result.assert_outcomes(skipped=3)
        result.stdout.fnmatch_lines(
            [
                f"*shardfuzz.regressions(): none of the 1 failure file(s) in {tests / 'failures'} is selected",
                f"*shardfuzz.regressions(): no folder {tests / 'tests' / 'failure'} or {tests / 'failure'}",
                # the one filter a user did not write is named (a new user's only file was a planted bug's)
                f"*none of the 1 failure file(s) in {tests / 'planted'} is selected (1 of them a planted bug's: "
                "regressions(..., planted=True) replays those)",
            ]
        )
        collected = pytester.runpytest_inprocess(str(tests / "test_reg.py"), "--collect-only", "-q")
        assert any("test_kept[mine]" in line for line in collected.outlines), collected.outlines


def test_new_options_are_checked_and_echoed(pytester):
    pytester.makepyfile(test_nothing="def test_nothing():\n    pass\n")
    result = pytester.runpytest_inprocess("--shardfuzz-max-examples=0")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result = pytester.runpytest_inprocess("--shardfuzz-backend=nccl", "--shardfuzz-device=cpu")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result = pytester.runpytest_inprocess("--shardfuzz-profile=shardfuzz-fuzz", "--shardfuzz-max-examples=5")
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines(
        [
            "shardfuzz: profile shardfuzz-fuzz; reproduce with: pytest *--shardfuzz-profile=shardfuzz-fuzz*--shardfuzz-max-examples=5*"
        ]
    )


CONFTEST = """
from hypothesis import settings
settings.register_profile("nightly", max_examples=6, derandomize=True)
"""

TESTS = f"""
import shardfuzz
from hypothesis import given, settings

# the user's profile (6 examples) for this one; @settings (3) for the next; failing, explicit 4
test_profile = shardfuzz.test_for({TOY!r}, world_sizes=(1,))
test_settings = settings(max_examples=3)(shardfuzz.test_for({TOY!r}, world_sizes=(1,)))
test_bug = shardfuzz.test_for({TOY!r}, "wrong_rank1", world_sizes=(2,), max_examples=4)
"""

OWN_GIVEN = """
import os
import shardfuzz
from hypothesis import given, settings

TOY = shardfuzz.get_target(os.path.join(os.path.dirname(__file__), "toy_target.py"))

@settings(max_examples=2, database=None, deadline=None)  # the first example starts a pool
@given(case=TOY.strategy(world_sizes=(1,)))
def test_own(case):  # "toy_target.py" is next to this file, not in the current folder
    assert shardfuzz.run_case("toy_target.py", case) <= 1.0
"""


def _sections(text: str) -> dict[str, str]:
    """The statistics section of each test, by test name."""
    stats = text.split("Hypothesis Statistics", 1)[1]
    parts = re.split(r"^\S*::(test_\w+):$", stats, flags=re.M)
    return dict(zip(parts[1::2], parts[2::2]))


def test_under_xdist_with_a_user_profile_settings_statistics_and_readable_failures(pytester, tmp_path):
    pytest.importorskip("xdist", reason="pytest-xdist, a dev dependency (pip install -e '.[dev]'), runs it")
    failures = tmp_path / "failures"
    pytester.makeconftest(CONFTEST)
    pytester.makepyfile(test_user=TESTS)
    sub = pytester.mkdir("sub")
    shutil.copy(TOY, sub / "toy_target.py")
    (sub / "test_own.py").write_text(OWN_GIVEN)
    result = pytester.runpytest_subprocess(
        "-p", "no:cacheprovider", "--import-mode=importlib", "-n", "2", "--hypothesis-profile=nightly",
        "--hypothesis-show-statistics", f"--shardfuzz-failures-dir={failures}",
        "--shardfuzz-tolerance=totl=rtol:1", timeout=300,
    )  # fmt: skip
    text = "\n".join(result.outlines)
    result.assert_outcomes(passed=3, failed=1)
    # a tolerance for no output of the targets the workers tested: the controller says so, on a
    # line of its own (under xdist it was silent: the workers held the targets)
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stdout.re_match_lines(
        [r"^shardfuzz: error: --shardfuzz-tolerance names output 'totl', which target 'toy'"]
    )
    assert "2 workers [4 items]" in text
    result.stdout.fnmatch_lines(
        ["shardfuzz: profile shardfuzz-dev; *; from profile 'nightly': *max_examples=6*"]
    )
    # a failing test shows the finding first: within the first 10 lines of its section
    failing = text.split("_ test_bug _", 1)[1].splitlines()
    assert any("1 of 4 outputs mismatch the oracle" in line for line in failing[:10]), failing[:12]
    # statistics: Hypothesis' own, then shardfuzz's, per test; the example counts show the layers
    sections = _sections(text)
    assert re.search(
        r"shardfuzz toy/reference/gloo \(world sizes 1[^)]*\): 6 examples \(6 passed",
        sections["test_profile"],
    )
    # Hypothesis counts the draws past the budget as passing test cases: they say so, and the
    # covering rows before its run (its statistics are of one run) are counted by shardfuzz's line
    assert "drawn, not run: past this run's share of the budget" in sections["test_profile"]
    assert re.search(
        r"run as \d+ covering rows?, then 1 Hypothesis run \(Hypothesis' statistics above are of the last run",
        sections["test_profile"],
    ), sections["test_profile"]
    assert re.search(
        r"shardfuzz toy/reference/gloo \(world sizes 1[^)]*\): 3 examples \(3 passed",
        sections["test_settings"],
    )
    assert "Stopped because" in sections["test_settings"]  # Hypothesis' part of the section
    assert re.search(
        r"closest pass: error/tolerance (\S+ \(measured[^)]*; the passes not measured passed a stricter "
        r"check, the bound without the noise term(, at up to \S+)?\)"
        r"|0 \(every compared element equal\)|\S+) "
        r"at Case\(target='toy'",
        sections["test_settings"],
    )
    # on 2 ranks only: the header says so; 3+ ranks, which no world of 2 forms, are not listed as
    # a blind spot (test_for(world_sizes=(2, 3)) listed "never reached: 2-D mesh")
    line = re.search(r"trigger conditions reached: group<world[^\n]*", sections["test_bug"])
    assert line is not None and "world>=3" not in line.group(0), sections["test_bug"]
    assert re.search(
        r"shardfuzz toy/wrong_rank1/gloo \(world sizes 2[^)]*\): \d+ examples \(\d+ passed, [1-9]",
        sections["test_bug"],
    )
    # a minimum over the shrink's failing examples too: a new user read 1.16 beside a report's 8.2e5x
    assert re.search(
        r"smallest failing margin: error/tolerance \S+ \(of every failing example, the shrink's included",
        sections["test_bug"],
    ), sections["test_bug"]
    # run_case in the test's own @given: the run's restrictions shaped none of its cases, so the
    # header does not claim them (a new user's said "world sizes 2; dtypes float64" above bf16 cases
    # on 3 ranks), and the target's pool is not what drew them: no "never reached"
    assert re.search(
        r"shardfuzz toy/reference/gloo \(cases drawn by the test's own strategy\): 2 examples",
        sections["test_own"],
    ), sections["test_own"]
    assert "never reached" not in sections["test_own"], sections["test_own"]
    # the failure file names the test and the xdist worker that wrote it
    (path,) = failures.glob("toy-wrong_rank1-gloo-mismatch.json")
    record = json.loads(path.read_text())
    assert record["origin"]["pytest_test"] == "test_user.py::test_bug"
    assert record["origin"]["xdist_worker"] in ("gw0", "gw1") and record["planted"] is False
