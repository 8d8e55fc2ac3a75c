"""Declared hooks: objects passed to a :class:`~shardfuzz.engine.runner.Runner`, never attributes
assigned or methods swapped from outside.

A hook overrides what it needs:

* :meth:`RunHooks.before_example` runs before each example (a campaign's deadline raises there);
* :meth:`RunHooks.on_finding` runs for every finding, shrinking included (failure files are
  written there, so an interrupted run keeps what it found); it gets the finding's frozen
  :class:`~shardfuzz.engine.finding.FindingContext`, never the runner.

:class:`Deadline` stops new examples at its time; inside :meth:`Deadline.enforced` it also
abandons an example still running :data:`GRACE_S` seconds after it, whatever its timeout.
"""

from __future__ import annotations

import contextlib
import math
import os
import signal
import threading
import time
from collections.abc import Iterator
from typing import TYPE_CHECKING

from shardfuzz.errors import InvalidArgument
from shardfuzz.limits import GRACE_S

# Hypothesis is imported inside the functions that use it: the CLI's parser or the pytest
# plugin loads this module at start (START_UP in tests/test_structure.py)

if TYPE_CHECKING:  # pragma: no cover
    from shardfuzz.case import Case
    from shardfuzz.engine.finding import FindingContext
    from shardfuzz.engine.runner import Runner
    from shardfuzz.errors import Finding


class RunHooks:
    """Base class of hooks: every method does nothing."""

    def before_example(self, runner: Runner, case: Case) -> None:
        """Called before each example; raising stops the search with that exception."""

    def on_finding(self, context: FindingContext, finding: Finding) -> None:
        """Called for every finding (Hypothesis' shrinking included), with what the example was
        (``context.case``, the implementation, the inputs' digest, its traces and leaks)."""


def example_order() -> tuple | None:
    """Where the example being run sits in Hypothesis' own order (shorter, simpler choice
    sequences first: the order its shrinker minimises), to compare findings; None outside a
    Hypothesis test (or if its internals moved)."""
    try:
        from hypothesis.control import current_build_context
        from hypothesis.internal.conjecture.shrinker import sort_key

        return tuple(sort_key(current_build_context().data.nodes))
    except Exception:  # noqa: BLE001 (outside a Hypothesis test, or its internals moved: no order, never a crash)
        return None


def example_choices() -> tuple | None:
    """The Hypothesis choice sequence of the example being run (what its database stores, to replay
    and shrink it again: :mod:`shardfuzz.engine.finish`); None outside a Hypothesis test."""
    try:
        from hypothesis.control import current_build_context

        return tuple(current_build_context().data.choices)
    except Exception:  # noqa: BLE001 (outside a Hypothesis test, or its internals moved: no choices, never a crash)
        return None


class TimeUp(BaseException):
    """Raised by :class:`Deadline` inside a Hypothesis run: the time is spent (not a test failure)."""


class Overrun(TimeUp):
    """An example was still running the grace period after the deadline, and was abandoned."""


def grace_seconds() -> float:
    """:data:`GRACE_S`, or ``$SHARDFUZZ_GRACE`` (seconds, finite and > 0)."""
    text = os.environ.get("SHARDFUZZ_GRACE")
    if text is None or not text.strip():
        return GRACE_S
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not (value > 0 and math.isfinite(value)):
        raise InvalidArgument(f"SHARDFUZZ_GRACE={text!r}; must be a finite number of seconds > 0")
    return value


class Deadline(RunHooks):
    """Stops the search at ``time.perf_counter() >= at``."""

    def __init__(self, at: float) -> None:
        self.at = at
        #: set when :meth:`enforced` abandoned an example in flight
        self.overran = False

    @classmethod
    def after(cls, seconds: float) -> Deadline:
        return cls(time.perf_counter() + seconds)

    def before_example(self, runner: Runner, case: Case) -> None:  # noqa: ARG002 (the hook signature)
        if time.perf_counter() >= self.at:
            raise TimeUp()

    @contextlib.contextmanager
    def enforced(self, grace: float | None = None) -> Iterator[bool]:
        """Within this block, an example still running ``grace`` seconds (default
        :func:`grace_seconds`) after the deadline is abandoned: :class:`Overrun` is raised wherever
        the driver is waiting (a SIGALRM timer). Yields whether that is armed: only in the main
        thread, and only while nobody else (pytest-timeout, say) uses SIGALRM; otherwise the
        deadline only stops new examples, and an example in flight runs to its timeout."""
        grace = grace_seconds() if grace is None else grace
        armed = (
            hasattr(signal, "setitimer")
            and threading.current_thread() is threading.main_thread()
            and signal.getsignal(signal.SIGALRM) in (signal.SIG_DFL, None)
            and signal.getitimer(signal.ITIMER_REAL)[0] == 0.0
        )
        if not armed:
            yield False
            return

        def _alarm(_signum: int, _frame: object) -> None:
            self.overran = True
            raise Overrun()

        previous = signal.signal(signal.SIGALRM, _alarm)
        try:
            signal.setitimer(signal.ITIMER_REAL, max(0.001, self.at + grace - time.perf_counter()))
            yield True
        finally:
            signal.setitimer(signal.ITIMER_REAL, 0.0)
            signal.signal(signal.SIGALRM, previous)


class StickyInterrupt:
    """Ctrl-C that stays pending until it is acted on. Python raises KeyboardInterrupt wherever the
    main thread is when SIGINT arrives; inside a garbage-collector callback (Hypothesis installs
    one) or a ``__del__`` it is printed as "ignored" and lost, and the run would go on as if
    nothing happened. Within :meth:`armed`, the interrupt is remembered and :meth:`check` (called
    before every example) raises it again."""

    pending = False
    #: whether an outer :meth:`armed` block holds SIGINT: an inner one (a campaign's search runs)
    #: leaves the interrupt pending for it, where clearing it lost one swallowed at a run's end
    _held = False

    @classmethod
    @contextlib.contextmanager
    def armed(cls) -> Iterator[None]:
        usable = threading.current_thread() is threading.main_thread()
        previous = signal.getsignal(signal.SIGINT) if usable else None
        if cls._held and usable:
            yield
            return
        if previous is not signal.default_int_handler:
            # someone else handles SIGINT (or it is ignored: `cmd &` in a script, nohup): leave it
            # to them; a SIGTERM's pending interrupt is still acted on here, once, as when armed
            try:
                yield
            finally:
                cls.pending = False
            return

        def _interrupt(_signum: int, _frame: object) -> None:
            cls.pending = True
            raise KeyboardInterrupt()

        signal.signal(signal.SIGINT, _interrupt)
        cls._held = True
        try:
            yield
        finally:
            signal.signal(signal.SIGINT, previous)
            cls.pending, cls._held = False, False

    @classmethod
    def check(cls) -> None:
        if cls.pending:
            raise KeyboardInterrupt()
