"""Declared hooks: objects passed to a :class:`~shardfuzz.runner.Runner`, never attributes
assigned or methods swapped from outside.

A hook overrides what it needs:

* :meth:`RunHooks.before_example` runs before each example (a campaign's deadline raises there);
* :meth:`RunHooks.on_finding` runs for every finding, shrinking included (failure files are
  written there, so an interrupted run keeps what it found).
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # pragma: no cover
    from shardfuzz.case import Case
    from shardfuzz.errors import Finding
    from shardfuzz.runner import Runner


class RunHooks:
    """Base class of hooks: every method does nothing."""

    def before_example(self, runner: Runner, case: Case) -> None:
        """Called before each example; raising stops the search with that exception."""

    def on_finding(self, runner: Runner, case: Case, finding: Finding) -> None:
        """Called for every finding (Hypothesis' shrinking included)."""


class TimeUp(BaseException):
    """Raised by :class:`Deadline` inside a Hypothesis run: the time is spent (not a test failure)."""


class Deadline(RunHooks):
    """Stops the search at ``time.perf_counter() >= at``."""

    def __init__(self, at: float) -> None:
        self.at = at

    @classmethod
    def after(cls, seconds: float) -> Deadline:
        return cls(time.perf_counter() + seconds)

    def before_example(self, runner: Runner, case: Case) -> None:
        if time.perf_counter() >= self.at:
            raise TimeUp()
