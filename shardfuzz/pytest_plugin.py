"""pytest plugin (entry point ``pytest11: shardfuzz``).

* registers the ``shardfuzz-ci``, ``shardfuzz-dev`` and ``shardfuzz-fuzz`` Hypothesis profiles and,
  after ``--hypothesis-profile`` is loaded, picks ``shardfuzz-<current profile>`` for shardfuzz tests
  only (other Hypothesis tests in the project keep their own settings);
* adds the namespaced options ``--shardfuzz-backend``, ``--shardfuzz-world-sizes``,
  ``--shardfuzz-timeout`` (``--timeout`` belongs to pytest-timeout), ``--shardfuzz-dtypes`` and
  ``--shardfuzz-tolerance`` (repeatable);
* prints a header line that says how to reproduce the run;
* :func:`test_for` turns a target into a test in one line.

Importing this module does not import torch; it loads inside tests.
"""

from __future__ import annotations

import dataclasses
import math
import os
import shlex
from typing import Any

import pytest

from shardfuzz import failures
from shardfuzz.config import (
    BACKENDS,
    RunConfig,
    check_tolerance_outputs,
    check_world_size,
    format_tolerance,
    parse_dtypes,
    parse_tolerance,
    parse_world_sizes,
)
from shardfuzz.errors import InvalidArgument
from shardfuzz.exclude import CaseExpression
from shardfuzz.failures import FailureRecorder, check_failures_dir, default_dir
from shardfuzz.refs import anchored_ref, caller_dir
from shardfuzz.replay import replay_one
from shardfuzz.runner import Runner
from shardfuzz.search import build_test, findings_of, run_test, settings_for
from shardfuzz.settings import current_profile_name, profile_for, register_profiles
from shardfuzz.shared_db import database_options
from shardfuzz.tolerance import OutputTolerance, Tolerance

HELP_BACKEND = (
    "torch.distributed backend for shardfuzz tests: gloo (CPU, default) or nccl (one GPU per rank)."
)
HELP_WORLD_SIZES = (
    "comma-separated world sizes that shardfuzz tests may draw, e.g. 1,2,3 (default: each target's own)."
)
HELP_TIMEOUT = (
    "fixed per-example timeout in seconds for shardfuzz tests (default: adaptive per target and world size)."
)
HELP_DTYPES = "comma-separated dtypes that shardfuzz tests may draw, e.g. float32,bfloat16 (default: each target's own)."
HELP_TOLERANCE = (
    "a fixed tolerance for one output of the targets tested, in place of the noise model, e.g. "
    "y=rtol:1e-3,atol:1e-5 (repeatable; the last for an output wins)."
)
HELP_DATABASE = (
    "a directory or a fleet's redis://HOST:PORT/N to keep examples in (default: $SHARDFUZZ_DATABASE)"
)
HELP_FAILURES_DIR = (
    "directory of failure files: shardfuzz tests write their findings there, and shardfuzz.regressions() "
    "replays them (default: $SHARDFUZZ_FAILURES_DIR or .shardfuzz/failures)."
)


@dataclasses.dataclass(frozen=True)
class Options:
    """The shardfuzz options of this pytest run (the ``shardfuzz_options`` fixture)."""

    backend: str = "gloo"
    world_sizes: tuple[int, ...] | None = None
    timeout: float | None = None
    profile: str = "shardfuzz-dev"
    hypothesis_profile: str | None = None
    failures_dir: str | None = None
    dtypes: tuple[str, ...] | None = None
    #: ``--shardfuzz-tolerance``: output name -> OutputTolerance, as sorted pairs
    tolerance: tuple[tuple[str, OutputTolerance], ...] = ()
    #: ``--shardfuzz-exclude``: case expressions of known failures to set aside
    exclude: tuple[str, ...] = ()
    #: ``--shardfuzz-database`` / ini ``shardfuzz_database``: a directory or a fleet's redis:// URL
    database: str | None = None
    fleet: str | None = None

    def config(self, **overrides: Any) -> RunConfig:
        """The run configuration of these options; ``overrides`` that are not None win."""
        cfg = RunConfig(
            backend=self.backend,
            world_sizes=self.world_sizes,
            timeout=self.timeout,
            profile=self.profile,
            failures_dir=self.failures_dir or default_dir(),
            dtypes=self.dtypes,
            tolerance=Tolerance().with_overrides(self.tolerance),
            exclude=self.exclude,
            database=self.database,
            fleet=self.fleet,
        )
        return cfg.replace(**{k: v for k, v in overrides.items() if v is not None})


def _parse_world_sizes(text: str | None) -> tuple[int, ...] | None:
    if not text:
        return None
    try:
        sizes = parse_world_sizes(text)
    except ValueError as e:
        raise pytest.UsageError(f"--shardfuzz-world-sizes={e}") from None
    try:
        for w in sizes:
            check_world_size(w, "--shardfuzz-world-sizes")
    except InvalidArgument as e:
        raise pytest.UsageError(str(e)) from None
    return sizes


def _parse_dtypes(text: str | None) -> tuple[str, ...] | None:
    try:
        return parse_dtypes(text) if text else None
    except ValueError as e:
        raise pytest.UsageError(f"--shardfuzz-dtypes {e}") from None


def _parse_tolerances(texts: list[str] | None) -> tuple[tuple[str, OutputTolerance], ...]:
    out: dict[str, OutputTolerance] = {}
    for text in texts or []:
        try:
            name, tol = parse_tolerance(text)
        except ValueError as e:
            raise pytest.UsageError(f"--shardfuzz-tolerance {e}") from None
        out[name] = tol
    return tuple(sorted(out.items()))


def _parse_excludes(texts: list[str] | None) -> tuple[str, ...]:
    try:
        return tuple(CaseExpression(t, "--shardfuzz-exclude").text for t in texts or [])
    except InvalidArgument as e:
        raise pytest.UsageError(str(e)) from None


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("shardfuzz", "shardfuzz: differential fuzzing of sharded code")
    group.addoption("--shardfuzz-backend", default="gloo", choices=BACKENDS, help=HELP_BACKEND)
    group.addoption("--shardfuzz-world-sizes", default=None, metavar="N,N,...", help=HELP_WORLD_SIZES)
    group.addoption("--shardfuzz-timeout", default=None, type=float, metavar="SECONDS", help=HELP_TIMEOUT)
    group.addoption("--shardfuzz-failures-dir", default=None, metavar="DIR", help=HELP_FAILURES_DIR)
    group.addoption("--shardfuzz-dtypes", default=None, metavar="DTYPE,...", help=HELP_DTYPES)
    group.addoption(
        "--shardfuzz-tolerance",
        action="append",
        default=[],
        metavar="OUTPUT=rtol:X,atol:Y",
        help=HELP_TOLERANCE,
    )
    group.addoption(
        "--shardfuzz-exclude",
        action="append",
        default=[],
        metavar="EXPR",
        help="set aside cases of a known failure, e.g. \"options['smoothing'] > 0\" (repeatable; counted, never passed)",
    )
    for name, what in (("database", HELP_DATABASE), ("fleet", "the fleet's name on a shared Redis")):
        group.addoption(f"--shardfuzz-{name}", default=None, help=what)  # or the ini key shardfuzz_NAME
        parser.addini(f"shardfuzz_{name}", what, default=None)


def pytest_configure(config: pytest.Config) -> None:
    register_profiles()
    timeout = config.getoption("--shardfuzz-timeout", None)
    if timeout is not None and not (timeout > 0 and math.isfinite(timeout)):
        raise pytest.UsageError(f"--shardfuzz-timeout={timeout!r}; must be a finite number of seconds > 0")
    failures_dir = config.getoption("--shardfuzz-failures-dir", None)
    if failures_dir:  # checked now: an unwritable one must not lose findings later
        try:
            check_failures_dir(failures_dir, "--shardfuzz-failures-dir")
        except InvalidArgument as e:
            raise pytest.UsageError(str(e)) from None
    current = current_profile_name()
    get = lambda name: config.getoption(f"--shardfuzz-{name}") or config.getini(f"shardfuzz_{name}")
    try:
        database, fleet = database_options(get, "--shardfuzz-")
    except InvalidArgument as e:
        raise pytest.UsageError(str(e)) from None
    config._shardfuzz_options = Options(  # type: ignore[attr-defined]
        backend=config.getoption("--shardfuzz-backend", "gloo"),
        world_sizes=_parse_world_sizes(config.getoption("--shardfuzz-world-sizes", None)),
        timeout=timeout,
        profile=profile_for(current),
        hypothesis_profile=current,
        failures_dir=failures_dir,
        dtypes=_parse_dtypes(config.getoption("--shardfuzz-dtypes", None)),
        tolerance=_parse_tolerances(config.getoption("--shardfuzz-tolerance", None)),
        exclude=_parse_excludes(config.getoption("--shardfuzz-exclude", None)),
        database=database,
        fleet=fleet,
    )
    config._shardfuzz_targets = {}  # type: ignore[attr-defined]  # the targets tested: name -> Target
    config.addinivalue_line(
        "markers", "shardfuzz_regression: replays a failure file (runs before new searches)"
    )


def pytest_collection_modifyitems(items: list) -> None:
    """Failure-file regressions run before any new search."""
    items.sort(key=lambda item: 0 if item.get_closest_marker("shardfuzz_regression") else 1)


def pytest_report_header(config: pytest.Config) -> str:
    o: Options = config._shardfuzz_options  # type: ignore[attr-defined]
    args = (
        [f"--hypothesis-profile={o.hypothesis_profile}"]
        if o.hypothesis_profile not in (None, "default")
        else []
    )
    args.append(f"--shardfuzz-backend={o.backend}")
    if o.world_sizes:
        args.append(f"--shardfuzz-world-sizes={','.join(map(str, o.world_sizes))}")
    if o.timeout:
        args.append(f"--shardfuzz-timeout={o.timeout:g}")
    if o.dtypes:
        args.append(f"--shardfuzz-dtypes={','.join(o.dtypes)}")
    args += [shlex.quote(f"--shardfuzz-tolerance={format_tolerance(n, t)}") for n, t in o.tolerance]
    args += [shlex.quote(f"--shardfuzz-exclude={e}") for e in o.exclude]
    return f"shardfuzz: profile {o.profile}; reproduce with: pytest {' '.join(args)}"


def pytest_sessionfinish(session: pytest.Session) -> None:
    """A ``--shardfuzz-tolerance`` output that none of the targets tested has is a usage error
    (each test's target alone cannot tell: the option applies to every shardfuzz test)."""
    o: Options | None = getattr(session.config, "_shardfuzz_options", None)
    targets = getattr(session.config, "_shardfuzz_targets", {})
    if o is None or not o.tolerance or not targets:
        return
    try:
        check_tolerance_outputs(targets.values(), Tolerance(per_output=o.tolerance), "--shardfuzz-tolerance")
    except InvalidArgument as e:
        reporter = session.config.pluginmanager.get_plugin("terminalreporter")
        if reporter is not None:
            reporter.write_line(f"shardfuzz: error: {e}", red=True)
        session.exitstatus = pytest.ExitCode.USAGE_ERROR


@pytest.fixture(scope="session")
def shardfuzz_options(pytestconfig: pytest.Config) -> Options:
    """The shardfuzz options of this run (backend, world sizes, timeout, profile)."""
    return pytestconfig._shardfuzz_options  # type: ignore[attr-defined]


def test_for(
    target: Any,
    impl: Any = None,
    *,
    world_sizes: tuple[int, ...] | None = None,
    timeout: float | None = None,
    max_examples: int | None = None,
) -> Any:
    """A pytest test that fuzzes ``impl`` of ``target``: ``test_mine = shardfuzz.test_for("my_target.py")``.

    The test uses the shardfuzz profile picked from ``--hypothesis-profile``, the
    ``--shardfuzz-*`` options (explicit arguments here win), and a Hypothesis database keyed by
    target, implementation and backend. An implementation listed in the target's
    ``expected_failures`` becomes a strict xfail with the recorded reason.

    A relative ``file.py`` target or ``file.py::NAME`` implementation is found next to the test
    file that calls ``test_for`` first, then from the current folder.
    """
    name = target if isinstance(target, str) else getattr(target, "name", "target")
    here = caller_dir()
    target, impl = anchored_ref(target, here), anchored_ref(impl, here)

    def test(shardfuzz_options: Options, pytestconfig: pytest.Config) -> None:
        config = shardfuzz_options.config(world_sizes=world_sizes, timeout=timeout, max_examples=max_examples)
        runner = Runner(target, impl, config, hooks=[FailureRecorder(config.failures_dir)])
        _tested(pytestconfig, runner.target)
        expected = runner.target.expected_failures.get(runner.impl_name)
        test = build_test(runner, settings_for(config))
        try:
            run_test(test)  # a deadline or Ctrl-C after a finding raises that finding
        except BaseException as e:
            found = findings_of(e)
            if found and getattr(found[0], "cut_short", None) == "interrupted":
                pytest.exit(f"{found[0].report}\nshardfuzz: interrupted", returncode=1)
            if expected is None or not found:
                raise
            pytest.xfail(f"expected failure: {expected.description}")
        if expected is not None:
            pytest.fail(
                f"{runner.key} is listed as an expected failure ({expected.description}) but passed",
                pytrace=False,
            )

    test.__name__ = f"test_shardfuzz_{name}"
    return test


def _tested(config: pytest.Config, target: Any) -> None:
    """Note a target tested in this session (``--shardfuzz-tolerance`` is checked against them)."""
    targets = getattr(config, "_shardfuzz_targets", None)
    if targets is not None:
        targets[target.name] = target


test_for.__test__ = False  # type: ignore[attr-defined]  # not itself a test when imported into one


def regressions(directory: str | None = None, *, trust_refs: bool = False) -> Any:
    """Parametrized regression tests, one test id per failure file in ``directory``:
    ``test_regressions = shardfuzz.regressions()``. Each replays its case exactly (no search) and
    fails with the report while the bug is still there. They run before any new search.

    ``directory`` defaults to ``--shardfuzz-failures-dir``, ``$SHARDFUZZ_FAILURES_DIR`` or
    ``.shardfuzz/failures``; it is read at collection time. Files in the project (or on the search
    path) replay as they are; ``trust_refs=True`` also imports code a file names outside them
    (``docs/trust.md``).
    """
    where = directory or default_dir()
    files = (
        sorted(os.path.join(where, n) for n in os.listdir(where) if n.endswith(".json"))
        if os.path.isdir(where)
        else []
    )

    @pytest.mark.shardfuzz_regression
    @pytest.mark.parametrize("failure_file", files, ids=[os.path.basename(f)[: -len(".json")] for f in files])
    def test(failure_file: str, shardfuzz_options: Options, pytestconfig: pytest.Config) -> None:
        record = failures.load(failure_file, trust_refs=trust_refs)
        _tested(pytestconfig, failures.record_target(record)[0])
        res = replay_one(
            record,
            backend=shardfuzz_options.backend if shardfuzz_options.backend != "gloo" else None,
            tolerance=Tolerance().with_overrides(shardfuzz_options.tolerance),
        )
        if res.failed:
            pytest.fail(f"{res.line()}\n{res.report}", pytrace=False)
        if res.status == "different inputs":
            pytest.fail(
                f"{res.line()}\nthe inputs changed, so this file no longer tests the same case", pytrace=False
            )

    test.__name__ = "test_shardfuzz_regression"
    return test


regressions.__test__ = False  # type: ignore[attr-defined]
