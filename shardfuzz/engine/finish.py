"""Finishing a shrink that a campaign's deadline cut.

A campaign's deadline may fall while Hypothesis shrinks a finding: the finding is kept as the
smallest failing case seen so far (:func:`shardfuzz.engine.search.run_test`), which may still carry a
bfloat16 dtype, a x1e4 value profile or a large seed that do not matter. At the end of the
campaign each such finding is shrunk further, within an extra budget (:func:`finish_budget`),
by Hypothesis' own shrinker: a run whose only example is the finding's choice sequence, handed
to Hypothesis through its example database (:func:`shardfuzz.engine.covering.seeded_database`), with the
reuse and shrink phases only. There is no search or shrink loop here.

Whether or not Hypothesis finishes within the budget, the finding says which of its features
(dtype, value profile, seed, sizes, world size, options) are not at the simplest value the
target's strategy draws: after a finished shrink the finding (its signature) needs them; after a cut one they
may just not have been dropped yet.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from typing import Any

from hypothesis import Phase, find, settings
from hypothesis.errors import Unsatisfiable

from shardfuzz.case import Case, one_rank_path
from shardfuzz.engine.finding import FindingContext
from shardfuzz.engine.hooks import Deadline, RunHooks, TimeUp, example_order, grace_seconds
from shardfuzz.engine.runner import Runner
from shardfuzz.engine.search import (
    SmallestFindings,
    check,
    findings_of,
    given_test,
    run_test,
    settings_for,
    stable_identity,
)
from shardfuzz.errors import Finding
from shardfuzz.signature import finding_signature

#: the extra budget, when the configuration does not give one: this share of the campaign's
#: duration, at most MAX_S seconds (so ``--duration D`` ends by 1.25 D plus the grace)
SHARE, MAX_S = 0.25, 120.0


def finish_budget(config: Any) -> float:
    """Seconds to finish cut shrinks after a campaign: ``config.finish_shrink`` when set (0: none),
    else :data:`SHARE` of its deadline, at most :data:`MAX_S` (0 without a deadline)."""
    if config.finish_shrink is not None:
        return float(config.finish_shrink)
    if config.deadline is None:
        return 0.0
    return min(MAX_S, SHARE * config.deadline)


@dataclasses.dataclass
class Finished:
    """What finishing one cut shrink did."""

    finding: Finding  # the further shrunk finding (the original one when nothing smaller was found)
    complete: bool  # Hypothesis finished shrinking within the budget
    seconds: float
    budget: float
    examples: int
    kept: list[str]  # the features not at the strategy's simplest value
    reproduced: bool = True  # False: the finding's case passed when Hypothesis replayed it
    cut_case: Case | None = None  # the case the deadline left it at

    def describe(self) -> str:
        if self.budget <= 0:  # the findings finished before it spent the whole extra budget
            head = "shrinking still cut short: no time was left of the extra budget: not necessarily minimal"
            return head + (f"; not dropped: {', '.join(self.kept)}" if self.kept else "")
        spent = f"{self.seconds:.1f} s of an extra {self.budget:.1f} s, {self.examples} examples"
        if self.seconds > self.budget + 1.0:  # the last example ran on past the budget's end
            spent += f"; an example still running at its end may go on for up to {grace_seconds():g} s"
        if not self.reproduced:
            return f"it did not fail again when replayed to shrink it further ({spent}): flaky?"
        if self.complete:
            head = f"shrinking finished at the end of the campaign ({spent})"
            tail = (
                # Hypothesis shrinks toward this finding's signature: the bug may show with less as
                # another finding (other outputs or ranks wrong), so "the failure needs" overstated it
                f"; this finding (its wrong outputs on their ranks) needs {', '.join(self.kept)}"
                if self.kept
                else "; every feature is at its simplest"
            )
        else:
            head = f"shrinking still cut short after the extra budget ({spent}): not necessarily minimal"
            tail = f"; not dropped: {', '.join(self.kept)}" if self.kept else ""
        return head + tail


def simplest_case(runner: Runner) -> Case:
    """The simplest case the runner's strategy draws (Hypothesis' own minimal example)."""
    return find(runner.strategy(), lambda _case: True, settings=settings(database=None, max_examples=10))


def kept_features(case: Case, simplest: Case) -> list[str]:
    """The features of ``case`` that are not at the strategy's simplest value, in words."""
    kept = []
    if case.dtype != simplest.dtype:
        kept.append(f"dtype {case.dtype}")
    if case.profile != simplest.profile:
        kept.append(f"profile {case.profile}")
    if case.seed != simplest.seed:
        kept.append(f"seed {case.seed}")
    if (case.world_size, case.mesh) != (simplest.world_size, simplest.mesh):
        kept.append(f"world size {case.world_size} (mesh {case.mesh})")
    kept += [f"{k} {v}" for k, v in sorted(case.sizes.items()) if v != simplest.sizes.get(k)]
    kept += [f"{k}={v!r}" for k, v in sorted(case.options.items()) if v != simplest.options.get(k)]
    return kept


class _Rewrite(RunHooks):
    """Writes each smaller failing case that ``keep`` takes over the finding's failure file (as the
    recorder does). Only those: a 1-rank try's Hypothesis run also meets failures on 2 ranks, of
    another bug of the same kind, and wrote them over the file of a finding it did not replace. And
    only those of the finding's own ``signature``: a shrink that drifts through other findings'
    signatures moved the file onto theirs, one after another (a new user's second campaign lost
    a finding and kept two files of another); the case it ends at is written once, at the end
    (``FailureRecorder.hold``), so a run killed meanwhile keeps the finding's last case of its own."""

    def __init__(self, recorder: Any, path: str, keep: Callable[[Finding], bool], signature: str) -> None:
        self.recorder, self.path, self.keep, self.signature = recorder, path, keep, signature
        self.order: tuple | None = None

    def on_finding(self, context: FindingContext, finding: Finding) -> None:
        if not self.keep(finding) or finding_signature(finding) != self.signature:
            return
        order = example_order()
        if order is not None and self.order is not None and order > self.order:
            return
        self.order = order
        self.path = self.recorder.write(self.path, context, finding) or self.path


def _replay_and_shrink(
    runner: Runner,
    finding: Finding,
    budget: float,
    seed: tuple,
    recorder: Any,
    path: str | None,
    keep: Callable[[Finding], bool],
) -> tuple[Finding | None, bool, int]:
    """One Hypothesis run whose only example is the choice sequence ``seed`` (through the example
    database; reuse and shrink phases), within ``budget`` seconds, on fresh hooks: a
    :class:`Deadline` of its own and a rewrite of the failure file at ``path`` with the failures
    ``keep`` takes (what the caller would return). Returns the smallest
    failure of ``finding``'s kind (None: it did not fail so within the budget), whether Hypothesis
    finished shrinking it, and the examples run."""
    deadline = Deadline(time.perf_counter() + budget)
    hooks: list[RunHooks] = [deadline]
    if recorder is not None and path is not None:
        hooks.append(_Rewrite(recorder, path, keep, finding_signature(finding)))
    fresh = runner.with_hooks(hooks)
    smallest = SmallestFindings()

    def test_case(case: Case) -> None:
        try:
            check(fresh, case)
        except Finding as f:
            smallest.on_finding(f.context, f)
            raise

    # no example database: only the seed is replayed (the profile's database held another failure
    # of the same kind, on 2 ranks, that a 1-rank try wrote over a finding's file)
    s = settings_for(fresh.config, quiet=True, database=None, phases=(Phase.reuse, Phase.shrink))
    test: Any = given_test(fresh, test_case, s, stable_identity(fresh), [seed])
    test.shardfuzz_smallest = smallest
    try:
        with deadline.enforced():
            run_test(test)
    except TimeUp:  # the budget was spent before it failed: nothing to show
        pass
    except Unsatisfiable:  # the choices replay to no case Hypothesis may run here (one rank): none
        pass
    except BaseException as exc:
        same = [f for f in findings_of(exc) if f.kind == finding.kind]
        if not same and not findings_of(exc):
            raise  # not a finding (Ctrl-C, a failure of shardfuzz): never swallowed
        if same:
            return same[0], getattr(same[0], "cut_short", None) is None, fresh.stats.examples
    return None, False, fresh.stats.examples


def finish_shrink(
    runner: Runner, finding: Finding, budget: float, *, recorder: Any = None, path: str | None = None
) -> Finished:
    """Shrink ``finding`` further (its shrink was cut) within ``budget`` seconds; its failure file
    at ``path`` is rewritten with each smaller case."""
    simplest = simplest_case(runner)
    choices = getattr(finding, "choices", None)
    t0 = time.perf_counter()
    if budget <= 0 or not choices:
        kept = kept_features(finding.case, simplest)
        return Finished(finding, False, 0.0, budget, 0, kept, True, finding.case)

    def same_kind(f: Finding) -> bool:  # what it returns: the shrink may reach another signature
        return f.kind == finding.kind

    shrunk, complete, examples = _replay_and_shrink(
        runner, finding, budget, choices, recorder, path, same_kind
    )
    found = shrunk if shrunk is not None else finding
    spent, kept = time.perf_counter() - t0, kept_features(found.case, simplest)
    result = Finished(found, complete, spent, budget, examples, kept, shrunk is not None, finding.case)
    note = f"shardfuzz: the deadline cut this failure's shrink; {result.describe()}.\n"
    found.report = note + found.report
    found.args = (found.report,)
    return result


#: seconds per target, at most, for Hypothesis to try its findings on 2+ ranks on 1 rank
ONE_RANK_S = 30.0


def try_one_rank(
    runner: Runner, finding: Finding, budget: float, *, recorder: Any = None, path: str | None = None
) -> Finding | None:
    """``finding`` (on 2+ ranks) run on 1 rank with the same global sizes, and shrunk from there by
    Hypothesis (:func:`shardfuzz.case.one_rank_path`), within ``budget`` seconds: the 1-rank
    finding of the same kind, or None when it needs 2+ ranks (or the target's world sizes leave 1
    out, or the budget ran out). Its failure file at ``path`` is rewritten when it fails on 1 rank."""
    choices = getattr(finding, "choices", None)
    if budget <= 0 or not choices or finding.case is None or finding.case.world_size == 1:
        return None
    with one_rank_path():  # the choice after the finding's own: 0, run it on 1 rank

        def on_one_rank(f: Finding) -> bool:  # what it returns
            return f.kind == finding.kind and f.case is not None and f.case.world_size == 1

        found, _, _ = _replay_and_shrink(runner, finding, budget, (*choices, 0), recorder, path, on_one_rank)
    if found is None or found.case.world_size != 1:
        return None
    found.report = (
        f"shardfuzz: found on {finding.case.world_size} ranks; it fails on 1 rank with the same "
        "global sizes too (Hypothesis replayed it there and shrank it)\n" + found.report
    )
    found.args = (found.report,)
    return found
