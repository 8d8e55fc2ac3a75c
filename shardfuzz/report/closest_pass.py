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
    ``at most 1 (judged without the noise term)``, and once its case is measured with it, that
    measure first: ``0.155 with the noise term, on the case nearest the bound without it (1 judged
    without the noise term: an upper bound for every case)``. Three new users read "closest pass at
    most 1 (...; its case measures 0.155 with it)" as a run at the edge of its tolerance, and could
    not tell which number was the margin. ``rerun_failed``: the kind of finding its case gave when
    measured (:func:`measure_closest_pass`)."""
    words = f"{ratio:.3g}"
    if upper_bound and measured is not None:
        words = (
            f"{measured:.3g} with the noise term, on the case nearest the bound without it "
            f"({words} judged without the noise term: an upper bound for every case)"
        )
    elif upper_bound:
        words = f"at most {words} (judged without the noise term)"
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
