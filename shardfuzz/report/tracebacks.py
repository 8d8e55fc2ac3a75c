"""Failing tests show the finding first: the engine's frames are hidden from pytest's traceback
when (and only when) what propagates is a finding.

pytest hides a frame whose locals or globals hold a true ``__tracebackhide__``; a callable one is
asked with the exception info. Each module on the path from a test to a finding's raise site
(the plugin, the search, the covering rows, the runner, the report) sets
``__tracebackhide__ = hide_for_findings``: a :class:`~shardfuzz.errors.Finding` (or a group of them,
as Hypothesis raises for several distinct failures) then shows the user's own frames and the
report, not 75 lines of engine frames with object reprs, while any other exception (a bug of
shardfuzz, the user's oracle raising) keeps every frame. ``pytest --full-trace`` shows them all.
"""

from __future__ import annotations

from typing import Any

from shardfuzz.errors import Finding


def is_finding(exc: BaseException | None) -> bool:
    """A finding, or an exception group holding only findings (and groups of them)."""
    if isinstance(exc, Finding):
        return True
    inner = getattr(exc, "exceptions", None) or ()
    return isinstance(exc, BaseException) and bool(inner) and all(is_finding(e) for e in inner)


def hide_for_findings(excinfo: Any) -> bool:
    """pytest's ``__tracebackhide__`` predicate: hide this frame when a finding propagates."""
    return excinfo is not None and is_finding(getattr(excinfo, "value", None))
