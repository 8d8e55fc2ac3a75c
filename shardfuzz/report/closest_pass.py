"""A clean run's closest pass in words, one wording for the summary line, pytest's statistics and
the HTML page, and measured with the noise term (imports no torch: the pytest plugin's statistics
import it at its start)."""

from __future__ import annotations

from typing import Any

from shardfuzz.errors import ExternalFault, Finding


def closest_pass_words(
    ratio: float,
    upper_bound: bool,
    measured: float | None = None,
    rerun_failed: str | None = None,
    measured_elsewhere: float = 0.0,
) -> str:
    """``0.405``; where the run's highest ratio is a bound judged without the noise term (a sure
    pass: the true ratio is lower), what was measured first and the bound after: ``0.155 measured,
    at most 1 (passes judged without the noise term are bounded, not measured)``. The measure is
    the larger of ``measured`` (the bound's case judged again with the noise term) and
    ``measured_elsewhere`` (the highest ratio among the passes judged with it): the closest pass
    lies between the two figures. Three new users read "closest pass at most 1 (...; its case
    measures 0.155 with it)" as a run at the edge of its tolerance; the bound's case measured alone
    would understate it where another case measured higher. Without a measure, ``at most 1
    (judged without the noise term)``. ``rerun_failed``: the kind of finding the bound's case gave
    when measured (:func:`measure_closest_pass`)."""
    words = f"{ratio:.3g}"
    if ratio == 0 and not measured_elsewhere and not measured:  # "0 measured, at most 0" said less
        return "0 (every compared element equal)" + (
            f"; its case gave a {rerun_failed} when run again: not deterministic?" if rerun_failed else ""
        )
    if upper_bound:
        low = max(measured if measured is not None else 0.0, measured_elsewhere)
        # a bound of 1 says only that they passed ("at most 1" told a new user nothing)
        vacuous = float(words) >= 1.0
        if measured is not None or measured_elsewhere > 0:
            words = (
                f"{low:.3g} measured (passes judged without the noise term are within their bound, not measured)"
                if vacuous
                else f"{low:.3g} measured, at most {words} (passes judged without the noise term are bounded, "
                "not measured)"
            )
        else:
            words = (
                "not measured (every pass was judged without the noise term, within its bound)"
                if vacuous
                else f"at most {words} (judged without the noise term)"
            )
    if rerun_failed:
        words += f"; its case gave a {rerun_failed} when run again: not deterministic?"
    return words


def closest_pass_case(
    bound_case: Any, upper_bound: bool, measured: float | None, measured_elsewhere: float, measured_case: Any
) -> Any:
    """The case the closest pass's words lead with, to be shown beside them: the bound's case, or,
    where a pass judged with the noise term measured higher than it, that pass's (the summary named
    the bound's case beside the other's figure, and a reader who reran it got 0.085, not 0.71)."""
    if upper_bound and measured_case is not None and measured_elsewhere > (measured or 0.0):
        return measured_case
    return bound_case


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
