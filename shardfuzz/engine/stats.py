"""Statistics of one fuzzing run: examples, failures, margins and closest passes, trigger shares,
and what was set aside (unsupported, excluded, external faults, leaks)."""

from __future__ import annotations

import collections
import dataclasses
from typing import Any

from shardfuzz.report.closest_pass import closest_pass_words, margin_text
from shardfuzz.signature import finding_signature

#: the passing cases kept per value profile, to tell whether it changed any input
PROFILE_SAMPLES = 3


@dataclasses.dataclass
class Stats:
    """Counters for one fuzzing run."""

    examples: int = 0
    passed: int = 0
    failures: int = 0
    #: failing examples that hung (each waited out its timeout: a shrink of a hang is slow)
    hangs: int = 0
    elapsed: float = 0.0
    #: how many examples ran until the first failure (None: no failure)
    first_failure_at: int | None = None
    #: smallest error/tolerance among mismatching examples (how clearly a bug is seen)
    margin: float | None = None
    #: largest error/tolerance among passing examples (how close a correct run came)
    worst_pass_ratio: float = 0.0
    #: the case of that closest pass (None: no example passed)
    closest_pass: Any = None
    #: that ratio was judged without the noise term (a sure pass): the true ratio is at most it
    closest_pass_upper_bound: bool = False
    #: largest error/tolerance among passing examples judged with the noise term (measured, not
    #: bounded): where the closest pass is a bound, the closest pass is at least this
    measured_pass_ratio: float = 0.0
    #: the case of that measured pass (None: none was measured)
    measured_pass_case: Any = None
    triggers: collections.Counter = dataclasses.field(default_factory=collections.Counter)
    #: cases rejected as unsupported, by reason
    unsupported: collections.Counter = dataclasses.field(default_factory=collections.Counter)
    #: reason -> the command that reruns the first case refused for it (a new user could not look
    #: at the one case "the oracle overflows the case dtype x1" counted)
    first_refused: dict[str, str] = dataclasses.field(default_factory=dict)
    #: global state examples left behind (restored, or the pool restarted), by description
    leaks: collections.Counter = dataclasses.field(default_factory=collections.Counter)
    #: output -> "float32 in bfloat16 cases": passing outputs the oracle gives wider than a 16-bit
    #: case dtype, judged at that dtype's bound without a fixed tolerance of their own
    wider_outputs: dict[str, str] = dataclasses.field(default_factory=dict)
    #: the dtypes of the passing examples
    pass_dtypes: set[str] = dataclasses.field(default_factory=set)
    #: value profile -> its passing examples, and the first few of their cases (whether the profile
    #: changed any input: :func:`shardfuzz.engine.degenerate.inert_profiles`)
    profile_passes: collections.Counter = dataclasses.field(default_factory=collections.Counter)
    profile_samples: dict[str, list[Any]] = dataclasses.field(default_factory=dict)
    #: passing examples whose every floating output the oracle gave all zero or constant, where a
    #: sum, a scale or an order gone wrong cannot show (``shardfuzz.engine.degenerate.is_degenerate``)
    degenerate_passes: int = 0
    #: passing examples where every output was empty: no element was compared at all (a size or an
    #: option of 0: a new user's --option n_params=0 passed "at 0 (every compared element equal)")
    empty_passes: int = 0
    #: output -> the passing examples where the oracle gave it all zero or constant
    degenerate_outputs: collections.Counter = dataclasses.field(default_factory=collections.Counter)
    #: (output, size name) -> those passes where that size was 1 (a softmax over one key, seq 1)
    degenerate_at_one: collections.Counter = dataclasses.field(default_factory=collections.Counter)
    #: output -> the passing examples where its allowed error was at least its value at every
    #: element (not all zero or constant): a zero answer would have passed (``Runner._note_degenerate``)
    wide_bound_outputs: collections.Counter = dataclasses.field(default_factory=collections.Counter)
    #: size name -> the passing examples where that size was 1 (what the share above is compared with)
    passes_at_one: collections.Counter = dataclasses.field(default_factory=collections.Counter)
    #: ranks killed from outside whose case then passed (set aside, not findings)
    external_faults: int = 0
    #: cases set aside by a known-failure predicate (``--exclude``, ``Target(known_failures=)``), by reason
    excluded: collections.Counter = dataclasses.field(default_factory=collections.Counter)
    #: a mismatch finding's signature -> the largest error/tolerance of its failing examples: a
    #: shrunk case can sit just past its bound (1.38x) where larger cases of the same finding were
    #: 8.4e4x past it, and a new user read the thin margin as noise
    widest: dict[str, float] = dataclasses.field(default_factory=dict)
    #: trigger condition -> the excluded cases that met it (a condition the run met rarely because
    #: its cases were excluded is said so, not put down to the search)
    excluded_triggers: collections.Counter = dataclasses.field(default_factory=collections.Counter)
    #: (``--exclude`` expression, key) -> the cases it left in because they lacked that key; with
    #: key None, the cases it read whole and left in
    exclude_lacked: collections.Counter = dataclasses.field(default_factory=collections.Counter)

    def exclusions_on_absent_keys(self) -> dict[str, tuple[str, int]]:
        """The ``--exclude`` expressions that excluded nothing because no case they were asked about
        had a key they read (a misspelling, or a key of another target): expression -> (key, cases)."""
        whole = {text for (text, key) in self.exclude_lacked if key is None}
        return {
            text: (key, n)
            for (text, key), n in self.exclude_lacked.items()
            if key is not None and text not in whole and not self.excluded[text]
        }

    #: covering rows that ran as examples, those that stood in for a rejected row, and the tuples of
    #: conditions that rejected rows were for and no row reached (refused by the implementation)
    rows: int = 0
    rows_replaced: int = 0
    rows_refused: int = 0
    #: cases that came again after the first finding (shrinking), answered from their first run
    repeats: int = 0
    #: Hypothesis runs the examples after the rows were split into (a derandomized budget of N runs
    #: as runs of 30: :func:`shardfuzz.engine.search.chunks`); Hypothesis' statistics are per run
    hypothesis_runs: int = 0
    #: the examples the run was given (max_examples): every covering row runs, and Hypothesis at
    #: least once, so a budget below the row count runs more (None: not set)
    budget: int | None = None

    def note_pass(self, ratio: float, case: Any, upper_bound: bool = False) -> None:
        """Count a passing example whose worst error/tolerance was ``ratio`` (``upper_bound``: judged
        without the noise term, so at most ``ratio``)."""
        self.passed += 1
        profile = getattr(case, "profile", None)
        if profile is not None:
            self.profile_passes[profile] += 1
            samples = self.profile_samples.setdefault(profile, [])
            if len(samples) < PROFILE_SAMPLES:
                samples.append(case)
        if not upper_bound and (self.measured_pass_case is None or ratio > self.measured_pass_ratio):
            self.measured_pass_ratio, self.measured_pass_case = ratio, case
        if self.closest_pass is None or ratio > self.worst_pass_ratio:
            self.worst_pass_ratio, self.closest_pass = max(self.worst_pass_ratio, ratio), case
            self.closest_pass_upper_bound = upper_bound

    @property
    def closest_pass_words(self) -> str:
        """The closest pass's ratio, and whether it is an upper bound, in words."""
        return closest_pass_words(
            self.worst_pass_ratio, self.closest_pass_upper_bound, measured_elsewhere=self.measured_pass_ratio
        )

    def count_finding(self, finding: Any) -> None:
        """One more failing example: the first failure's position, and a mismatch's margin."""
        self.failures += 1
        self.hangs += int(finding.kind == "hang")
        if self.first_failure_at is None:
            self.first_failure_at = self.examples
        if finding.ratio is not None and finding.kind == "mismatch":
            self.margin = finding.ratio if self.margin is None else min(self.margin, finding.ratio)
            key = finding_signature(finding)
            self.widest[key] = max(self.widest.get(key, 0.0), finding.ratio)

    @property
    def per_second(self) -> float:
        return self.examples / self.elapsed if self.elapsed else 0.0

    def summary(self) -> str:
        n = self.examples
        trig = ", ".join(f"{k} {100.0 * v / n:.0f}%" for k, v in sorted(self.triggers.items()) if v > 0 and n)
        margin = f", margin {margin_text(self.margin)}" if self.margin is not None else ""
        if self.unsupported:
            margin += "; rejected as unsupported: " + ", ".join(
                f"{k} x{v}" for k, v in self.unsupported.items()
            )
        if self.excluded:
            margin += "; excluded as known failures: " + ", ".join(
                f"{k} x{v}" for k, v in self.excluded.items()
            )
        if self.rows_replaced or self.rows_refused:
            margin += f"; covering rows: {self.rows} ran, {self.rows_replaced} replacing rejected ones"
            margin += f", {self.rows_refused} condition tuples refused" if self.rows_refused else ""
        elif self.rows:
            margin += f"; covering rows: {self.rows}"
        if self.repeats:
            margin += f"; {self.repeats} repeated cases answered from their first run"
        if self.external_faults:
            margin += f"; external faults set aside (rank killed from outside): {self.external_faults}"
        if self.leaks:
            margin += "; leaks (not findings): " + ", ".join(
                f"{k} x{v}" for k, v in self.leaks.most_common(5)
            )
        return (
            f"{n} examples in {self.elapsed:.1f} s ({self.per_second:.1f}/s), "
            f"{self.failures} failing{margin}; "
            + (f"worst passing error/tolerance {self.closest_pass_words}" if self.passed else "none passed")
            + (f"; reached: {trig}" if trig else "")
        )
