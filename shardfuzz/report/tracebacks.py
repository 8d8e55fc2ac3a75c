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


#: a thread of shardfuzz's own in every rank (it answers the driver while the implementation runs)
_OWN_THREAD = "shardfuzz/ranks/worker.py"
#: the first frame of the rank's harness under the implementation: what runs the task, then
#: multiprocessing and the forkserver
_HARNESS_FRAME = "shardfuzz/ranks/task.py"


def rank_stack(dump: str) -> str:
    """A rank's faulthandler dump (every thread) as a hang report shows it: shardfuzz's own watchdog
    thread left out, and under the implementation's frames the rank harness's (the task runner,
    multiprocessing, the forkserver) folded into one line; a dump of another shape is kept whole.
    A new user read the watchdog thread and the 12 harness frames on every rank as noise."""
    kept = []
    for block in dump.split("\n\n"):
        lines = block.splitlines()
        if not lines or not lines[0].startswith(("Thread 0x", "Current thread 0x")):
            return dump
        paths = [line.replace("\\", "/") for line in lines]  # a Windows path matches too
        if any(_OWN_THREAD in line and "in _watchdog" in line for line in paths):
            continue
        cut = next((i for i, line in enumerate(paths) if _HARNESS_FRAME in line), None)
        if cut is not None and cut > 1:
            lines = [*lines[:cut], "  ... (shardfuzz's rank harness below: the task runner, the forkserver)"]
        kept.append("\n".join(lines))
    return "\n\n".join(kept) if kept else dump
