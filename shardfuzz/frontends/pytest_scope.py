"""One pytest test while it runs (:class:`Scope`, set around every test by the pytest plugin): the
plugin's run configuration for :func:`shardfuzz.run_case`, the runners the test used, and
shardfuzz's statistics of them added to Hypothesis' statistics of the test
(``--hypothesis-show-statistics``).

The plugin enters :func:`test_scope` around every test of a session, shardfuzz's or not, so this
module imports no engine module and neither torch nor Hypothesis.
"""

from __future__ import annotations

import contextlib
import warnings
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from shardfuzz.engine.stats import Stats
from shardfuzz.report.closest_pass import (
    closest_pass_case,
    closest_pass_words,
    measure_closest_pass,
    recheck_closest_pass,
)

if TYPE_CHECKING:
    from shardfuzz.engine.config import RunConfig
    from shardfuzz.engine.runner import Runner


class Scope:
    """One pytest test while it runs (set by the plugin): the plugin's configuration, and the
    runners the test used, each with statistics of this test only (the plugin prints them)."""

    current: Scope | None = None

    def __init__(self, config: RunConfig | None = None, *, full_trace: bool = False) -> None:
        self.config = config
        self.full_trace = full_trace  # pytest --full-trace: keep every frame of a finding
        self.runners: list[Runner] = []

    def add(self, runner: Runner) -> None:
        if runner not in self.runners:
            runner.stats = Stats()
            self.runners.append(runner)


def statistics(runner: Runner, measure: bool = False) -> str:
    """shardfuzz's statistics of one runner in one test, in the layout of Hypothesis' own;
    ``measure``: a closest pass judged without the noise term is judged once with it (as the CLI's
    summary does), so the line says what its case measures, then the case of the figure it leads
    with is judged with the recheck's samples (at 0.5 or more: how near a report it came), and the
    conditions the run never reached are named (they read the target's covering pool: drawn once, only when shown)."""
    s = runner.stats
    # cases the test drew itself (run_case in a @given of its own): the run's world sizes and dtypes
    # shaped none of them, and the target's strategy is not what drew them (a new user's header said
    # "world sizes 2; dtypes float64" above bfloat16 cases on 3 ranks)
    own = not (s.rows or s.hypothesis_runs)
    drawn = " (cases drawn by the test's own strategy)" if own else runner.config.restrictions()
    lines = [
        f"  - shardfuzz {runner.key}{drawn}: {s.examples} examples ({s.passed} passed, {s.failures} failing)"
    ]
    if s.rows or s.hypothesis_runs > 1:  # Hypothesis' statistics above are of its last run only
        runs = f"{s.hypothesis_runs} Hypothesis run{'s' if s.hypothesis_runs != 1 else ''}"
        over = (
            f"; {s.examples} examples for a budget of {s.budget}: every covering row runs, then "
            "Hypothesis at least once"
            if s.budget is not None and s.examples > s.budget and not s.failures
            else ""
        )
        lines.append(
            f"    - run as {s.rows} covering row{'s' if s.rows != 1 else ''}, then {runs} (Hypothesis' "
            f"statistics above are of the last run; these are of the whole test){over}"
        )
    if s.examples:
        shares = ", ".join(
            f"{k} {100.0 * v / s.examples:.0f}%" for k, v in sorted(s.triggers.items()) if v > 0
        )
        # a condition at 0% is a blind spot of this test (the CLI's progress line shows it as 0%)
        never = (
            [t for t in runner.progress_conditions() if not s.triggers.get(t)] if measure and not own else []
        )
        lines.append(
            f"    - trigger conditions reached: {shares or 'none'}"
            + (f"; never reached: {', '.join(never)}" if never else "")
        )
    for what, counts in (
        ("rejected as unsupported (not examples)", s.unsupported),
        ("excluded as known failures (not examples)", s.excluded),
    ):
        if counts:
            lines.append(f"    - {what}: " + ", ".join(f"{k} x{v}" for k, v in counts.most_common()))
    if s.external_faults:
        lines.append(f"    - external faults set aside (rank killed from outside): {s.external_faults}")
    if s.closest_pass is not None:
        words, measured = s.closest_pass_words, None
        if measure:
            failed = None
            if s.closest_pass_upper_bound:
                measured, failed = measure_closest_pass(runner)
            rechecked = None
            if not failed:
                rechecked, failed = recheck_closest_pass(runner, measured)
            words = closest_pass_words(
                s.worst_pass_ratio,
                s.closest_pass_upper_bound,
                measured,
                failed,
                s.measured_pass_ratio,
                rechecked,
            )
        case = closest_pass_case(
            s.closest_pass, s.closest_pass_upper_bound, measured, s.measured_pass_ratio, s.measured_pass_case
        )
        lines.append(f"    - closest pass: error/tolerance {words} at {case!r}")
    if s.margin is not None:
        # of every failing example, the shrink's too: a new user read 1.16 beside a report's 8.2e5x
        lines.append(
            f"    - smallest failing margin: error/tolerance {s.margin:.3g} (of every failing example, "
            "the shrink's included; each finding's own margin is in its report)"
        )
    lines += [f"    - {line}" for line in unused_exclusions(runner)]
    return "\n".join(lines)


def unused_exclusions(runner: Runner) -> list[str]:
    """An exclusion that excluded nothing because no case had a key it reads (as the CLI says it)."""
    return [
        f"exclude {text!r} excluded nothing: {n} case{'s' if n != 1 else ''} had no {key} (a misspelling?)"
        for text, (key, n) in runner.stats.exclusions_on_absent_keys().items()
    ]


@contextlib.contextmanager
def test_scope(item: Any, config: RunConfig | None) -> Iterator[None]:
    """While one pytest test runs: the runners it uses, and their statistics added to
    Hypothesis' statistics of the test afterwards (pytest's own ``item.hypothesis_statistics``,
    which Hypothesis' plugin copies into the report and prints with ``--hypothesis-show-statistics``)."""
    scope = Scope(config, full_trace=bool(item.config.getoption("fulltrace", False)))
    outer, Scope.current = Scope.current, scope
    try:
        yield
    finally:
        Scope.current = outer
        for r in scope.runners:  # shown without --hypothesis-show-statistics too
            for line in unused_exclusions(r):
                warnings.warn(f"shardfuzz {r.key}: {line}", UserWarning, stacklevel=1)
        shown = bool(item.config.getoption("hypothesis_show_statistics", False))
        ours = "\n".join(statistics(r, measure=shown) for r in scope.runners)
        if ours:
            head = getattr(item, "hypothesis_statistics", None) or f"{item.nodeid}:\n"
            item.hypothesis_statistics = f"{head.rstrip()}\n{ours}"


test_scope.__test__ = False  # type: ignore[attr-defined]  # a helper, not a test to collect
