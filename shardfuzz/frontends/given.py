"""Running cases from the user's own Hypothesis tests: :func:`run_case`.

``test_for`` builds the whole test; :func:`run_case` is for a test that draws its own cases (or
more than a case) with its own ``@given``: it runs one case of a target on the warm rank pools,
judges it against the oracle and raises the finding, so Hypothesis shrinks it like any failure of
the user's test. Runners are kept per (target, implementation, configuration), so the rank pools
and the adaptive timeouts stay warm from one example to the next.
"""

from __future__ import annotations

from typing import Any

from hypothesis import currently_in_test_context

from shardfuzz.case import Case
from shardfuzz.engine.config import RunConfig
from shardfuzz.engine.covering import counted_run
from shardfuzz.engine.failures import FailureRecorder
from shardfuzz.engine.runner import Runner
from shardfuzz.engine.search import check
from shardfuzz.errors import InvalidArgument
from shardfuzz.frontends.pytest_scope import Scope
from shardfuzz.report.tracebacks import hide_for_findings as __tracebackhide__  # noqa: F401 (read by pytest)
from shardfuzz.spec.refs import anchored_ref, caller_dir

_RUNNERS: dict[tuple, Runner] = {}


def run_case(
    target: Any, case: Case, impl: Any = None, *, config: RunConfig | None = None, **fields: Any
) -> float:
    """Run one ``case`` of ``target`` (its reference, or ``impl``) and judge it against the oracle:
    the worst error/tolerance over the outputs (at most 1 passes), or the finding raised
    (:class:`~shardfuzz.Mismatch`, :class:`~shardfuzz.RankError`, ...).

    Inside a Hypothesis test it also does what ``test_for``'s own test does: the trigger conditions
    the case reaches become ``event()``\\ s, a case the target does not support (or an excluded
    one) is ``reject()``\\ ed, and ``target(ratio, label="error/tolerance of a passing example <target/impl/backend>")``
    steers the search towards failures (a measured ratio only: not a sure pass's bound). Under pytest the ``--shardfuzz-*`` options apply, failure
    files go to the failures folder, and ``--hypothesis-show-statistics`` shows shardfuzz's
    statistics for the test.

    ``target``, ``impl``: as for :func:`shardfuzz.run`; a relative ``file.py`` or
    ``file.py::NAME`` is found next to the calling file first, then from the current folder (as
    ``test_for``). ``config``: a :class:`~shardfuzz.RunConfig`, or its fields as keywords (on top
    of the pytest options when under pytest).
    """
    here = caller_dir()
    target, impl = anchored_ref(target, here), anchored_ref(impl, here)
    scope = Scope.current
    if config is not None and fields:
        raise InvalidArgument(f"run_case(config=..., {', '.join(f'{k}=' for k in sorted(fields))}): give one")
    if config is not None and not isinstance(config, RunConfig):
        raise InvalidArgument(f"config={config!r}; must be a shardfuzz.RunConfig")
    if config is None:
        config = (scope.config if scope is not None and scope.config is not None else RunConfig()).replace(
            **fields
        )
    key = (_key(target), _key(impl), config.to_json())
    runner = _RUNNERS.get(key)
    if runner is None:
        hooks = [FailureRecorder(config.failures_dir)] if config.failures_dir else []
        runner = _RUNNERS[key] = Runner(target, impl, config, hooks=hooks)
    if scope is not None:
        scope.add(runner)

    if currently_in_test_context():
        return check(runner, case, label=f"error/tolerance of a passing example {runner.key}")
    return counted_run(runner, case)[0]


def _key(ref: Any) -> Any:
    """A cache key for a target or implementation: a reference as written, else the object's id
    (the cached runner keeps the object alive, so the id stays its own)."""
    return ref if ref is None or isinstance(ref, str) else ("id", id(ref))
