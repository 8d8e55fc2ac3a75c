"""The Hypothesis glue: the ``@given`` test around a runner, :func:`run` and its :class:`Result`.

Hypothesis runs only in the driver, with a single ``case`` argument; ranks never call ``@given``.
Hypothesis does the search and the shrinking; there is no search loop of ours.
"""

from __future__ import annotations

import dataclasses
import hashlib
import importlib
import sys
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from shardfuzz.case import Case
from shardfuzz.config import RunConfig
from shardfuzz.database import keyed_database
from shardfuzz.errors import Finding, InvalidArgument, Unsupported
from shardfuzz.failures import FailureRecorder
from shardfuzz.hooks import Deadline, RunHooks, TimeUp
from shardfuzz.runner import Runner, Stats
from shardfuzz.settings import build_settings
from shardfuzz.triggers import triggers_of

if TYPE_CHECKING:
    import hypothesis

_EXCEPTION_GROUP: type[Any] | None  # has ``.exceptions``
if sys.version_info >= (3, 11):
    _EXCEPTION_GROUP = BaseExceptionGroup  # noqa: F821 (a builtin since 3.11; ruff targets 3.10)
else:  # pragma: no cover; Hypothesis brings the backport on 3.10
    try:
        _EXCEPTION_GROUP = importlib.import_module("exceptiongroup").BaseExceptionGroup
    except ImportError:
        _EXCEPTION_GROUP = None


def check(runner: Runner, case: Case) -> float:
    """Run one case inside a Hypothesis test: statistics, events and ``target()`` included."""
    from hypothesis import event, reject, target

    reached = triggers_of(runner.target, case)
    runner.stats.triggers.update(reached)
    try:
        ratio = runner.run_case(case)
    except Unsupported as e:
        runner.stats.triggers.subtract(reached)
        runner.stats.unsupported[e.reason] += 1
        event(f"unsupported: {e.reason}")
        reject()
    for t in reached:
        event(t)
    target(min(ratio, 1.0), label="error/tolerance")
    return ratio


def stable_seed(key: str) -> int:
    return int.from_bytes(hashlib.sha256(key.encode()).digest()[:8], "big")


def build_test(runner: Runner, settings: Any = None, *, database: Any = "default") -> Callable[[], None]:
    """The ``@given`` test for a runner: one ``case`` argument, settings built now (from the
    runner's configuration unless given), and a database keyed by target/implementation/backend."""
    from hypothesis import given, seed

    cfg = runner.config
    s = settings if settings is not None else settings_for(cfg)
    if database != "default":
        s = type(s)(s, database=database)
    if s.database is not None:
        s = type(s)(s, database=keyed_database(s.database, runner.key))

    def test_case(case: Case) -> None:
        check(runner, case)

    ident = "".join(c if c.isalnum() else "_" for c in runner.key)
    test_case.__name__ = test_case.__qualname__ = f"shardfuzz_{ident}"
    test = s(given(case=runner.strategy())(test_case))
    if s.derandomize:
        test = seed(stable_seed(runner.key))(test)
    return test


def settings_for(config: RunConfig, *, quiet: bool = False, **overrides: Any) -> hypothesis.settings:
    """Hypothesis settings from a configuration's profile, budget and derandomize flag (``quiet``:
    no Hypothesis output, for runs that report through a :class:`Result`)."""
    from hypothesis import Verbosity

    kw: dict[str, Any] = dict(max_examples=config.max_examples, derandomize=config.derandomize)
    if quiet:
        kw["verbosity"] = Verbosity.quiet
    kw.update(overrides)
    return build_settings(config.profile, **kw)


@dataclasses.dataclass
class Result:
    """What :func:`run` found."""

    target: str
    impl: str
    backend: str
    found: bool
    kind: str | None = None
    case: Case | None = None
    report: str = ""
    failures: list[Finding] = dataclasses.field(default_factory=list)
    stats: Stats = dataclasses.field(default_factory=Stats)
    flaky: bool = False
    #: the run's deadline fell before Hypothesis finished
    out_of_time: bool = False

    def __bool__(self) -> bool:  # truthy when something was found
        return self.found


def findings_of(exc: BaseException) -> list[Finding]:
    """The findings in an exception raised by a Hypothesis test (one, or a group of several)."""
    if isinstance(exc, Finding):
        return [exc]
    if _EXCEPTION_GROUP is not None and isinstance(exc, _EXCEPTION_GROUP):
        return [f for e in exc.exceptions for f in findings_of(e)]
    return []


def search(runner: Runner, settings: Any = None, *, database: Any = "default") -> Result:
    """One Hypothesis run over ``runner``'s cases; a :class:`Result` (it does not raise on findings)."""
    from hypothesis.errors import Flaky

    test = build_test(runner, settings, database=database)
    result = Result(runner.target.name, runner.impl_name, runner.backend, found=False, stats=runner.stats)
    t0 = time.perf_counter()
    try:
        test()
    except TimeUp:
        result.out_of_time = True
    except BaseException as exc:
        findings = findings_of(exc)
        if not findings:
            raise
        result.found = True
        result.flaky = isinstance(exc, Flaky)
        result.failures = findings
        first = findings[0]
        result.kind, result.case, result.report = first.kind, first.case, first.report
        if result.flaky:
            result.report = (
                "Hypothesis reports this failure as flaky (it did not reproduce):\n" + result.report
            )
    finally:
        runner.stats.elapsed += time.perf_counter() - t0
    return result


def run(
    target: Any,
    impl: Any = None,
    config: RunConfig | None = None,
    *,
    hooks: Sequence[RunHooks] = (),
    database: Any = "default",
    settings: Any = None,
    **fields: Any,
) -> Result:
    """Fuzz one implementation of a target; return a :class:`Result` (it does not raise on findings).

    Args:
        target: a :class:`Target`, a target name, ``pkg.mod:ATTR`` or a ``file.py`` path.
        impl: an implementation name, ``pkg.mod:func``, ``file.py::NAME``, a module-level function
            or :func:`shardfuzz.bind` of one (default: the target's reference).
        config: a :class:`~shardfuzz.RunConfig`; or give its fields as keywords instead
            (``backend=``, ``max_examples=``, ``profile=``, ``world_sizes=``, ``dtypes=``,
            ``timeout=``, ``tolerance=``, ``deadline=``, ``failures_dir=``, ``derandomize=``,
            ``device=``, ``deterministic=``), not both.
        hooks: :class:`~shardfuzz.hooks.RunHooks` objects (a failure-file recorder is added for
            ``failures_dir``, a deadline for ``deadline``).
        database: a Hypothesis database, ``None`` for none, or ``"default"`` for the profile's.
        settings: Hypothesis settings to use instead of the configuration's profile and budget.
    """
    if config is not None and fields:
        raise InvalidArgument(
            f"run(config=..., {', '.join(f'{k}=' for k in sorted(fields))}): give a RunConfig or its fields, "
            "not both (use config.replace(...))"
        )
    if config is not None and not isinstance(config, RunConfig):
        raise InvalidArgument(f"config={config!r}; must be a shardfuzz.RunConfig")
    cfg = config or RunConfig().replace(**fields)
    if settings is not None:
        clash = [k for k in ("profile", "max_examples", "derandomize") if getattr(cfg, k) is not None]
        if clash:
            raise InvalidArgument(
                f"run(settings=..., {', '.join(f'{k}=' for k in clash)}): Hypothesis settings replace the "
                "profile, budget and derandomize flag; give one or the other"
            )
    all_hooks = list(hooks)
    if cfg.failures_dir is not None:
        all_hooks.append(FailureRecorder(cfg.failures_dir))
    if cfg.deadline is not None:
        all_hooks.append(Deadline.after(cfg.deadline))
    runner = Runner(target, impl, cfg, hooks=all_hooks)
    return search(
        runner, settings if settings is not None else settings_for(cfg, quiet=True), database=database
    )
