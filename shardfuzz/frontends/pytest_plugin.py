"""pytest plugin (entry point ``pytest11: shardfuzz``).

* registers the ``shardfuzz-ci``, ``shardfuzz-dev`` and ``shardfuzz-fuzz`` Hypothesis profiles and,
  after ``--hypothesis-profile`` is loaded, picks ``shardfuzz-<current profile>`` for shardfuzz tests
  only (other Hypothesis tests in the project keep their own settings);
* adds the namespaced options ``--shardfuzz-backend``, ``--shardfuzz-world-sizes``,
  ``--shardfuzz-timeout`` (``--timeout`` belongs to pytest-timeout), ``--shardfuzz-dtypes``,
  ``--shardfuzz-tolerance`` (repeatable), ``--shardfuzz-max-examples``, ``--shardfuzz-profile``,
  ``--shardfuzz-device``, ``--shardfuzz-ranks`` and ``--shardfuzz-secret-file``;
* prints a header line that says how to reproduce the run;
* :func:`test_for` turns a target into a test in one line, a Hypothesis test that composes with the
  user's profile and ``@settings`` (:mod:`shardfuzz.frontends.pytest_compose`);
* adds shardfuzz's statistics to Hypothesis' for ``--hypothesis-show-statistics``.

A start-up seam: pytest loads this module, and runs its hooks, in every session of a project
where shardfuzz is installed, shardfuzz's tests or not. So it imports only modules that import
neither torch nor Hypothesis; ``pytest_configure`` imports the profiles (Hypothesis), and
``test_for``'s tests and ``regressions`` import the engine (torch) when a test file uses them,
after starting the ranks' forkserver, whose preload then overlaps with that import.
"""

from __future__ import annotations

import dataclasses
import math
import os
import shlex
import warnings
from typing import Any, NoReturn

import pytest

from shardfuzz.engine.config import (
    BACKENDS,
    DEVICES,
    PROFILES,
    RunConfig,
    as_tolerance,
    check_exclude_keys,
    check_tolerance_names,
    declared_outputs,
    format_tolerance,
    world_sizes_form,
)
from shardfuzz.engine.filewriter import check_failures_dir, default_dir
from shardfuzz.engine.shared_db import database_options
from shardfuzz.errors import InvalidArgument, ShardfuzzWarning, TargetCodeError, TargetError
from shardfuzz.frontends import pytest_options as opts
from shardfuzz.frontends.pytest_scope import test_scope
from shardfuzz.ranks.spawn import start_forkserver
from shardfuzz.report.tracebacks import hide_for_findings as __tracebackhide__  # noqa: F401 (read by pytest)
from shardfuzz.spec.refs import anchored_ref, caller_dir, split_file_ref
from shardfuzz.spec.target import Target
from shardfuzz.spec.tolerance import OutputTolerance, Tolerance

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
    max_examples: int | None = None
    device: str | None = None
    #: ``--shardfuzz-database`` / ini ``shardfuzz_database``: a directory or a fleet's redis:// URL
    database: str | None = None
    fleet: str | None = None
    #: ``--shardfuzz-ranks``: rank servers that torchrun started, and their secret's file
    ranks: str | None = None
    secret_file: str | None = None

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
            max_examples=self.max_examples,
            device=self.device,
            database=self.database,
            fleet=self.fleet,
            ranks=self.ranks,
            secret_file=self.secret_file,
        )
        return cfg.replace(**{k: v for k, v in overrides.items() if v is not None})


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
    group.addoption(
        "--shardfuzz-max-examples", default=None, type=int, metavar="N", help=opts.HELP_MAX_EXAMPLES
    )
    group.addoption("--shardfuzz-profile", default=None, choices=PROFILES, help=opts.HELP_PROFILE)
    group.addoption("--shardfuzz-device", default=None, choices=DEVICES, help=opts.HELP_DEVICE)
    group.addoption(
        "--shardfuzz-ranks",
        default=None,
        metavar="HOST:PORT",
        help="run every case on rank servers that torchrun started (python -m shardfuzz.ranks.serve "
        "--driver HOST:PORT), listening there (PORT alone: on 127.0.0.1; give one pytest process: -n 0)",
    )
    group.addoption(
        "--shardfuzz-secret-file",
        default=None,
        metavar="FILE",
        help="the secret the rank servers must prove (default: $SHARDFUZZ_SECRET)",
    )
    for name, value, what in (
        ("database", "DIR|redis://HOST:PORT/N", HELP_DATABASE),
        ("fleet", "NAME", "the fleet's name on a shared Redis"),
    ):
        group.addoption(
            f"--shardfuzz-{name}", default=None, metavar=value, help=what
        )  # or ini shardfuzz_NAME
        parser.addini(f"shardfuzz_{name}", what, default=None)


@pytest.hookimpl(tryfirst=True)
def pytest_cmdline_main(config: pytest.Config) -> None:
    """Before Hypothesis' plugin loads ``--hypothesis-profile``: a shardfuzz profile asked for there
    is registered first, and a name nobody registered (``fuzz``: Hypothesis registers only
    ``default`` and ``ci``) is a usage error that says what to use, not Hypothesis' INTERNALERROR."""
    from hypothesis import settings
    from hypothesis.errors import InvalidArgument as HypothesisInvalidArgument

    from shardfuzz.engine.settings import PROFILE_NAMES, register_profiles

    name = config.getoption("--hypothesis-profile", None)
    if name is None:
        return
    if name in PROFILE_NAMES:
        register_profiles()
        return
    try:
        settings.get_profile(name)
    except HypothesisInvalidArgument:
        raise pytest.UsageError(
            f"--hypothesis-profile={name!r} is not a registered Hypothesis profile (Hypothesis "
            "registers 'default' and 'ci'; a profile of your own is registered in conftest.py with "
            "hypothesis.settings.register_profile). For shardfuzz tests, --shardfuzz-profile picks "
            f"one of {', '.join(sorted(PROFILE_NAMES))} outright: a long run is "
            "--shardfuzz-profile=shardfuzz-fuzz"
        ) from None


# after Hypothesis' own pytest_configure: it loads --hypothesis-profile, which decides ours (the
# order of plugins found by entry point differs between installs: CI ran ours first)
@pytest.hookimpl(trylast=True)
def pytest_configure(config: pytest.Config) -> None:
    config._shardfuzz_outer_failures_dir = _SESSION["failures_dir"]  # type: ignore[attr-defined]  # a session inside a session (pytester)
    config._shardfuzz_outer_rootdir = _SESSION["rootdir"]  # type: ignore[attr-defined]
    from shardfuzz.engine.settings import current_profile_name, profile_for, register_profiles

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
    options = Options(
        backend=config.getoption("--shardfuzz-backend", "gloo"),
        world_sizes=opts.parse_world_sizes(config.getoption("--shardfuzz-world-sizes", None)),
        timeout=timeout,
        profile=config.getoption("--shardfuzz-profile", None) or profile_for(current),
        hypothesis_profile=current,
        failures_dir=failures_dir,
        dtypes=opts.parse_dtypes(config.getoption("--shardfuzz-dtypes", None)),
        tolerance=opts.parse_tolerances(config.getoption("--shardfuzz-tolerance", None)),
        exclude=opts.parse_excludes(config.getoption("--shardfuzz-exclude", None)),
        max_examples=opts.parse_max_examples(config.getoption("--shardfuzz-max-examples", None)),
        device=config.getoption("--shardfuzz-device", None),
        database=database,
        fleet=fleet,
        ranks=config.getoption("--shardfuzz-ranks", None),
        secret_file=config.getoption("--shardfuzz-secret-file", None),
    )
    try:  # a combination RunConfig refuses (--shardfuzz-backend=nccl --shardfuzz-device=cpu)
        options.config()
    except InvalidArgument as e:
        raise pytest.UsageError(str(e)) from None
    config._shardfuzz_options = options  # type: ignore[attr-defined]
    config._shardfuzz_targets = {}  # type: ignore[attr-defined]  # the targets tested: name -> Target
    _SESSION["failures_dir"] = failures_dir
    _SESSION["rootdir"] = str(config.rootpath)
    config.addinivalue_line(
        "markers", "shardfuzz_regression: replays a failure file (runs before new searches)"
    )


def pytest_unconfigure(config: pytest.Config) -> None:
    # a session run inside another (pytester) hands the outer one its value back
    _SESSION["failures_dir"] = getattr(config, "_shardfuzz_outer_failures_dir", None)
    _SESSION["rootdir"] = getattr(config, "_shardfuzz_outer_rootdir", None)


#: what ``regressions()`` reads at collection time, when it has no config to ask: the session's
#: ``--shardfuzz-failures-dir`` (None: ``$SHARDFUZZ_FAILURES_DIR`` or ``.shardfuzz/failures``) and
#: pytest's rootdir (where a relative folder given to it is looked for after the test file's own)
_SESSION: dict[str, str | None] = {"failures_dir": None, "rootdir": None}


def _regressions_dir(directory: str | None, test_dir: str) -> tuple[str, list[str]]:
    """The folder ``regressions(directory)`` reads, and the places a relative one was looked for:
    next to the calling test file, in pytest's rootdir, in the current folder (the first that
    holds it; as ``test_for`` finds a relative target file next to the test file first). A
    folder it does not find is read nowhere: its test is skipped saying where it looked."""
    if directory is None:
        return _SESSION["failures_dir"] or default_dir(), []
    if os.path.isabs(directory):
        return directory, [directory]
    looked = []
    for root in (test_dir, _SESSION["rootdir"], os.getcwd()):
        if root is None:
            continue
        candidate = os.path.normpath(os.path.join(root, directory))
        if os.path.isdir(candidate):
            return candidate, [candidate]
        if candidate not in looked:
            looked.append(candidate)
    return directory, looked


def pytest_collection_modifyitems(items: list) -> None:
    """Failure-file regressions run before any new search."""
    items.sort(key=lambda item: 0 if item.get_closest_marker("shardfuzz_regression") else 1)


def pytest_report_header(config: pytest.Config) -> str:
    from shardfuzz.engine.settings import profile_changes, profile_for

    o: Options = config._shardfuzz_options  # type: ignore[attr-defined]
    args = (
        [f"--hypothesis-profile={o.hypothesis_profile}"]
        if o.hypothesis_profile not in (None, "default")
        else []
    )
    if o.profile != profile_for(o.hypothesis_profile):
        args.append(f"--shardfuzz-profile={o.profile}")
    args.append(f"--shardfuzz-backend={o.backend}")
    args += [f"--shardfuzz-device={o.device}"] if o.device else []
    args += [f"--shardfuzz-max-examples={o.max_examples}"] if o.max_examples else []
    args += [f"--shardfuzz-ranks={o.ranks}"] if o.ranks else []
    if o.world_sizes:
        args.append(f"--shardfuzz-world-sizes={','.join(map(str, o.world_sizes))}")
    if o.timeout:
        args.append(f"--shardfuzz-timeout={o.timeout:g}")
    if o.dtypes:
        args.append(f"--shardfuzz-dtypes={','.join(o.dtypes)}")
    args += [shlex.quote(f"--shardfuzz-tolerance={format_tolerance(n, t)}") for n, t in o.tolerance]
    args += [shlex.quote(f"--shardfuzz-exclude={e}") for e in o.exclude]
    seed = config.getoption("hypothesis_seed", default=None)  # Hypothesis' own option: it changes the run
    args += [shlex.quote(f"--hypothesis-seed={seed}")] if seed is not None else []
    changes = profile_changes(o.profile)
    changed = f"; from profile {o.hypothesis_profile!r}: {changes}" if changes else ""
    return f"shardfuzz: profile {o.profile}; reproduce with: pytest {' '.join(args)}{changed}"


def pytest_sessionfinish(session: pytest.Session) -> None:
    """A ``--shardfuzz-tolerance`` output that none of the targets tested has is a usage error
    (each test's target alone cannot tell: the option applies to every shardfuzz test). Under
    pytest-xdist the workers tested the targets: each hands their outputs to the controller."""
    config = session.config
    o: Options | None = getattr(config, "_shardfuzz_options", None)
    if o is None or not o.tolerance:
        return
    declared = declared_outputs(getattr(config, "_shardfuzz_targets", {}).values())
    if hasattr(config, "workeroutput"):  # an xdist worker: the controller decides
        config.workeroutput["shardfuzz_outputs"] = declared
        return
    declared.update(getattr(config, "_shardfuzz_worker_outputs", {}))
    try:
        check_tolerance_names(declared, Tolerance(per_output=o.tolerance), "--shardfuzz-tolerance")
    except InvalidArgument as e:
        config._shardfuzz_usage_error = str(e)  # type: ignore[attr-defined]  # printed in the summary
        session.exitstatus = pytest.ExitCode.USAGE_ERROR


@pytest.hookimpl(optionalhook=True)  # a pytest-xdist hook: on the controller, as each worker ends
def pytest_testnodedown(node: Any) -> None:
    outputs = getattr(node, "workeroutput", {}).get("shardfuzz_outputs")
    if outputs:
        node.config._shardfuzz_worker_outputs = {
            **getattr(node.config, "_shardfuzz_worker_outputs", {}),
            **outputs,
        }


def pytest_terminal_summary(terminalreporter: Any) -> None:
    # here, not in pytest_sessionfinish: after the progress line ("[100%]"), on a line of its own
    error = getattr(terminalreporter.config, "_shardfuzz_usage_error", None)
    if error:
        terminalreporter.write_line(f"shardfuzz: error: {error}", red=True)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item: pytest.Item) -> Any:
    """Each test's shardfuzz runners (``test_for``, :func:`shardfuzz.run_case`) get the session's
    options, and their statistics join Hypothesis' statistics of the test."""
    options: Options | None = getattr(item.config, "_shardfuzz_options", None)
    with test_scope(item, options.config() if options is not None else None):
        return (yield)


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
    dtypes: tuple[str, ...] | str | None = None,
    exclude: tuple[str, ...] | str = (),
    precision: str | None = None,
    tolerance: Any = None,
) -> Any:
    """A pytest test that fuzzes ``impl`` of ``target``: ``test_mine = shardfuzz.test_for("my_target.py")``.

    ``world_sizes``, ``timeout`` and ``dtypes`` replace ``--shardfuzz-world-sizes``,
    ``--shardfuzz-timeout`` and ``--shardfuzz-dtypes`` for this test; ``exclude``
    sets aside this test's known failures (case expressions, as ``--shardfuzz-exclude``, whose
    expressions still apply); ``precision`` judges an implementation that computes part of its
    work in that narrower dtype by design at its rounding (``--precision`` of the CLI);
    ``tolerance`` (output name -> ``OutputTolerance`` / ``{"rtol": X, "atol": Y}``) fixes this
    test's per-output tolerances on top of ``--shardfuzz-tolerance``'s. Every argument is checked here, so a mistake fails at collection;
    when the test runs, an ``exclude`` key no case of the target has (``sizes['hedas']``) fails it,
    and a world size above this machine's limit too.

    The test is a Hypothesis test: its settings are the shardfuzz profile picked from
    ``--hypothesis-profile`` (or ``--shardfuzz-profile``), then what the active profile changes
    from Hypothesis' defaults, the ``--shardfuzz-*`` options, the user's ``@settings`` on it and
    the arguments here, each winning over the ones before (:mod:`shardfuzz.frontends.pytest_compose`);
    ``@seed``, ``@example(case=...)`` and ``@reproduce_failure`` work on it. Its Hypothesis
    database is keyed by target, implementation and backend. An implementation listed in the
    target's ``expected_failures`` becomes a strict xfail with the recorded reason.

    A relative ``file.py`` target or ``file.py::NAME`` implementation is found next to the test
    file that calls ``test_for`` first, then from the current folder.
    """
    if not isinstance(target, (str, Target)):  # at collection, as every argument is
        raise InvalidArgument(
            f"test_for(target={target!r}); expected a Target, a target name, 'pkg.mod:ATTR' or a file.py path"
        )
    name = target if isinstance(target, str) else getattr(target, "name", "target")
    here = caller_dir()
    target, impl = anchored_ref(target, here), anchored_ref(impl, here)
    for arg, ref in (("target", target), ("impl", impl)):  # a file that is not there: at collection
        parts = split_file_ref(ref)
        if parts is not None and not os.path.isfile(parts[0]):
            raise InvalidArgument(
                f"test_for({arg}={ref!r}): no file {parts[0]!r} next to the test file ({here}) or in "
                f"the current folder ({os.getcwd()})"
            )
    # every argument checked now, so a mistake fails the file's collection naming the argument and
    # its value (world_sizes=[0, 2] failed only when the test ran, through shardfuzz's frames); the
    # world sizes' form only: this machine's limit is the test's to meet when it runs (a suite
    # written for a larger machine must still collect, and run its other tests)
    if world_sizes is not None:
        world_sizes_form(world_sizes)
    own = RunConfig(
        timeout=timeout,
        max_examples=max_examples,
        dtypes=(dtypes,) if isinstance(dtypes, str) else dtypes,
        exclude=(exclude,) if isinstance(exclude, str) else tuple(exclude),
    )
    own_dtypes, own_exclude = own.dtypes, own.exclude
    lossy = Tolerance(precision=precision) if precision is not None else None  # checked at collection
    fixed = as_tolerance(tolerance, "tolerance") if tolerance is not None else None

    def test(shardfuzz_options: Options, pytestconfig: pytest.Config) -> None:
        start_forkserver()  # first: its preload of torch overlaps with the engine's own import of it
        from shardfuzz.frontends import pytest_compose as compose

        try:  # this machine's world-size limit, met when the test runs: its message, not our frames
            config = shardfuzz_options.config(world_sizes=world_sizes, timeout=timeout, dtypes=own_dtypes)
        except InvalidArgument as e:
            _fail(str(e))
        from shardfuzz.spec.registry import get_target

        try:  # a target or implementation name that is not there: its message, not shardfuzz's frames
            get_target(target).impl_ref(impl)
        except TargetError as e:
            if isinstance(e, TargetCodeError):  # the target's own code failed: its traceback counts
                raise
            _fail(str(e))
        config = _with_own(config, get_target(target), own_exclude, lossy, fixed)
        compose.run_target_test(
            test, target, impl, config, lambda t: _tested(pytestconfig, t), max_examples=max_examples
        )

    test.__name__ = f"test_shardfuzz_{name}"
    test.is_hypothesis_test = True  # type: ignore[attr-defined]  # see shardfuzz.frontends.pytest_compose
    return test


def _with_own(
    config: RunConfig, target: Any, exclude: tuple[str, ...], lossy: Tolerance | None, fixed: Tolerance | None
) -> RunConfig:
    """``config`` with a ``test_for``'s own known failures, precision and per-output tolerances on
    top of the session's; the first two are checked against its target (the argument's fault,
    said as such, not shardfuzz's frames)."""
    try:
        if exclude:
            check_exclude_keys([target], exclude, "exclude", config.world_sizes)
        if fixed is not None:
            check_tolerance_names(declared_outputs([target]), fixed, "tolerance")
    except InvalidArgument as e:
        _fail(str(e))
    if exclude:
        config = config.replace(exclude=(*config.exclude, *exclude))
    if lossy is not None:
        config = config.replace(tolerance=dataclasses.replace(config.tolerance, precision=lossy.precision))
    if fixed is not None:
        config = config.replace(tolerance=config.tolerance.with_overrides(fixed.per_output))
    return config


def _fail(message: str) -> NoReturn:
    """``pytest.fail(message, pytrace=False)`` from inside an ``except``, without the exception
    handled there chained under it (the message printed twice, "During handling of the above
    exception, another exception occurred" between the copies)."""
    raise pytest.fail.Exception(message, pytrace=False) from None


def _tested(config: pytest.Config, target: Any) -> None:
    """Note a target tested in this session (``--shardfuzz-tolerance`` is checked against them)."""
    targets = getattr(config, "_shardfuzz_targets", None)
    if targets is not None:
        targets[target.name] = target


test_for.__test__ = False  # type: ignore[attr-defined]  # not itself a test when imported into one


def regressions(
    directory: str | None = None,
    *,
    target: Any = None,
    impl: Any = None,
    kind: Any = None,
    planted: bool = False,
    trust_refs: bool = False,
) -> Any:
    """Parametrized regression tests, one test id per failure file in ``directory``:
    ``test_regressions = shardfuzz.regressions()``. Each replays its case exactly (no search) and
    fails with the report while the bug is still there. They run before any new search.

    ``directory`` defaults to ``--shardfuzz-failures-dir``, ``$SHARDFUZZ_FAILURES_DIR`` or
    ``.shardfuzz/failures``; it is read at collection time. A relative ``directory`` is looked for
    next to the calling test file, then in pytest's rootdir, then in the current folder; with no
    file to replay there is one skipped test that says why (no such folder, where it looked). Files in the project (or on the search
    path) replay as they are; ``trust_refs=True`` also imports code a file names outside them
    (``docs/trust.md``). ``target``, ``impl`` and ``kind`` (each a name or a list of names;
    ``kind`` one of ``mismatch``, ``layout``, ``rank-error``, ``hang``, ``ignored-collective``,
    ``communication``) keep only the files that match; the files of planted bugs (deliberate runs
    of a target's ``planted`` implementations) are left out unless ``planted=True``.
    """
    where, looked = _regressions_dir(directory, caller_dir())
    files = (
        sorted(os.path.join(where, n) for n in os.listdir(where) if n.endswith(".json"))
        if os.path.isdir(where)
        else []
    )
    on_disk = len(files)
    if files:  # replays will run: the forkserver's preload overlaps with the engine's import
        start_forkserver()
    from shardfuzz.engine import failures
    from shardfuzz.frontends import pytest_compose as compose
    from shardfuzz.repro.replay import file_tolerance_note, replay_one

    every = files
    files = compose.select_failure_files(every, target=target, impl=impl, kind=kind, planted=planted)
    params: list[Any] = files
    if not files:  # one skipped test that says why (pytest's own: "got empty parameter set")
        if not os.path.isdir(where):
            why = f"no folder {' or '.join(looked) if looked else os.path.abspath(where)}"
        elif on_disk:
            why = f"none of the {on_disk} failure file(s) in {os.path.abspath(where)} is selected"
            # the filter a user did not write: planted bugs' files are left out unless asked for
            left = (
                0
                if planted
                else len(
                    compose.select_failure_files(every, target=target, impl=impl, kind=kind, planted=True)
                )
            )
            if left:
                why += f" ({left} of them a planted bug's: regressions(..., planted=True) replays those)"
        else:
            why = f"no failure files in {os.path.abspath(where)}"
        params = [pytest.param(None, marks=pytest.mark.skip(reason=f"shardfuzz.regressions(): {why}"))]

    @pytest.mark.shardfuzz_regression
    @pytest.mark.parametrize(
        "failure_file",
        params,
        ids=[os.path.basename(f)[: -len(".json")] for f in files] if files else ["no-failure-files"],
    )
    def test(failure_file: str, shardfuzz_options: Options, pytestconfig: pytest.Config) -> None:
        try:
            record = failures.load(failure_file, trust_refs=trust_refs)
        except InvalidArgument as e:  # a file that no longer validates: its reason, not our frames
            _fail(f"{os.path.basename(failure_file)} cannot be replayed: {e}")
        record_target = failures.record_target(record)[0]
        _tested(pytestconfig, record_target)
        if not planted and record.get("planted") is None and record["impl"] in record_target.planted:
            pytest.skip(
                f"{record['impl']!r} is a planted bug of {record_target.name!r}: regressions(planted=True) replays it"
            )
        given = Tolerance().with_overrides(shardfuzz_options.tolerance)
        backend = shardfuzz_options.backend if shardfuzz_options.backend != "gloo" else None
        res = replay_one(record, backend=backend, tolerance=given)
        expected = record_target.expected_failures.get(record["impl"])
        if expected is not None:  # a known failure's file: green while it still fails (a new user's
            # suite went red on its second run, replaying what its xfail tests had written)
            _expected_regression_outcome(res, os.path.basename(failure_file), expected)
        _regression_outcome(res, os.path.basename(failure_file), file_tolerance_note(record, given))

    test.__name__ = "test_shardfuzz_regression"
    return test


regressions.__test__ = False  # type: ignore[attr-defined]


def _expected_regression_outcome(res: Any, name: str, expected: Any) -> None:
    """The outcome of a replayed file of an expected failure: an xfail while it still fails as its
    record says (its kind), a failure once it fails otherwise or its case passes (the record, or
    the file, is then stale)."""
    description, kinds = expected.description, expected.expect.kinds
    if res.failed and res.kind not in kinds:
        pytest.fail(
            f"{name} is a file of an expected failure ({description}), but it now fails as a "
            f"{res.kind!r} finding, where the record expects {' or '.join(map(repr, kinds))}: "
            f"{res.line()}\n{res.report}",
            pytrace=False,
        )
    if res.failed:
        pytest.xfail(f"{name}: expected failure ({description}): {res.line()}")
    if not res.not_judged:
        pytest.fail(
            f"{name} is a file of an expected failure ({description}), but its case passes now: "
            f"{res.line()}\nremove the file, or the record if the failure is fixed",
            pytrace=False,
        )


def _regression_outcome(res: Any, name: str, loosened: str) -> None:
    """A replayed failure file's test outcome: failed, skipped (not judged), or passed; a pass
    judged with the file's own tolerance overrides says so in the warnings summary."""
    if res.failed:
        pytest.fail(f"{res.line()}\n{res.report}", pytrace=False)
    if res.not_judged:  # the target now knows it fails, or refuses it: said, not judged
        pytest.skip(res.line())
    if res.status == "different inputs":
        pytest.fail(
            f"{res.line()}\nthe inputs changed, so this file no longer tests the same case", pytrace=False
        )
    if res.status == "another implementation":
        pytest.fail(f"{res.line()}\nso this file does not test the implementation it names", pytrace=False)
    if loosened:
        warnings.warn(f"{name} passes{loosened}", ShardfuzzWarning, stacklevel=1)
