"""How a ``test_for`` test composes with the user's own pytest and Hypothesis set-up.

* It is a Hypothesis test (``is_hypothesis_test``): Hypothesis' pytest plugin accepts ``@settings``,
  ``@seed``, ``@example(case=...)`` and ``@reproduce_failure`` on it, collects its statistics and
  prints them with ``--hypothesis-show-statistics``. The decorators' attributes are handed to the
  ``@given`` test inside (:data:`FORWARDED`).
* Its settings are composed in layers (:func:`~shardfuzz.engine.settings.compose_settings`): the shardfuzz
  profile, what the active profile changes, the ``--shardfuzz-*`` options, the user's
  ``@settings``, ``test_for``'s arguments.
* shardfuzz's own statistics (examples, trigger shares, cases set aside, the closest pass and its
  case) are added to Hypothesis' statistics of the test
  (:func:`shardfuzz.frontends.pytest_scope.statistics`), for ``test_for`` tests and for the
  user's tests that call :func:`shardfuzz.run_case`.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from typing import Any

import pytest
from hypothesis import settings

from shardfuzz.case import Case
from shardfuzz.engine.config import RunConfig
from shardfuzz.engine.failures import FailureRecorder
from shardfuzz.engine.runner import Runner
from shardfuzz.engine.search import build_test, findings_of, run_test, settings_for
from shardfuzz.engine.settings import compose_settings
from shardfuzz.errors import InvalidArgument
from shardfuzz.frontends.pytest_scope import Scope
from shardfuzz.report.tracebacks import hide_for_findings as __tracebackhide__  # noqa: F401 (read by pytest)
from shardfuzz.spec.records import KINDS

#: failure files up to this size are read at collection time for regressions()' filters
MAX_SUMMARY_BYTES = 16 * 2**20
#: what Hypothesis' decorators leave on a test and read from the ``@given`` test when it runs
FORWARDED = (
    "_hypothesis_internal_use_seed",
    "_hypothesis_internal_use_reproduce_failure",
    "hypothesis_explicit_examples",
)


def test_settings(test_fn: Any, config: RunConfig, **explicit: Any) -> Any:
    """The Hypothesis settings of a ``test_for`` test (see :func:`compose_settings`)."""
    base = settings_for(config)
    applied = getattr(test_fn, "_hypothesis_internal_use_settings", None)
    return compose_settings(
        base, config.profile or "shardfuzz-dev", active=settings(), applied=applied, **explicit
    )


def _check_explicit_examples(test_fn: Any) -> None:
    """Each ``@example`` on a ``test_for`` test gives one ``case=`` that is a :class:`~shardfuzz.Case`
    (``@example(case="Case(...)")`` failed in the engine: 'str' object has no attribute 'world_size')."""
    for ex in getattr(test_fn, "hypothesis_explicit_examples", ()):
        args, kwargs = getattr(ex, "args", ()), dict(getattr(ex, "kwargs", {}))
        if args or set(kwargs) != {"case"} or not isinstance(kwargs["case"], Case):
            given = ", ".join([*map(repr, args), *(f"{k}={v!r}" for k, v in kwargs.items())])
            pytest.fail(
                f"@example({given}) on a shardfuzz test: give one case=shardfuzz.Case(target=..., ...)",
                pytrace=False,
            )


def _settings_or_fail(test_fn: Any, config: RunConfig, explicit: dict[str, Any]) -> Any:
    """:func:`test_settings`, or the test fails with the message alone: not 75 lines of the plugin's
    frames, nor the message twice (failed inside the ``except``, it came again under "During
    handling of the above exception")."""
    try:
        return test_settings(test_fn, config, **explicit)
    except InvalidArgument as e:
        refused = str(e)
    pytest.fail(refused, pytrace=False)


def run_target_test(
    test_fn: Any, target: Any, impl: Any, config: RunConfig, tested: Callable[[Any], None], **explicit: Any
) -> Runner:
    """The body of a ``test_for`` test: the covering rows and the Hypothesis search over ``target``'s
    cases with :func:`test_settings`; an expected failure becomes a strict xfail. ``tested`` is
    told the target first. Returns the runner."""
    _check_explicit_examples(test_fn)
    recorder = FailureRecorder(config.failures_dir)
    runner = Runner(target, impl, config, hooks=[recorder])
    tested(runner.target)
    if Scope.current is not None:
        Scope.current.add(runner)
    expected = runner.target.expected_failures.get(runner.impl_name)
    test = build_test(runner, _settings_or_fail(test_fn, config, explicit))
    for attr in FORWARDED:
        if hasattr(test_fn, attr):
            setattr(test.shardfuzz_given, attr, getattr(test_fn, attr))  # type: ignore[attr-defined]
    try:
        run_test(test)  # a deadline or Ctrl-C after a finding raises that finding
    except BaseException as e:
        found = findings_of(e)
        for path in recorder.settle_run(found):  # each distinct finding in a file that holds it
            # the CLI's summary names it; pytest's output did not (a new user looked for it). A note
            # as Python 3.11's add_note writes it, which pytest shows on 3.10 too
            # with the import path the rerun line has (a new user's replay of a target that
            # imports their package, as printed, failed: No module named 'mylib')
            note = f"shardfuzz: failure file: {path} ({runner.import_path_prefix()}shardfuzz replay {path})"
            setattr(e, "__notes__", [*getattr(e, "__notes__", []), note])  # noqa: B010 (3.10's BaseException has none)
        if found and getattr(found[0], "cut_short", None) == "interrupted":
            pytest.exit(f"{found[0].report}\nshardfuzz: interrupted", returncode=1)
        if found and expected is None and Scope.current is not None and not Scope.current.full_trace:
            # every frame is the engine's (Hypothesis' stand-in for the @given test inside, too,
            # which no __tracebackhide__ reaches): the report alone says it all
            raise e.with_traceback(None) from e.__cause__
        if expected is None or not found:
            raise
        unlike = unlike_the_record(expected, found[0])
        if unlike:  # another bug where the known one was: never hidden behind its xfail
            pytest.fail(
                f"{runner.key} is listed as an expected failure ({expected.description}), but this "
                f"finding is another: {unlike}\n{found[0].report}",
                pytrace=False,
            )
        pytest.xfail(f"expected failure: {expected.description}")
        raise  # under --runxfail pytest.xfail returns: the finding is the test's outcome
    if expected is not None:
        pytest.fail(
            f"{runner.key} is listed as an expected failure ({expected.description}) but passed",
            pytrace=False,
        )
    return runner


def unlike_the_record(expected: Any, finding: Any) -> str:
    """How ``finding`` differs from what an expected failure's record says it gives: another kind,
    or (a mismatch) other wrong outputs than its ``Expect(outputs=...)``; empty where it is alike.
    The shrunk case's world and sizes are left to ``assert_planted_bug_found``, whose budget and
    settings the record's are (a ``test_for`` run may shrink under the user's)."""
    expect = expected.expect
    if finding.kind not in expect.kinds:
        return f"a {finding.kind!r} finding, where the record expects {' or '.join(map(repr, expect.kinds))}"
    wrong = tuple(getattr(finding, "outputs", None) or ())
    if finding.kind == "mismatch" and not expect.allows_outputs(wrong):
        return f"wrong outputs {wrong}, which the record's Expect(outputs={expect.outputs!r}) does not allow"
    return ""


test_settings.__test__ = False  # type: ignore[attr-defined]  # a helper, not a test to collect


def names_filter(value: Any, what: str, allowed: tuple[str, ...] | None = None) -> frozenset[str] | None:
    """A ``regressions()`` filter: None (no filter), a name, a :class:`~shardfuzz.Target` (its
    name) or an iterable of them; InvalidArgument naming ``what``, the value and what is allowed."""
    if value is None:
        return None
    items = [value] if isinstance(value, str) or hasattr(value, "name") else value
    try:
        names = frozenset(getattr(v, "name", v) for v in items)
    except TypeError:
        names = frozenset({None})  # not iterable: refused below
    if not names or not all(isinstance(n, str) and n for n in names):
        raise InvalidArgument(f"regressions({what}={value!r}); must be a name or a list of names")
    if allowed is not None and not names <= set(allowed):
        bad = sorted(names - set(allowed))
        raise InvalidArgument(
            f"regressions({what}={value!r}): {bad[0]!r} is not one; allowed: {', '.join(allowed)}"
        )
    return names


def _read_json(path: str) -> Any:
    with open(path) as f:  # closed here: an unclosed one was a ResourceWarning in users' suites
        return json.load(f)


def select_failure_files(
    files: list[str], *, target: Any = None, impl: Any = None, kind: Any = None, planted: bool = False
) -> list[str]:
    """The failure files that ``regressions()``'s filters keep, read at collection time from each
    file's ``target``, ``impl``, ``kind`` and ``planted`` fields (nothing is imported). A file that
    cannot be read as a JSON object is kept: its test then fails with the reason, never hidden.
    A file written before failure files said ``planted`` is decided when its test runs."""
    if not isinstance(planted, bool):
        raise InvalidArgument(f"regressions(planted={planted!r}); must be True or False")
    filters = {
        "target": names_filter(target, "target"),
        "impl": names_filter(impl, "impl"),
        "kind": names_filter(kind, "kind", KINDS),
    }
    kept = []
    for path in files:
        try:  # an oversized file is not parsed here: its test refuses it with the reason
            record = _read_json(path) if os.path.getsize(path) <= MAX_SUMMARY_BYTES else None
        except (OSError, ValueError, RecursionError):  # RecursionError: nested too deep to decode
            record = None
        if not isinstance(record, dict):
            kept.append(path)
            continue
        # a field of another type (a list: unhashable) is no name a filter keeps: the file is kept,
        # and its test refuses it with the reason (it stopped the whole session at collection)
        read = {field: record.get(field) for field in filters}
        if any(not isinstance(v, (str, type(None))) for v in read.values()):
            kept.append(path)
            continue
        if any(names is not None and read[field] not in names for field, names in filters.items()):
            continue
        if record.get("planted") is True and not planted:
            continue
        kept.append(path)
    return kept
