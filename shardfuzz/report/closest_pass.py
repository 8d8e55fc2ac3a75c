"""A clean run's closest pass in words, one wording for the summary line, pytest's statistics and
the HTML page, and measured with the noise term (imports no torch: the pytest plugin's statistics
import it at its start)."""

from __future__ import annotations

from typing import Any

from shardfuzz.errors import ExternalFault, Finding


def closest_pass_words(
    ratio: float, upper_bound: bool, measured: float | None = None, rerun_failed: str | None = None
) -> str:
    """``0.405``; a ratio judged without the noise term (a sure pass, so the true one is lower):
    ``at most 1 (judged without the noise term; its case measures 0.155 with it)``. A bound reads
    as one: "closest pass 1" read as a run at the edge of its tolerance. ``rerun_failed``: the kind
    of finding its case gave when measured (:func:`measure_closest_pass`)."""
    words = f"{ratio:.3g}"
    if upper_bound:
        with_noise = f"; its case measures {measured:.3g} with it" if measured is not None else ""
        words = f"at most {words} (judged without the noise term{with_noise})"
    if rerun_failed:
        words += f"; its case gave a {rerun_failed} when run again: not deterministic?"
    return words


def measure_closest_pass(runner: Any) -> tuple[float | None, str | None]:
    """(the ratio with the noise term, None) of a clean run's closest pass that is an upper bound,
    judged again once on a runner of its own; (None, the finding's kind) when it fails now (it
    passed once: nondeterminism, which the summary says); (None, None) when there is nothing to
    measure (a failing run, a true ratio) or a rank was killed from outside meanwhile."""
    s = runner.stats
    if s.failures or s.closest_pass is None or not s.closest_pass_upper_bound:
        return None, None
    again = runner.with_hooks([])
    again.always_noise = True
    try:
        return again.run_case(s.closest_pass), None
    except Finding as f:
        return None, f.kind
    except ExternalFault:  # no measure; the bound still stands
        return None, None
