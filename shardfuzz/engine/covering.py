"""Covering rows: before random generation, a run executes a few cases that together reach every
pair of trigger conditions that can occur together (a pairwise covering array over the target's
own strategy; :data:`UNPAIRED` conditions on their own), so a bug that needs two conditions at
once (an uneven sequence *and* non-causal attention; ZeRO stage >= 2 *and* gradient accumulation)
is met in the first examples, not after Hypothesis has left its simplest values.

* The conditions of a case are its trigger conditions (:func:`shardfuzz.spec.triggers.triggers_of`:
  generic, ``backward`` and the target's declared ones) plus ``option=value`` for every option that
  takes a few discrete values (each option value that matters).
* Which pairs *can* occur together is read from a pool of cases drawn from the strategy itself
  (seeded from the target and the resolved implementation, so the rows are the same on every run
  and every machine); rows are picked from that pool greedily (most uncovered pairs first, then the
  cheaper case). Every case keeps the Hypothesis choice sequence that drew it.
* Rows run as plain cases. A failing row is handed to Hypothesis through the example database
  (:func:`seeded_database`): Hypothesis replays it first and shrinks it like any failure it found
  itself, so a finding on a row is still shrunk and saved. Hypothesis' shrinker does the work; there
  is no search loop here.
"""

from __future__ import annotations

import collections
import dataclasses
import difflib
import functools
import itertools
import math
import warnings
from collections.abc import Iterable, Sequence
from typing import Any, NamedTuple

from hypothesis.database import ExampleDatabase, InMemoryExampleDatabase, choices_to_bytes

from shardfuzz.case import Case, option_kind_problem
from shardfuzz.engine.hooks import StickyInterrupt
from shardfuzz.errors import (
    ExternalFault,
    Finding,
    InvalidArgument,
    ShardfuzzWarning,
    TargetError,
    Unsupported,
)
from shardfuzz.report.tracebacks import hide_for_findings as __tracebackhide__  # noqa: F401 (read by pytest)
from shardfuzz.spec.bounds import bounds_of
from shardfuzz.spec.exclude import Excluded
from shardfuzz.spec.layouts import Shard
from shardfuzz.spec.placements import AsDTensor, FromDTensor
from shardfuzz.spec.sampling import POOL_SIZE, Draws, distinct_cases, draw_pool, stable_seed
from shardfuzz.spec.triggers import (
    DTYPE_CONDITIONS,
    PROGRESS,
    SPLIT_RULES_DIFFER,
    conditions_named,
    is_effective,
    triggers_of,
)
from shardfuzz.verdict.oracle import supports

#: an option with at most this many distinct values in the pool is categorical: each value is a condition
MAX_CATEGORIES = 6


@dataclasses.dataclass(frozen=True)
class Row:
    """One covering case, the Hypothesis choices that draw it, and the conditions it reaches."""

    case: Case
    choices: tuple
    conditions: frozenset[str]


def categorical_options(cases: Iterable[Case]) -> tuple[str, ...]:
    """Options present in every case whose values are few and hashable (``variant``, ``stage``,
    ``causal``...): each of their values is a condition."""
    cases = list(cases)
    if not cases:
        return ()
    common = set.intersection(*(set(c.options) for c in cases))
    out = []
    for key in sorted(common):
        try:
            values = {_hashable(c.options[key]) for c in cases}
        except TypeError:
            continue
        if 1 < len(values) <= MAX_CATEGORIES:
            out.append(key)
    return tuple(out)


def _hashable(value: Any) -> Any:
    hash(value)
    return value


def conditions_of(target: Any, case: Case, categorical: Sequence[str]) -> frozenset[str]:
    """Every condition ``case`` reaches: trigger conditions and ``option=value`` of the categorical options."""
    options = (f"{k}={case.options[k]!r}" for k in categorical if k in case.options)
    return frozenset(triggers_of(target, case)) | {c for c in options if is_effective(target, c, case)}


def singles_of(case: Case) -> set[tuple[str, ...]]:
    """What some row must reach on its own, never paired: the case's dtype and the size of its group
    under test (so every dtype and every group size the pool draws has a row, float32 and a group
    of 4 included, without a pair for each)."""
    return {(f"dtype={case.dtype}",), (f"group={case.group_size}",)}


#: conditions some row must reach, not paired with every other one: already a combination (a size
#: the group does not divide, a group of 3+ ranks, a remainder where the rules cut apart), whose bugs are
#: in the structure, not in a dtype or a profile; paired, they added 2-4 rows to most targets
UNPAIRED = frozenset({SPLIT_RULES_DIFFER})


def tuples_of(target: Any, case: Case, conditions: frozenset[str]) -> set[tuple[str, ...]]:
    """What the rows must reach, for one case: its single conditions and pairs of them (but for
    :data:`UNPAIRED`: alone), its :func:`singles_of`, and the triples among the target's
    ``important`` conditions."""
    important = sorted(conditions & set(target.important))
    alone = {(c,) for c in conditions & UNPAIRED}
    return (
        pairs_of(conditions - UNPAIRED) | alone | singles_of(case) | set(itertools.combinations(important, 3))
    )


def pairs_of(conditions: frozenset[str]) -> set[tuple[str, ...]]:
    """The single conditions and the pairs of conditions of one case (sorted tuples)."""
    ordered = sorted(conditions)
    return {(c,) for c in ordered} | set(itertools.combinations(ordered, 2))


def _cost(case: Case) -> tuple:
    return (case.world_size, sum(case.sizes.values()), len(case.mesh))


def covering_rows(target: Any, strategy: Any, seed: int, pool_size: int = POOL_SIZE) -> list[Row]:
    """Rows that together reach every single condition and every pair of conditions seen together
    in a pool of ``pool_size`` cases of ``strategy`` (:data:`UNPAIRED` ones alone; greedy: most
    uncovered pairs, then cheapest).
    Cases the target does not support (its ``supports`` hook) are left out of the pool."""
    return rows_from_pool(target, draw_pool(strategy, seed, pool_size))


def candidates_of(target: Any, pool: Sequence[tuple[Case, tuple]]) -> list[Row]:
    """The pool's cases the target supports, as rows with their conditions."""
    if target.supports is not None:
        pool = [(c, ch) for c, ch in pool if not supports(target, c)]
    categorical = categorical_options(c for c, _ in pool)
    return [Row(c, ch, conditions_of(target, c, categorical)) for c, ch in pool]


def rows_from_pool(target: Any, pool: Sequence[tuple[Case, tuple]]) -> list[Row]:
    """:func:`covering_rows` from a pool already drawn."""
    candidates = candidates_of(target, pool)
    wanted: set[tuple[str, ...]] = set()
    cover = {}
    for i, row in enumerate(candidates):
        cover[i] = tuples_of(target, row.case, row.conditions)
        wanted |= cover[i]
    rows: list[Row] = []
    while wanted:
        best = max(cover, key=lambda i: (len(cover[i] & wanted), _neg(_cost(candidates[i].case))))
        gain = cover[best] & wanted
        if not gain:
            break
        rows.append(candidates[best])
        wanted -= gain
        del cover[best]
    return rows


def _neg(cost: tuple) -> tuple:
    return tuple(-x for x in cost)


def uncovered(rows: Sequence[Row], cases: Iterable[Case], target: Any) -> set[tuple[str, ...]]:
    """Pairs (and single conditions) reached by ``cases`` that no row reaches: what a test checks."""
    cases = list(cases)
    categorical = categorical_options([r.case for r in rows] + cases)
    have: set[tuple[str, ...]] = set()
    for r in rows:
        have |= tuples_of(target, r.case, conditions_of(target, r.case, categorical))
    seen: set[tuple[str, ...]] = set()
    for c in cases:
        if target.supports is None or not supports(target, c):
            seen |= tuples_of(target, c, conditions_of(target, c, categorical))
    return seen - have


class SeededDatabase(ExampleDatabase):
    """A database whose *secondary* corpus, for one run, is the given choice sequences: Hypothesis
    replays them after its primary corpus (the failures it saved itself) and shrinks those that
    fail. (Given as primary entries, a failure would count as already shrunk and be reported as
    it is.) Everything else goes to ``inner``."""

    def __init__(self, inner: ExampleDatabase, seeds: Sequence[tuple]) -> None:
        super().__init__()
        self.inner = inner
        self.pending = [choices_to_bytes(s) for s in seeds]

    def fetch(self, key: bytes) -> Iterable[bytes]:
        if self.pending and key.endswith(b".secondary"):
            pending, self.pending = self.pending, []
            return pending
        return self.inner.fetch(key)

    def save(self, key: bytes, value: bytes) -> None:
        self.inner.save(key, value)

    def delete(self, key: bytes, value: bytes) -> None:
        self.inner.delete(key, value)

    def move(self, src: bytes, dest: bytes, value: bytes) -> None:
        self.inner.move(src, dest, value)


def seeded_database(inner: Any, seeds: Sequence[tuple]) -> Any:
    """``inner`` (an in-memory database when None) that first yields the choice sequences ``seeds``."""
    return SeededDatabase(inner if inner is not None else InMemoryExampleDatabase(), seeds)


class CaseRun(NamedTuple):
    """A passing case's worst error/tolerance and the trigger conditions it reached."""

    ratio: float
    reached: set[str]
    #: ``ratio`` was judged without the noise term (a sure pass): an upper bound, not a measure
    upper_bound: bool


def counted_run(runner: Any, case: Case) -> CaseRun:
    """Run one case (inside Hypothesis or not) and count the trigger conditions it reached once it
    is an example, passed or failed (as the runner counts examples: a progress line never counts
    a case still running, or one rejected since); a case rejected as unsupported is counted as
    such, an excluded one and an external fault by the runner."""
    reached = triggers_of(runner.target, case)
    try:
        ratio = runner.run_case(case)
    except Finding as f:
        runner.stats.triggers.update(reached)
        f.reached = reached  # type: ignore[attr-defined]  # Hypothesis' events of a failing example too
        raise
    except Unsupported as e:
        if not isinstance(e, Excluded):  # an excluded case is counted by the runner
            runner.stats.unsupported[e.reason] += 1
            if e.reason not in runner.stats.first_refused:  # the first case refused for it, to rerun
                runner.stats.first_refused[e.reason] = runner.rerun_command(case)
        raise
    runner.stats.triggers.update(reached)
    verdict = runner.last_verdict
    return CaseRun(ratio, reached, verdict is not None and verdict.upper_bound)


def pool_for(
    target: Any, world_sizes: Any = None, dtypes: Any = None, options: Any = ()
) -> tuple[tuple[Case, tuple], ...]:
    """The pool that the covering rows of ``target`` (under a run's world sizes, dtypes and
    options) are picked from: drawn once per process (a draw is deterministic, and 250 draws take
    0.5-2 s), shared by the rows of every run of the target and by the tests of its triggers."""
    return _pool_for(target, world_sizes, dtypes, options)  # one cache key however it is called


@functools.lru_cache(maxsize=64)
def _pool_for(target: Any, world_sizes: Any, dtypes: Any, options: Any) -> tuple[tuple[Case, tuple], ...]:
    # the same pool as draw_pool(target.strategy(world_sizes, dtypes, options), seed): the dtypes
    # and option values are a map over the draws (of the branches that have the pinned options),
    # drawn once for all
    through = target.restrict(dtypes, options)
    names = frozenset(name for name, _ in options)
    pool = tuple(distinct_cases(_draws_for(target, world_sizes, names), POOL_SIZE, through))
    if options and target.supports is not None:
        _check_pinned_supported(target, options, pool)
    return pool


def _check_pinned_supported(target: Any, options: Any, pool: Sequence[tuple[Case, tuple]]) -> None:
    """Pinned options with which the target supports none of the pool's cases are a usage error:
    a ``place=X3`` that DTensor crashed on was reported as a finding, and ``op=aten.cumsum``
    (no overload) ran past an exclusion by the op's full name."""
    reasons = collections.Counter(supports(target, c) for c, _ in pool)
    if pool and None not in reasons:
        pinned = ", ".join(f"{k}={v!r}" for k, v in options)
        why = "; ".join(f"{r} (x{n})" for r, n in reasons.most_common(3))
        raise InvalidArgument(
            f"options {pinned} pinned, but target {target.name!r} supports none of the "
            f"{len(pool)} cases drawn with them: {why}"
        )


#: a string option drawn from at most this many values is an enumeration: a pinned value outside
#: it is likely a misspelling (dtensor_ops draws ~100 op names, rare ones not in every pool)
ENUM_VALUES = 12


def pin_notes(runner: Any) -> tuple[str, ...]:
    """Warnings for a run's pinned string options whose value the target never draws, where it draws
    that option from a few strings only (``norm='rmss'`` where it draws 'ln' and 'rms'): the run
    goes on (a target may take values it does not draw), but a misspelled value read as a clean
    run. Values of other kinds are left alone (``steps=5`` beyond a drawn 1-2 is a choice)."""
    c = runner.config
    if not c.options:
        return ()
    pool_for(runner.target, runner.world_sizes(), c.dtypes, c.options)  # checks the pins first
    names = frozenset(name for name, _ in c.options)
    draws = _draws_for(runner.target, runner.world_sizes(), names)
    notes = []
    for name, value in c.options:
        drawn = collections.Counter(
            case.options[name] for case, _ in draws.attempts if case is not None and name in case.options
        )
        if not isinstance(value, str) or not drawn or len(drawn) > ENUM_VALUES or value in drawn:
            continue
        if not all(isinstance(v, str) for v in drawn):
            continue
        close = difflib.get_close_matches(value, list(drawn), n=1, cutoff=0.6)
        close += [v for v in drawn if v.lower() == value.lower() and v not in close]
        values = ", ".join(repr(v) for v in sorted(drawn))
        guess = f"; did you mean {close[0]!r}?" if close else "; a misspelling?"
        notes.append(  # what was drawn, not what may be: a rare value may be missing from a sample
            f"option {name}={value!r} pinned, but none of the {sum(drawn.values())} cases drawn of "
            f"target {runner.target.name!r} has it: they have {name} {values}{guess}"
        )
    return tuple(notes)


@functools.lru_cache(maxsize=64)
def _draws_for(target: Any, world_sizes: Any, option_names: frozenset[str] = frozenset()) -> Draws:
    return Draws(target.drawn(world_sizes, option_names), stable_seed(f"{target.name}/covering"))


@functools.lru_cache(maxsize=64)
def _rows_for(target: Any, world_sizes: Any, dtypes: Any, options: Any) -> tuple[Row, ...]:
    pool = pool_for(target, world_sizes, dtypes, options)
    check_condition_names(target, pool)
    return tuple(rows_from_pool(target, pool))


def check_condition_names(target: Any, pool: Sequence[tuple[Case, tuple]]) -> None:
    """TargetError where ``Target(effective=...)`` or ``important=`` names a condition that no case
    can meet: not a trigger condition of the target (:func:`conditions_named`), nor an option of its
    cases, nor ``option=value`` of one. A new user's ``effective={"casual": ...}`` and
    ``important=("casual", ...)`` were ignored unsaid: the rule never applied, the triples were
    never covered."""
    options = {name for case, _ in pool for name in case.options}
    named = conditions_named(target)

    def known(name: str, bare_option: bool) -> bool:
        option, eq, _ = name.partition("=")
        return name in named or (bool(eq) and option in options) or (bare_option and name in options)

    for field, names, bare in (
        ("effective", list(target.effective), True),
        ("important", target.important, False),
    ):
        unknown = [n for n in names if not known(n, bare)]
        if unknown:
            close = difflib.get_close_matches(unknown[0], [*named, *options], n=1, cutoff=0.6)
            raise TargetError(
                f"Target {target.name!r}: {field} names {unknown!r}, which no case can meet: not a trigger "
                f"condition of the target, nor {'an option or ' if bare else ''}option=value of its cases"
                + (f"; did you mean {close[0]!r}?" if close else "")
                + f" (its conditions: {', '.join(sorted(named))}; options: {', '.join(sorted(options)) or 'none'})"
            )


def _lays_out_shards(target: Any) -> bool:
    """Whether some input or output of ``target`` is laid out by a split rule (``Shard``, a
    DTensor's placements), where DTensor's empty shards and the rules' difference mean something;
    a target whose outputs depend on the case may. A Zigzag-only context-parallel target's progress
    line counted "empty DTensor shard" and listed it as never reached (two new users read it as a
    blind spot)."""
    if callable(target.outputs):
        return True
    layouts = [*target.input_layouts.values(), *target.outputs.values()]
    return any(isinstance(layout, (Shard, AsDTensor, FromDTensor)) for layout in layouts)


def progress_conditions(runner: Any) -> tuple[str, ...]:
    """The conditions a run's progress line and its pytest statistics show, each at its share, 0%
    included: the usual generic ones (those the run's world sizes allow; ``backward`` only for a target that declares gradients,
    ``batch>1`` only for one whose cases have a ``batch`` size, ``uneven`` only for one that splits
    a size, a low-precision dtype only for a
    run that draws it: a condition that cannot apply read as a blind spot, and a ``--dtypes
    float16`` run showed bfloat16's 0%, not its own dtype's share), then the target's own declared
    triggers that are not among them (ddp_buckets declares ``backward`` too, which the line showed
    twice); then the empty shards (``empty shard``, ``empty DTensor shard``) and the split rules'
    difference (:data:`SPLIT_RULES_DIFFER`), its ``per_group``
    relations and ``uneven over replicas`` where some case of the pool reaches them (a ZeRO target's ``numel%group!=0`` showed only in pytest's statistics). Read
    from the pool the run's covering rows come from (drawn once, cached)."""
    c = runner.config
    target = runner.target
    pool = pool_for(target, runner.world_sizes(), c.dtypes, c.options)
    batched = any("batch" in case.sizes for case, _ in pool)
    drawn = {case.dtype for case, _ in pool}
    # what the run's world sizes allow at all (a run on worlds 2 and 3 showed "2-D mesh 0%" as a
    # blind spot); a target that could draw one and never does still shows its 0%
    worlds = runner.world_sizes() or [case.world_size for case, _ in pool]
    top = max(worlds)
    # two mesh axes above 1 need a world with a factor pair: 4, 6, 8, 9 (not 5 or 7)
    composite = any(w % d == 0 for w in worlds for d in range(2, math.isqrt(w) + 1))
    # and a strategy that draws 2-D meshes at all: a new user's cases(max_dims=1) run listed
    # "never reached: 2-D mesh, group<world", which read as a gap in the search
    declared = bounds_of(target.strategy())
    meshes_2d = declared is None or any(b.max_dims >= 2 for b in declared)
    # a target that splits no size (a ZeRO flat buffer drawn Free) cannot be uneven: its 0% read
    # as a blind spot to two new users
    splits = any(case.split for case, _ in pool)
    allowed = {
        "uneven": top >= 2 and splits,
        "group<world": top >= 2 and meshes_2d,
        "world>=3": top >= 3,
        "2-D mesh": composite and meshes_2d,
    }
    generic = tuple(
        t
        for t in PROGRESS
        if (t != "backward" or target.gradients)
        and (t != "batch>1" or batched)
        and (t not in DTYPE_CONDITIONS or t in drawn)
        and allowed.get(t, True)
    )
    reached = {t for case, _ in pool for t in triggers_of(target, case)}
    # the target's own, each a blind spot where not reached; but under pinned options only those
    # the pinned pool reaches (a DTensor maintainer's gelu run listed "never reached: a sharded dim
    # the op reduces or scans", which no pointwise op can reach)
    shown = generic + tuple(
        t for t in target.triggers if t not in generic and (not c.options or t in reached)
    )
    names = {"uneven over replicas", "empty shard over replicas"} | {
        t for n in target.per_group for t in (f"{n}<group", f"{n}%group!=0", f"group%{n}==0")
    }  # what shardfuzz.spec.triggers.group_relations names
    relations = sorted(reached & names)
    # shown where the strategy reaches them: a new user whose two empty-shard bugs were found could
    # not tell a clean run reached empty shards at all; and where the two split rules cut apart,
    # which a new user's tensor_split target needed (its line showed only DTensor's empty shards)
    rules = ("empty DTensor shard", SPLIT_RULES_DIFFER) if _lays_out_shards(target) else ()
    empties = [t for t in ("empty shard", *rules) if t in reached]
    return shown + tuple(t for t in empties + relations if t not in shown)


def out_of_reach_of_pins(runner: Any) -> tuple[str, ...]:
    """The target's own trigger conditions that its strategy reaches, but not under the run's
    pinned options (``--option``): :func:`progress_conditions` leaves them out, so a new user who
    pinned ``clip_factor=None`` saw "active clip" leave the progress line unsaid, and a clean run
    of a bug that needs clipping read as a clean bill. Empty without pinned options."""
    c = runner.config
    if not c.options:
        return ()
    target = runner.target
    pinned = {
        t
        for case, _ in pool_for(target, runner.world_sizes(), c.dtypes, c.options)
        for t in triggers_of(target, case)
    }
    free = {
        t for case, _ in pool_for(target, runner.world_sizes(), c.dtypes) for t in triggers_of(target, case)
    }
    return tuple(t for t in target.triggers if t in free and t not in pinned)


def strategy_shares(runner: Any, conditions: Sequence[str]) -> dict[str, float]:
    """The share of the strategy's draws (the run's covering pool) that meets each of
    ``conditions``: what a run's own shares are read against."""
    c = runner.config
    pool = pool_for(runner.target, runner.world_sizes(), c.dtypes, c.options)
    met = collections.Counter(t for case, _ in pool for t in triggers_of(runner.target, case))
    return {t: met[t] / len(pool) for t in conditions} if pool else {}


def check_option_kinds(target: Any, case: Case) -> None:
    """Each option value of ``case`` (a failure file's, by hand) against the kinds the target's
    strategy draws there (its covering pool): ``"steps": "2"`` reached the oracle and failed in it,
    as if the target were at fault. Option values are not bounds (any value of the right kind is
    taken); an option no case of the pool has is left to the bounds check."""
    pool = pool_for(target)
    for name, value in case.options.items():
        drawn = [c.options[name] for c, _ in pool if name in c.options]
        problem = option_kind_problem(target.name, name, value, drawn)
        if problem:
            raise InvalidArgument(f"options[{name!r}]={value!r}: {problem}")


def rows_for(runner: Any) -> tuple[Row, ...]:
    """The covering rows of a runner's target under its run's world sizes and dtypes (the same for
    every implementation of the target: seeded from its name; cached)."""
    c = runner.config
    return _rows_for(runner.target, runner.world_sizes(), c.dtypes, c.options)


#: how often a tuple of conditions whose row the implementation refused is tried on another case
#: before it counts as refused by this implementation
REPLACE_TRIES = 2


class CoveringRun:
    """Runs a runner's covering rows once, before its first Hypothesis run (``enabled=False``: none).

    A row the implementation rejects as unsupported (or a known failure sets aside) is replaced by
    the pool case that reaches most of the tuples the rejected row alone reached (then the
    cheapest), at most :data:`REPLACE_TRIES` tries per tuple and as many replacements as rows; the
    tuples still unreached are counted as refused."""

    def __init__(self, runner: Any, enabled: bool = True) -> None:
        self.runner, self.enabled = runner, enabled
        self.done = False
        #: the rows run, in order, and the finding of the failing one
        self.ran: list[Row] = []
        #: how many rows ran as examples (not rejected as unsupported, excluded or set aside)
        self.examples = 0
        self.finding: Any = None

    def run(self) -> Row | None:
        """Run the rows (the first call only); the first failing row, or None."""
        if self.done or not self.enabled:
            return None
        self.done = True
        queue = list(rows_for(self.runner))
        for note in pin_notes(self.runner):
            warnings.warn(note, ShardfuzzWarning, stacklevel=2)
        replace = Replacements(self.runner, queue)
        try:
            while queue:
                row = queue.pop(0)
                StickyInterrupt.check()
                self.ran.append(row)
                self.runner.check_drawn(row.case)
                try:
                    counted_run(self.runner, row.case)
                except Unsupported:  # Excluded too: another case reaches what this one was for
                    queue.extend(replace.after_rejected(row, queue))
                    continue
                except ExternalFault:  # the case passed when rerun: nothing is lost
                    continue
                except Finding as f:
                    self.examples += 1
                    f.choices = row.choices  # type: ignore[attr-defined]  # to shrink it again later
                    self.finding = f
                    return row
                replace.ran(row)
                self.examples += 1
            return None
        finally:  # a failing row, a deadline or Ctrl-C included: the summary counts what ran
            stats = self.runner.stats
            stats.rows, stats.rows_replaced, stats.rows_refused = (
                self.examples,
                replace.count,
                len(replace.refused()),
            )

    def not_reproduced(self, row: Row) -> BaseException:  # noqa: ARG002 (the row that was replayed; its finding is kept on self)
        """The row's finding, marked: Hypothesis did not see it fail again when it replayed it."""
        f = self.finding
        note = (
            "shardfuzz: this failure was found on a covering row and did not fail again when "
            "Hypothesis replayed it (flaky), so it was not shrunk.\n"
        )
        f.report = note + f.report
        f.args = (f.report,)
        return f


class Replacements:
    """The pool cases that stand in for rejected rows (see :class:`CoveringRun`)."""

    def __init__(self, runner: Any, rows: Sequence[Row]) -> None:
        self.runner, self.target = runner, runner.target
        self.rows = list(rows)
        self._candidates: list[Row] | None = None  # the pool's other cases, built at the first rejection
        self.reached: set[tuple[str, ...]] = set()  # by rows that ran
        self.tries: collections.Counter = collections.Counter()  # per tuple, rows rejected
        self.budget, self.count = len(rows), 0

    @property
    def candidates(self) -> list[Row]:
        if self._candidates is None:
            c = self.runner.config
            tried = {r.case for r in self.rows}
            pool = pool_for(self.target, self.runner.world_sizes(), c.dtypes, c.options)
            self._candidates = [r for r in candidates_of(self.target, pool) if r.case not in tried]
        return self._candidates

    def tuples(self, row: Row) -> set[tuple[str, ...]]:
        return tuples_of(self.target, row.case, row.conditions)

    def ran(self, row: Row) -> None:
        self.reached |= self.tuples(row)

    def after_rejected(self, row: Row, queued: Sequence[Row]) -> list[Row]:
        """The replacement for a rejected ``row`` (none when nothing is lost or left to try)."""
        lost = self.tuples(row) - self.reached - {t for q in queued for t in self.tuples(q)}
        self.tries.update(lost)
        wanted = {t for t in lost if self.tries[t] < REPLACE_TRIES}
        if not wanted or self.count >= self.budget:
            return []
        best = max(
            self.candidates, key=lambda r: (len(self.tuples(r) & wanted), _neg(_cost(r.case))), default=None
        )
        if best is None or not self.tuples(best) & wanted:
            return []
        self.candidates.remove(best)
        self.count += 1
        return [best]

    def refused(self) -> set[tuple[str, ...]]:
        """Tuples some rejected row was for and no row that ran reached."""
        return {t for t in self.tries if t not in self.reached}
