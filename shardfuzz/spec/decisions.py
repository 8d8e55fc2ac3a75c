"""Discrete decisions that the oracle and every rank make alike (``shardfuzz.decision()``).

A top-k routing, an argmax or a threshold that both sides compute with one function on the same
values (docs/reference/target-spec.md, discrete decisions) has the same exact arithmetic on both
sides. The noise model perturbs every float64 op of the oracle by a rounding of the case dtype; inside
such a function that flips the oracle's exact ties in its samples, and the bound on every output
after the decision widens to a whole choice's worth: a tie-rule bug there passed (a new user's
expert-choice router, whose tie bug was found at example 328 through torch ops and at 7 with the
same function in numpy). Inside :func:`decision` the noise model leaves the ops exact; what flows
into it from outside is perturbed as ever, so a decision on values computed otherwise on the two
sides still flips where rounding reaches it.
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Iterator

_DEPTH: contextvars.ContextVar[int] = contextvars.ContextVar("shardfuzz_decision", default=0)


@contextlib.contextmanager
def decision() -> Iterator[None]:
    """A ``with`` block or a decorator around a discrete decision that the oracle and every rank
    make with the same code on the same values: the noise model leaves its arithmetic exact (on
    the ranks, and outside a noise sample, it does nothing). Wrap the decision only: a computation
    the ranks do in the case dtype, wrapped, gets no noise and is held to float64's exactness."""
    token = _DEPTH.set(_DEPTH.get() + 1)
    try:
        yield
    finally:
        _DEPTH.reset(token)


def inside_decision() -> bool:
    """Whether the code running is inside :func:`decision`."""
    return _DEPTH.get() > 0
