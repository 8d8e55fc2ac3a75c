"""The one case sampler: cases drawn from a target's strategy at random, uniformly over
Hypothesis' choices (not simplest-first as a search starts), each with the choice sequence that drew
it, reproducible from a seed on every machine.

Every reader of random cases draws them here: the covering rows' pool
(:mod:`shardfuzz.engine.covering`), what a target's strategy draws for checking a hand-made case
(:func:`shardfuzz.verdict.oracle.drawn_sizes`), the suite's reach and degeneracy checks and the
benchmarks. A search never does: Hypothesis generates and shrinks its own cases.
"""

from __future__ import annotations

import hashlib
import random
from collections.abc import Callable
from typing import Any

from hypothesis.control import BuildContext
from hypothesis.errors import StopTest
from hypothesis.internal.conjecture.choice import ChoiceTemplate
from hypothesis.internal.conjecture.data import ConjectureData, Status
from hypothesis.internal.conjecture.providers import HypothesisProvider

from shardfuzz.case import Case

#: cases drawn for the covering rows' pool (to learn which pairs of conditions occur together)
POOL_SIZE = 250


def stable_seed(key: str) -> int:
    """A seed from a string, the same on every run and machine."""
    return int.from_bytes(hashlib.sha256(key.encode()).digest()[:8], "big")


def draw_pool(strategy: Any, seed: int, size: int = POOL_SIZE) -> list[tuple[Case, tuple]]:
    """Up to ``size`` distinct cases drawn from ``strategy`` at random (uniformly over Hypothesis'
    choices, not simplest-first as a search starts) with a ``random.Random(seed)``, each with the
    choice sequence that drew it (what Hypothesis' database stores). Draws a filter rejects are
    skipped. The draws run inside a Hypothesis build context, so maps and composites work as in a
    search."""
    return distinct_cases(Draws(strategy, seed), size)


def simplest_case(strategy: Any) -> tuple[Case, tuple] | None:
    """The case a Hypothesis search tries first: every choice at its simplest (the smallest sizes,
    the first branch, the first dtype). None when the strategy rejects it (a filter)."""
    data = ConjectureData.for_choices((ChoiceTemplate("simplest", count=None),), provider=NoConstants)
    case, choices = _drawn(data, strategy)
    return None if case is None else (case, choices)


def _drawn(data: ConjectureData, strategy: Any) -> tuple[Case | None, tuple]:
    try:
        with BuildContext(data, is_final=False, wrapped_test=draw_pool):
            case = data.draw(strategy)
    except StopTest:  # a filter rejected the draw
        return None, ()
    data.freeze()
    if data.status >= Status.VALID and isinstance(case, Case):
        return case, tuple(data.choices)
    return None, ()


class Draws:
    """The attempts of :func:`draw_pool` for one strategy and seed, drawn on demand and kept: a map
    draws no choices, so the pool of ``strategy.map(f)`` is these same draws through ``f``
    (:func:`distinct_cases`), and runs restricted to other dtypes or pinned options share them."""

    def __init__(self, strategy: Any, seed: int) -> None:
        self.strategy = strategy
        self.rng = random.Random(seed)
        #: (case, choices) per attempt; case None where a filter rejected the draw
        self.attempts: list[tuple[Case | None, tuple]] = []

    def __getitem__(self, i: int) -> tuple[Case | None, tuple]:
        while len(self.attempts) <= i:
            self.attempts.append(self._draw())
        return self.attempts[i]

    def _draw(self) -> tuple[Case | None, tuple]:
        return _drawn(ConjectureData(random=self.rng, provider=NoConstants), self.strategy)


class NoConstants(HypothesisProvider):
    """A Hypothesis provider that never draws constants."""

    # Hypothesis draws 5% of its values from constants in the source of the loaded modules:
    # which modules are loaded (a benchmark, a test file) would change the pool, and the rows
    def _maybe_draw_constant(self, choice_type: Any, constraints: Any, *, p: float = 0.05) -> None:  # noqa: ARG002 (Hypothesis calls it with these; none is needed to draw nothing)
        return None


def distinct_cases(
    draws: Draws, size: int = POOL_SIZE, through: Callable[[Case], Case] | None = None
) -> list[tuple[Case, tuple]]:
    """Up to ``size`` distinct cases of the first ``2 * size`` attempts, each passed ``through`` the
    map a restricted strategy applies (:meth:`~shardfuzz.spec.target.Target.restrict`)."""
    out: dict[Case, tuple] = {}
    for i in range(size * 2):
        if len(out) >= size:
            break
        case, choices = draws[i]
        if case is None:
            continue
        if through is not None:
            case = through(case)
        if case not in out:
            out[case] = choices
    return list(out.items())
