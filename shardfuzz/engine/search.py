"""The Hypothesis glue: the ``@given`` test around a runner, :func:`run` and its :class:`Result`.

Hypothesis runs only in the driver, with a single ``case`` argument; ranks never call ``@given``.
Hypothesis does the search and the shrinking; there is no search loop of ours.
"""

from __future__ import annotations

import copy
import dataclasses
import importlib
import os
import sys
import time
import traceback
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import hypothesis
from hypothesis.control import current_build_context
from hypothesis.errors import Flaky, Unsatisfiable, UnsatisfiedAssumption

from shardfuzz.case import Case
from shardfuzz.engine.config import RunConfig, check_exclude_keys, check_tolerance_outputs
from shardfuzz.engine.covering import CaseRun, CoveringRun, counted_run, seeded_database
from shardfuzz.engine.database import keyed_database
from shardfuzz.engine.failures import FailureRecorder
from shardfuzz.engine.hooks import Deadline, RunHooks, StickyInterrupt, TimeUp, example_choices, example_order
from shardfuzz.engine.runner import Runner, Stats
from shardfuzz.engine.settings import build_settings
from shardfuzz.engine.shared_db import hypothesis_database
from shardfuzz.errors import (
    ExternalFault,
    Finding,
    InfrastructureError,
    InvalidArgument,
    RankHang,
    TargetError,
    Unsupported,
)
from shardfuzz.report.tracebacks import hide_for_findings as __tracebackhide__  # noqa: F401 (read by pytest)
from shardfuzz.spec.exclude import Excluded
from shardfuzz.spec.sampling import stable_seed

if TYPE_CHECKING:
    from shardfuzz.engine.finding import FindingContext

_EXCEPTION_GROUP: type[Any] | None  # has ``.exceptions``
if sys.version_info >= (3, 11):
    _EXCEPTION_GROUP = BaseExceptionGroup  # noqa: F821 (a builtin since 3.11; ruff targets 3.10)
else:  # pragma: no cover; Hypothesis brings the backport on 3.10
    try:
        _EXCEPTION_GROUP = importlib.import_module("exceptiongroup").BaseExceptionGroup
    except ImportError:
        _EXCEPTION_GROUP = None


def check(
    runner: Runner,
    case: Case,
    #: Hypothesis prints the highest score under this label, a failing test too: only passing
    #: examples have one (a failing one raises first), so the label says so
    label: str = "error/tolerance of a passing example",
    repeats: RepeatedCases | None = None,
    answer: bool = False,
) -> float:
    """Run one case inside a Hypothesis test: statistics, events and ``target(label=label)`` included.
    ``answer``: this Hypothesis run has made a finding (it shrinks and looks for other bugs): a case
    already in ``repeats`` gets its first verdict back instead of a run, and every passing ratio is
    a target score, not only a measured one."""
    StickyInterrupt.check()  # a Ctrl-C that Python swallowed (in a gc callback) still stops the run
    try:
        ran = counted_run(runner, case) if repeats is None else repeats.run(runner, case, answer=answer)
    except (Unsupported, ExternalFault) as e:
        if isinstance(e, Unsupported):
            hypothesis.event(f"{'excluded' if isinstance(e, Excluded) else 'unsupported'}: {e.reason}")
        else:
            hypothesis.event(f"external fault: {str(e).split(' from outside')[0]}")
        hypothesis.reject()
    except Finding as f:  # its conditions are events too: Hypothesis' shares read as shardfuzz's
        for t in sorted(getattr(f, "reached", ())):
            hypothesis.event(t)
        raise
    for t in ran.reached:
        hypothesis.event(t)
    # until a finding, only a measured ratio steers the search: a sure pass's upper bound (judged
    # without the noise term) can sit near 1 where the case is nowhere near failing, and won the
    # climb over the measured near misses (float32 bounds of 0.9 over a bfloat16 case measured at
    # 0.8). After a finding (``answer``) every ratio does, as before: the climb toward near misses
    # then finds the same bug again, and Hypothesis shrinks the shortest failing case of the two,
    # which need not shrink as far (ring_allreduce/fp16_wire: a covering row's edge value, minimal
    # at 2 ranks, was passed over for large values whose sum overflows only at 4)
    if answer or not ran.upper_bound:
        hypothesis.target(min(ran.ratio, 1.0), label=label)
    return ran.ratio


class RepeatedCases:
    """The verdicts of the cases run since a run's first finding, by case, each handed back when its
    case comes again. Shrinking asks for the same case again and again: choice sequences that differ
    only where the case does not read them (a choice a later one overrides, an option of a branch
    not taken) are new to Hypothesis' cache but not to the case (58 of the 155 cases of
    ring_attention/naive_merge's proof were repeats, and a crash that replaces the pool costs
    0.2-0.7 s a repeat). A case's inputs and noise draws are seeded from it and its kernels are
    deterministic, so its first verdict stands: a pass, a rejection, a finding. Not a hang, which
    may be the machine's load: that case runs again. Hypothesis' final replay of the minimal case
    always runs, so a failure that does not reproduce is still reported as flaky. Repeats are
    counted (``Stats.repeats``), not run and not counted as examples."""

    #: verdicts kept at most (a long campaign goes on searching after its first finding)
    LIMIT = 4096

    def __init__(self) -> None:
        self.verdicts: dict[str, CaseRun | tuple[BaseException, Any]] = {}

    def run(self, runner: Runner, case: Case, *, answer: bool) -> CaseRun:
        """Run ``case``, or with ``answer`` (a finding was made) hand back its first verdict. Before
        a finding only findings are kept (the first one is the case that comes next)."""
        key = repr(case) if answer else ""  # one line that rebuilds the case: equal cases, equal keys
        final = answer and current_build_context().is_final  # the replay Hypothesis reports: runs, kept as is
        if answer and key in self.verdicts and not final:
            runner.stats.repeats += 1
            first = self.verdicts[key]
            if isinstance(first[0], BaseException):
                # a copy (whose choices the run's hooks set afresh) with the first run's traceback
                again = copy.copy(first[0])
                again.__dict__.update(vars(first[0]))
                raise again.with_traceback(first[1])
            return first
        try:
            verdict = counted_run(runner, case)
        except (Unsupported, Finding) as e:
            kept = (answer or isinstance(e, Finding)) and not final and not isinstance(e, RankHang)
            if kept and len(self.verdicts) < self.LIMIT:
                traceback.clear_frames(e.__traceback__)  # keep where it was raised, not the frames' tensors
                self.verdicts[key or repr(case)] = (e, e.__traceback__)
            raise
        if answer and len(self.verdicts) < self.LIMIT:
            self.verdicts[key] = verdict
        return verdict


#: the database key of every shardfuzz test: Hypothesis' digest of 0.1's ``test_case`` (5a6d863)
DATABASE_KEY = bytes.fromhex(
    "c808f5934700e9e68b738079c7c1a258fa3b3b48e52bdd4f988191a646ed4d507b2217b992c2d3281c4ed944983eb0af"
)


def stable_identity(runner: Runner) -> str:
    """The target, the resolved implementation (module and qualified name, its bound arguments) and
    the backend: what derandomized seeds and database keys come from, never the path as typed."""
    ref = runner.impl_ref
    where, sep, name = ref.ref.partition("::")
    resolved = f"{os.path.splitext(os.path.basename(where))[0]}:{name}" if sep else ref.ref
    bound = "".join(f",{k}={v!r}" for k, v in ref.kwargs)
    return f"{runner.target.name}/{resolved}{bound}/{runner.backend}"


#: the examples of one Hypothesis run in a derandomized budget. Hypothesis' own derandomized runs of
#: different ``max_examples`` diverge within a few examples (its first tenth is size-capped and its
#: target phase starts halfway: docs/design.md, D45), so a budget of N is ``ceil(N / CHUNK)`` runs of this size on a seed
#: schedule, the last one cut short by a quota: N's examples are the first N of any larger budget
CHUNK = 30


#: the event of a case drawn past its chunk's quota (Hypothesis counts it as a passing test case)
NOT_RUN = (
    f"drawn, not run: past this run's share of the budget (a derandomized budget runs as runs of {CHUNK})"
)


@dataclasses.dataclass(frozen=True)
class Chunk:
    """One Hypothesis run of a derandomized budget: its ``max_examples``, how many of its examples
    are run (``quota``; the rest are drawn and skipped) and the key its seed comes from."""

    max_examples: int
    quota: int
    seed_key: str


def chunks(identity: str, budget: int, rows: int) -> list[Chunk]:
    """The Hypothesis runs of a derandomized ``budget`` after ``rows`` covering rows: the first one
    is what the rows leave of :data:`CHUNK` (at least one example, as without chunks), the others
    :data:`CHUNK` each with seeds from ``identity#k``. Every chunk but the last runs whole."""
    first = max(1, CHUNK - rows)
    left = max(1, budget - rows)
    plan = [Chunk(first, min(first, left), identity)]
    left -= plan[0].quota
    while left > 0:
        plan.append(Chunk(CHUNK, min(CHUNK, left), f"{identity}#{len(plan)}"))
        left -= plan[-1].quota
    return plan


class Quota:
    """How many examples of a chunk run: the rest are drawn by Hypothesis and skipped. After a
    finding every call runs (they are Hypothesis' shrinking and its search for other bugs)."""

    def __init__(self) -> None:
        self.left, self.ran, self.found = 0, 0, False

    def start(self, quota: int) -> None:
        self.left, self.ran, self.found = quota, 0, False

    def spent(self) -> bool:
        return self.left <= 0 and not self.found

    def count(self) -> None:
        self.left -= 1
        self.ran += 1


class OutsideBounds:
    """A case drawn outside the bounds its strategy declares (:meth:`Runner.check_drawn`): the
    strategy's error, not the implementation's, raised as it is. Hypothesis shrinks it like any
    failure, so every later call runs (not skipped by the quota, which Hypothesis' replay read as
    flaky), and nothing runs on the ranks after it: the shrink looks for a smaller draw outside."""

    def __init__(self) -> None:
        self.seen = False

    def check(self, runner: Runner, case: Case, quota: Quota) -> None:
        try:
            runner.check_drawn(case)
        except TargetError:
            quota.found = self.seen = True
            raise
        if self.seen:
            hypothesis.reject()


def build_test(
    runner: Runner,
    settings: Any = None,
    *,
    database: Any = "default",
    rows: bool = True,
    seed_salt: str = "",
) -> Callable[[], None]:
    """The test for a runner: first the covering rows (:mod:`shardfuzz.engine.covering`) as plain cases,
    then the ``@given`` test (one ``case`` argument, settings built now from the runner's
    configuration unless given, a database keyed by target/implementation/backend). A failing row
    is handed to Hypothesis through the database, so it is replayed first and shrunk; derandomized
    runs are seeded from :func:`stable_identity` (and ``seed_salt``: another seed schedule, for
    ``benchmarks/budget.py``) and split into :func:`chunks`."""
    cfg = runner.config
    s = settings if settings is not None else settings_for(cfg)
    if database != "default":
        s = type(s)(s, database=database)
    identity = stable_identity(runner)
    if s.database is not None:
        s = type(s)(s, database=keyed_database(s.database, identity))
    smallest = SmallestFindings()
    covering = CoveringRun(runner, rows)
    quota = Quota()
    repeats = RepeatedCases()
    outside = OutsideBounds()

    def test_case(case: Case) -> None:
        if quota.spent():  # past this chunk's share of the budget: drawn, not run (see CHUNK)
            hypothesis.event(NOT_RUN)  # Hypothesis' statistics count it as a passing test case
            return
        outside.check(runner, case, quota)
        try:
            # before a finding every case runs, so a budget's examples stay the same cases
            check(runner, case, repeats=repeats, answer=quota.found)
        except UnsatisfiedAssumption:  # rejected (unsupported, excluded, a fault): not an example
            raise
        except (
            BaseException
        ) as e:  # any failure, re-raised: Hypothesis replays and shrinks it, so every later call runs
            quota.found = True
            if isinstance(e, Finding):
                smallest.on_finding(e.context, e)
            raise
        quota.count()

    ident = "".join(c if c.isalnum() else "_" for c in runner.key)
    test_case.__name__ = test_case.__qualname__ = f"shardfuzz_{ident}"

    def test() -> None:
        runner.stats.budget = s.max_examples
        failing = covering.run()
        if failing is not None:  # kept, so a deadline before Hypothesis replays it cannot lose it
            smallest.on_finding(covering.finding.context, covering.finding)
        user_seed = getattr(test_case, "_hypothesis_internal_use_seed", None)  # a user's @seed: one run
        if failing is None and s.derandomize and user_seed is None:
            run_chunks(
                runner, test_case, s, chunks(identity + seed_salt, s.max_examples, covering.examples), quota
            )
            return
        # the rows count toward the budget: Hypothesis gets what they left of max_examples
        quota.start(sys.maxsize)  # no quota: Hypothesis' own max_examples is the budget
        budget = type(s)(s, max_examples=max(1, s.max_examples - covering.examples))
        runner.stats.hypothesis_runs += 1
        given_test(runner, test_case, budget, identity, [failing.choices] if failing else [])()
        if failing is not None:  # the row failed, but not when Hypothesis replayed it
            raise covering.not_reproduced(failing)

    test.__name__ = test.__qualname__ = test_case.__name__
    test.shardfuzz_smallest, test.shardfuzz_given = smallest, test_case  # type: ignore[attr-defined]  # run_test, test_for
    return test


def run_chunks(runner: Runner, fn: Callable, s: Any, plan: list[Chunk], quota: Quota) -> None:
    """Hypothesis' runs of a derandomized budget, one per :class:`Chunk` (a finding raises out)."""
    for chunk in plan:
        quota.start(chunk.quota)
        runner.stats.hypothesis_runs += 1
        given_test(runner, fn, type(s)(s, max_examples=chunk.max_examples), chunk.seed_key, [])()
        if quota.ran < chunk.quota:  # Hypothesis ran out of new cases: another seed draws the same
            return


def given_test(runner: Runner, fn: Callable, s: Any, identity: str, seeds: list) -> Callable[[], None]:
    derandomized = s.derandomize
    if seeds:  # Hypothesis replays database entries first, and shrinks those that fail
        s = type(s)(s, derandomize=False, database=seeded_database(s.database, seeds))
    test = hypothesis.given(case=runner.strategy())(fn)
    # Hypothesis keys its database by a digest of the test function's source, which any edit of
    # test_case would change, orphaning every saved example; shardfuzz pins the key it had in 0.1
    # (the database is keyed per target/implementation/backend by the prefix, not by this key)
    test._hypothesis_internal_database_key = DATABASE_KEY  # type: ignore[attr-defined]
    if derandomized and getattr(fn, "_hypothesis_internal_use_seed", None) is None:  # a user's @seed wins
        test = hypothesis.seed(stable_seed(identity))(test)  # before the settings: seed() drops the database
    return s(test)


def run_test(test: Callable[[], None]) -> None:
    """Call a test made by :func:`build_test`. A deadline (:class:`TimeUp`) or Ctrl-C that stops
    Hypothesis after a finding raises the smallest finding of each kind seen so far instead (an
    exception group for several), each marked ``cut_short = "deadline"`` or ``"interrupted"`` with
    a note at the top of its report: a finding is never lost because shrinking was cut short."""
    smallest: SmallestFindings | None = getattr(test, "shardfuzz_smallest", None)
    if smallest is not None:
        smallest.clear()
    try:
        with StickyInterrupt.armed():
            test()
    except BaseException as exc:
        why = _stopped_by(exc)
        if smallest is not None and why is not None:
            _keep_interrupted_findings(exc, smallest)
        cut = smallest.cut_short(why, _failure_of(exc)) if smallest is not None and why is not None else None
        if cut is None and smallest is not None:
            cut = _rejected_on_replay(exc, smallest)
        if cut is None:
            raise
        raise cut from None


def _keep_interrupted_findings(exc: BaseException, smallest: SmallestFindings) -> None:
    """Hand ``smallest`` each finding that the interrupt in ``exc`` was raised while handling: a
    SIGTERM that landed while the runner's hooks wrote a finding's failure file (before the search
    saw the finding) replaced it, and the campaign ended "interrupted", exit 130, its finding in a
    file but not in the report (seen once in clean-ci, the SIGINT-ignored campaign test)."""
    for e in (c for leaf in _leaves(exc) for c in _handling(leaf)):
        context = getattr(e, "context", None)
        if isinstance(e, Finding) and context is not None and all(e is not f for f in smallest.findings()):
            smallest.on_finding(context, e)


def _rejected_on_replay(exc: BaseException, smallest: SmallestFindings) -> BaseException | None:
    """Hypothesis' final replay of a failing case was rejected (refused as unsupported, an
    external fault): it raises Flaky with no finding in it, and a new user's campaign over a
    nondeterministic bf16 kernel ended in that raw traceback. The findings seen are reported,
    each with a note, as the smallest failing case found (its shrink stopped there)."""
    if not isinstance(exc, Flaky) or findings_of(exc) or not smallest:
        return None
    note = (
        "shardfuzz: this failure did not fail again when Hypothesis replayed it: the case was "
        "refused the second time (unsupported, or a fault from outside the example), so shrinking "
        "stopped and this is the smallest failing case seen. Code that answers differently on the "
        "same case (a kernel that reads uninitialised memory, state carried between examples) "
        "does this: run it again with `shardfuzz case`.\n"
    )
    return _raised([_noted(f, note, flaky=True) for f in smallest.findings()], "not reproduced on replay")


def _leaves(exc: BaseException) -> list[BaseException]:
    """``exc``, or every exception in it where it is a group (Hypothesis groups what its final
    replays raised), nested groups flattened."""
    if _EXCEPTION_GROUP is not None and isinstance(exc, _EXCEPTION_GROUP):
        return [leaf for e in exc.exceptions for leaf in _leaves(e)]
    return [exc]


#: what stops a run after a finding, by precedence: Ctrl-C, the deadline, the fuzzer's own failure
#: (:class:`InfrastructureError`: ranks lost for good, during a shrink too)
_STOPS = (("interrupted", KeyboardInterrupt), ("deadline", TimeUp), ("failed", InfrastructureError))


def _stopped_by(exc: BaseException) -> str | None:
    """What in ``exc`` (or its group) stopped the run: ``"interrupted"``, ``"deadline"`` or
    ``"failed"`` (:data:`_STOPS`); else None. An error raised while one of those was being handled
    counts as it: a SIGTERM that landed in Hypothesis' own bookkeeping left its span stack empty,
    and the IndexError its cleanup then raised lost a campaign's finding (exit 3, no report)."""
    leaves = [c for e in _leaves(exc) for c in _handling(e)]
    return next((why for why, kind in _STOPS if any(isinstance(e, kind) for e in leaves)), None)


def _handling(exc: BaseException, depth: int = 16) -> list[BaseException]:
    """``exc`` and the exceptions it was raised while handling (its ``__context__`` chain)."""
    chain = [exc]
    while len(chain) < depth and chain[-1].__context__ is not None and chain[-1].__context__ not in chain:
        chain.append(chain[-1].__context__)
    return chain


def _failure_of(exc: BaseException) -> str | None:
    """The message of the fuzzer's own failure in ``exc`` (or in its group), if any."""
    return next((str(e) for e in _leaves(exc) if isinstance(e, InfrastructureError)), None)


_CUT_SHORT = {
    "deadline": "the deadline fell",
    "interrupted": "the run was interrupted",
    "failed": "the fuzzer itself failed",
}


class SmallestFindings(RunHooks):
    """The smallest finding of each kind seen so far in one Hypothesis run, in Hypothesis' own
    order (shorter, simpler choice sequences first; where that cannot be read, the latest wins:
    while shrinking, Hypothesis only accepts smaller failing cases)."""

    def __init__(self) -> None:
        self.clear()

    def clear(self) -> None:
        self.best: dict[str, tuple[tuple, Finding]] = {}
        self._seen = 0

    def __bool__(self) -> bool:
        return bool(self.best)

    def on_finding(self, context: FindingContext, finding: Finding) -> None:  # noqa: ARG002 (the hook signature)
        self._seen += 1
        finding.choices = example_choices() or getattr(finding, "choices", None)  # type: ignore[attr-defined]
        order = example_order()
        key = (0, order) if order is not None else (1, -self._seen)
        old = self.best.get(finding.kind)
        if old is None or key < old[0]:
            self.best[finding.kind] = (key, finding)

    def findings(self) -> list[Finding]:
        """The smallest finding of each kind, smallest first."""
        return [f for _, f in sorted(self.best.values(), key=lambda kf: kf[0])]

    def cut_short(self, why: str, failure: str | None = None) -> BaseException | None:
        """The findings, marked as cut short by ``why`` (None: nothing was found); ``failure``: the
        fuzzer's own failure that cut them, kept on each (``fuzzer_failure``)."""
        marked = [_mark_cut_short(f, why, failure) for f in self.findings()]
        return _raised(marked, "shrinking cut short") if marked else None


def _mark_cut_short(finding: Finding, why: str, failure: str | None = None) -> Finding:
    cause = _CUT_SHORT.get(why, why) + (f" ({failure})" if failure else "")
    note = (
        f"shardfuzz: {cause} before Hypothesis finished shrinking this failure: "
        "shrinking was cut short, and this is the smallest failing case found so far (not "
        "necessarily minimal).\n"
    )
    return _noted(finding, note, cut_short=why, fuzzer_failure=failure)


def _noted(finding: Finding, note: str, **marks: Any) -> Finding:
    """A copy of ``finding`` whose report starts with ``note``, with ``marks`` set on it."""
    marked = copy.copy(finding)
    marked.__dict__.update(vars(finding))
    marked.report = note + finding.report
    marked.args = (marked.report,)
    for name, value in marks.items():
        setattr(marked, name, value)
    return marked


def _raised(marked: list[Finding], why: str) -> BaseException:
    """One finding as it is; several as one exception group, ``why`` in its message."""
    if len(marked) == 1 or _EXCEPTION_GROUP is None:
        return marked[0]
    return _EXCEPTION_GROUP(f"{len(marked)} distinct failures ({why})", marked)


def settings_for(config: RunConfig, *, quiet: bool = False, **overrides: Any) -> hypothesis.settings:
    """Hypothesis settings from a configuration's profile, budget and derandomize flag (``quiet``:
    no Hypothesis output, for runs that report through a :class:`Result`)."""
    kw: dict[str, Any] = dict(max_examples=config.max_examples, derandomize=config.derandomize)
    kw["verbosity"] = hypothesis.Verbosity.quiet if quiet else None
    kw["database"] = hypothesis_database(config.database, config.fleet) if config.database else None
    kw.update(overrides)
    built = build_settings(config.profile, **kw)
    # build_settings reads None as "not set" (the profile's value); a caller's explicit
    # database=None means no database (a 1-rank try read the profile's .hypothesis instead)
    if "database" in overrides and overrides["database"] is None:
        built = hypothesis.settings(built, database=None)
    return built


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
    #: a deadline or Ctrl-C stopped Hypothesis after a finding: ``case`` is the smallest failing
    #: case seen so far, not necessarily the minimal one
    shrink_cut_short: bool = False
    #: Ctrl-C stopped the run (a finding was kept: ``found`` and ``shrink_cut_short`` are set)
    interrupted: bool = False
    #: the fuzzer itself failed after a finding (ranks lost for good): its message (a finding was
    #: kept: ``found`` and ``shrink_cut_short`` are set)
    failed: str | None = None

    def __bool__(self) -> bool:  # truthy when something was found
        return self.found


def findings_of(exc: BaseException) -> list[Finding]:
    """The findings in an exception raised by a Hypothesis test (one, or a group of several)."""
    return [e for e in _leaves(exc) if isinstance(e, Finding)]


def nothing_tested(runner: Runner) -> str:
    """What to say when every case drawn was rejected (Hypothesis' ``Unsatisfiable``): a run that
    tested nothing, which is neither clean nor a finding (a new user's torch TP on Conv2d, mapped to
    Unsupported as the docs say, ended in Hypothesis' traceback and exit 1, which reads as found)."""
    s = runner.stats
    why = [f"unsupported: {k} x{v}" for k, v in s.unsupported.most_common(3)]
    why += [f"excluded as a known failure: {k} x{v}" for k, v in s.excluded.most_common(3)]
    why += [f"external faults x{s.external_faults}"] if s.external_faults else []
    # the covering rows run before Hypothesis: where some passed, the run tested those alone
    if s.examples:
        ran, tested = (
            f"ran its {s.examples} covering rows, then every case Hypothesis drew was rejected",
            f"only those {s.examples} cases were tested",
        )
    else:
        ran, tested = "ran no example, every case drawn was rejected", "nothing was tested"
    return (
        f"impl={runner.impl_name!r}: target {runner.target.name!r} {ran} "
        f"({'; '.join(why) or 'no reason counted'}): {tested}. Draw only cases it supports "
        "(--world-sizes, --dtypes, --option; a target's strategy), or fix what refuses them"
    )


def search(runner: Runner, settings: Any = None, *, database: Any = "default", rows: bool = True) -> Result:
    """One Hypothesis run over ``runner``'s cases, after the covering rows unless ``rows`` is False;
    a :class:`Result` (it does not raise on findings).

    A deadline or Ctrl-C after a finding returns that finding (``shrink_cut_short``); Ctrl-C before
    any finding raises KeyboardInterrupt."""
    test = build_test(runner, settings, database=database, rows=rows)
    result = Result(runner.target.name, runner.impl_name, runner.backend, found=False, stats=runner.stats)
    t0 = time.perf_counter()
    try:
        run_test(test)
    except TimeUp:
        result.out_of_time = True
    except Unsatisfiable as exc:  # Hypothesis ran no example: every case drawn was rejected
        raise InvalidArgument(nothing_tested(runner)) from exc
    except BaseException as exc:
        findings = findings_of(exc)
        if not findings:
            raise
        result.found = True
        result.flaky = isinstance(exc, Flaky) or any(getattr(f, "flaky", False) for f in findings)
        result.failures = findings
        first = findings[0]
        result.kind, result.case, result.report = first.kind, first.case, first.report
        why = getattr(first, "cut_short", None)
        if why is not None:
            result.shrink_cut_short = True
            result.out_of_time = why == "deadline"
            result.interrupted = why == "interrupted"
            result.failed = getattr(first, "fuzzer_failure", None)
        if isinstance(exc, Flaky):
            result.report = (
                "Hypothesis reports this failure as flaky (it did not reproduce):\n" + result.report
            )
        result.report += _also_raised(exc)
    finally:
        runner.stats.elapsed += time.perf_counter() - t0
    return result


def _also_raised(exc: BaseException) -> str:
    """What a group of Hypothesis' final replays held besides findings (the target's code raising
    on another case, an error of shardfuzz's own), with tracebacks: it was dropped unsaid (found by
    review). The findings stay the result; this is said after the first one's report."""
    others = [e for e in _leaves(exc) if not isinstance(e, Finding)]
    if not others:
        return ""
    told = "".join(
        "".join(traceback.format_exception(type(e), e, e.__traceback__)).rstrip() + "\n" for e in others
    )
    return f"\nshardfuzz: the search also raised, on other examples (not findings):\n{told}"


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
            ``device=``, ``deterministic=``, ``database=``, ``fleet=``), not both. ``tolerance=``
            takes a :class:`Tolerance` or a mapping output name -> ``OutputTolerance`` / ``{"rtol":
            X, "atol": Y}`` / ``(rtol, atol)`` (per-output overrides on the default); a name must be
            an output of the target (not checked for outputs that depend on the case).
        hooks: :class:`~shardfuzz.engine.hooks.RunHooks` (a failure-file recorder for ``failures_dir``, a
            deadline for ``deadline``). database: a Hypothesis database, None, or "default" (the config's).
        settings: Hypothesis settings instead of the configuration's profile and budget.
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
    recorder = FailureRecorder(cfg.failures_dir) if cfg.failures_dir is not None else None
    if recorder is not None:
        all_hooks.append(recorder)
    if cfg.deadline is not None:
        all_hooks.append(Deadline.after(cfg.deadline))
    runner = Runner(target, impl, cfg, hooks=all_hooks)
    check_tolerance_outputs([runner.target], cfg.tolerance, "tolerance")
    check_exclude_keys([runner.target], cfg.exclude, "exclude", cfg.world_sizes)
    result = search(
        runner, settings if settings is not None else settings_for(cfg, quiet=True), database=database
    )
    if recorder is not None:
        recorder.settle_run(result.failures)
    return result
