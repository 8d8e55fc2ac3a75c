"""A clean run's closest pass in words, one wording for the summary line, pytest's statistics and
the HTML page (imports nothing: the pytest plugin's statistics import it without torch)."""

from __future__ import annotations


def closest_pass_words(ratio: float, upper_bound: bool, measured: float | None = None) -> str:
    """``0.405``; a ratio judged without the noise term (a sure pass, so the true one is lower):
    ``at most 1 (judged without the noise term; its case measures 0.155 with it)``. A bound reads
    as one: "closest pass 1" read as a run at the edge of its tolerance."""
    if not upper_bound:
        return f"{ratio:.3g}"
    with_noise = f"; its case measures {measured:.3g} with it" if measured is not None else ""
    return f"at most {ratio:.3g} (judged without the noise term{with_noise})"
