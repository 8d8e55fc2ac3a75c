"""A clean run's closest pass and a finding's margin in words, one wording for the summary line,
pytest's statistics and the HTML page, and measured with the noise term (imports no torch: the
pytest plugin's statistics import it at its start)."""

from __future__ import annotations

import math
from typing import Any

from shardfuzz.errors import ExternalFault, Finding, InfrastructureError


def leading_figure(
    ratio: float, upper_bound: bool, measured: float | None, measured_elsewhere: float
) -> float:
    """The figure a closest pass's words lead with: the ratio itself, or for an upper bound the
    highest measured with the noise term (``measured``: the bound's own case; ``measured_elsewhere``:
    the other passes)."""
    return max(measured or 0.0, measured_elsewhere) if upper_bound else ratio


def closest_pass_words(
    ratio: float,
    upper_bound: bool,
    measured: float | None = None,
    rerun_failed: str | None = None,
    measured_elsewhere: float = 0.0,
    rechecked: float | None = None,
) -> str:
    """``0.405``; where the run's highest ratio is a bound judged without the noise term (a sure
    pass: the true ratio is lower), what was measured, and the bound in its bracket: ``0.155
    (measured; the passes not measured passed a stricter check, the bound without the noise term, at
    up to 0.62)`` (three new
    users could not tell which of "0.155 measured, at most 0.62" to quote, and two which of "between
    0.155 (measured) and 0.62 (the bound ...)" was the headroom). The measure is
    the larger of ``measured`` (the bound's case judged again with the noise term) and
    ``measured_elsewhere`` (the highest ratio among the passes judged with it): the closest pass
    lies between the two figures. Three new users read "closest pass at most 1 (...; its case
    measures 0.155 with it)" as a run at the edge of its tolerance; the bound's case measured alone
    would understate it where another case measured higher. Without a measure, ``at most 1
    (judged without the noise term)``. ``rerun_failed``: the kind of finding the bound's case gave
    when measured (:func:`measure_closest_pass`). ``rechecked``: the leading figure's case judged
    again with the recheck a failure gets before it is reported (:func:`recheck_closest_pass`),
    said where it is lower: how near a report the run really came."""
    words = f"{ratio:.3g}"
    if ratio == 0 and not measured_elsewhere and not measured:  # "0 measured, at most 0" said less
        return "0 (every compared element equal)" + (
            f"; its case gave a {rerun_failed} when run again: not deterministic?" if rerun_failed else ""
        )
    lead = leading_figure(ratio, upper_bound, measured, measured_elsewhere)
    # right after the figure it qualifies (a second bracket at the end read as the bound's)
    recheck = (
        f"{rechecked:.3g} with the recheck a failure gets before it is reported"
        if rechecked is not None and said_lower(rechecked, lead)
        else ""
    )
    second = f" ({recheck})" if recheck else ""
    if upper_bound:
        # a bound of 1 says only that they passed ("at most 1" told a new user nothing): the range
        # ends at 1, said so (one form for every range: a new user read two forms as two things)
        vacuous = float(words) >= 1.0
        if measured is not None or measured_elsewhere > 0:
            # the same order as below: the measure, its recheck, then what the bound says (a new
            # user read the two orders as two different things)
            # the figure first, alone, and the bound inside its bracket: "between 0.124 (measured)
            # and 0.988 (the bound ...)" left two new users unsure which number was the headroom
            # "a stricter check": a new user read "are within 0.992" as a pass at the edge of its
            # tolerance; the bound without the noise term is the tighter one
            # and a bound near 1 is no figure either: any long run has one, whatever the code does,
            # and three new users read "at up to 0.999" as a pass at the edge of failing
            up_to = "" if float(words) >= BOUND_SAID_BELOW else f", at up to {words}"
            words = (
                f"{lead:.3g} (measured{'; ' + recheck if recheck else ''}; the passes not measured passed a "
                f"stricter check, the bound without the noise term{up_to})"
            )
        else:
            words = (
                "not measured (every pass was judged without the noise term, within its bound)"
                if vacuous
                else f"at most {words} (judged without the noise term)"
            )
    else:
        words += second
    if rerun_failed:
        words += f"; its case gave a {rerun_failed} when run again: not deterministic?"
    return words


#: the bound of the unmeasured passes is said beside a measured closest pass only below this
BOUND_SAID_BELOW = 0.9


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


#: a clean run's closest pass at or above this is judged once more with the recheck's samples
RECHECK_FROM = 0.5


def recheck_closest_pass(runner: Any, measured: float | None) -> tuple[float | None, str | None]:
    """(the error/tolerance, None) of the case a clean run's closest pass leads with (``measured``:
    the bound's case measured by :func:`measure_closest_pass`), judged again with its noise widened
    by the recheck a failure gets before it is reported (``DecideConfig.recheck``), where the
    leading figure is :data:`RECHECK_FROM` or more. A figure near 1 is often a first estimate whose
    few noise samples all fell small, which the recheck would have caught: a new user's correct
    float64 attention led with 0.962, 0.37 after the recheck. (None, None) where there is nothing
    to look at (a failing run, a figure below :data:`RECHECK_FROM` or none measured), where a rank
    was killed from outside, or where the recheck's narrower bound fails it (the first figure then
    stands: the run came no nearer a report); (None, the kind) where it now fails another way (it
    passed once: nondeterminism, said as :func:`measure_closest_pass` says it)."""
    s = runner.stats
    if s.failures or s.closest_pass is None:
        return None, None
    lead = leading_figure(s.worst_pass_ratio, s.closest_pass_upper_bound, measured, s.measured_pass_ratio)
    if lead < RECHECK_FROM:
        return None, None
    case = closest_pass_case(
        s.closest_pass, s.closest_pass_upper_bound, measured, s.measured_pass_ratio, s.measured_pass_case
    )
    return judged_with_recheck(runner, case)


def judged_with_recheck(runner: Any, case: Any) -> tuple[float | None, str | None]:
    """(the error/tolerance, None) of ``case`` judged again by a copy of ``runner`` with the noise
    widened by the recheck; (None, None) where the recheck's narrower bound fails it (the first
    figure stands) or the ranks were lost (the figure is extra: a pool that fails for it must not
    turn a pass into an error); (None, the kind) where it fails another way (nondeterminism)."""
    again = runner.with_hooks([])
    again.always_noise = again.recheck = True
    try:
        return again.run_case(case), None
    except Finding as f:
        return None, (None if f.kind == "mismatch" else f.kind)
    except InfrastructureError:  # ExternalFault too: no second figure; the first stands
        return None, None


def said_lower(rechecked: float, first: float) -> bool:
    """Whether a rechecked figure is worth saying beside the first: lower, and not the same to 3
    significant digits."""
    return rechecked < first and f"{rechecked:.3g}" != f"{first:.3g}"


def margin_text(ratio: float, why: str | None = None) -> str:
    """A finding's margin (error/tolerance) as summaries print it; an infinite one says why no
    tolerance could pass it (a user read ``infx`` beside a float output reported at 6.7e+07x: an
    exactly compared index output differed too): ``why`` from :func:`infinite_margin_why` where the
    finding's comparisons are at hand, else both causes."""
    if math.isinf(ratio):
        return f"inf ({why or INFINITE_MARGIN})"
    return f"{ratio:.3g}x ({why})" if why else f"{ratio:.3g}x"


#: why a margin is infinite, where the finding's comparisons are not at hand
INFINITE_MARGIN = (
    "an exactly compared output differs, or a value is NaN or inf where the other side's is finite"
)


def margin_why(diffs: Any, ratio: float | None) -> str | None:
    """What a summary says beside a mismatch's margin: why it is infinite
    (:func:`infinite_margin_why`), or the output it is of (a new user read 44.9x in the summary
    and 2.48x at the top of the report, the first output's, and could not tell which it was)."""
    if ratio is None or math.isinf(ratio):
        return infinite_margin_why(diffs)
    names = [od.name for od in diffs or () if od.max_ratio == ratio]
    return f"in {', '.join(names)}" if names else None


def infinite_margin_why(diffs: Any) -> str | None:
    """Which of :data:`INFINITE_MARGIN`'s causes a mismatch's comparisons (its ``diffs``) show, by
    output (a new user whose loss was 0/0 could not tell from the summary line which it was); None
    where none of its outputs is infinitely past its bound."""
    why = []
    for od in diffs or ():
        if not math.isinf(od.max_ratio):
            continue
        worst = [e for r in od.ranks for e in r.worst if math.isinf(e.ratio)]
        if any(not math.isfinite(e.actual) and math.isfinite(e.expected) for e in worst):
            why.append(f"{od.name} is NaN or inf where the oracle's is finite")
        elif any(math.isfinite(e.actual) and not math.isfinite(e.expected) for e in worst):
            # a new user's loss averaged over no token: the oracle's 0/0 read as "a bound of 0"
            why.append(f"the oracle's {od.name} is NaN or inf where the implementation's is finite")
        elif "float" not in od.dtype:
            why.append(f"{od.name}, compared exactly, differs")
        else:  # a bound of 0 (a fixed tolerance of 0, an exactly known value) and any difference
            why.append(f"{od.name} differs where its bound is 0")
    return "; ".join(why) or None
