"""Size the planted-bug tests' example budgets, and measure how often the ci run finds each bug.

For each planted bug and expected failure, run the very test the suite runs (the covering rows,
then Hypothesis' derandomized runs: :func:`shardfuzz.engine.search.build_test`) without shrinking,
stopping at the first failure, on 20 seed schedules: schedule 0 is the one ``pytest
--hypothesis-profile=ci`` and ``shardfuzz.run(profile="shardfuzz-ci")`` use, the others are salted
(``/budget1``...). A derandomized budget is a prefix of any larger one, so one run of ``--cap``
examples tells both how many examples the first failure took and whether a smaller budget finds it.

Prints p50, p95, the largest count, the schedules that missed within ``--cap``, the share found
within the ``shardfuzz-ci`` budget (30 examples: what a user's CI run gets) and within the test's
own budget (``2 * p95 + 10``, from the record), and whether schedule 0 (the suite's) finds it. The
tests use ``2 * p95 + 10`` as their ``max_examples``: copy the p95 into the target's record. Exits 1
when some bug is found within 30 examples in fewer than ``--need`` percent of the schedules. Run:

    python benchmarks/budget.py [TARGET ...] [--seeds 20] [--impls NAME,NAME] [--need 95]
"""

from __future__ import annotations

import argparse
import math
import os
import statistics
import sys
import time

os.environ.setdefault("OMP_NUM_THREADS", "1")


def examples_to_failure(
    target: str,
    impl: str,
    seed: int,
    cap: int,
    timeout: float | None,
    exclude: tuple[str, ...] = (),
    options: tuple[tuple[str, object], ...] = (),
) -> int | None:
    """Examples (rows included) until the first failure on seed schedule ``seed`` (0: the ci one),
    or None when ``cap`` examples find nothing."""
    from hypothesis import Phase, Verbosity

    from shardfuzz.engine.config import RunConfig
    from shardfuzz.engine.runner import Runner
    from shardfuzz.engine.search import build_test, findings_of
    from shardfuzz.engine.settings import build_settings

    runner = Runner(target, impl, RunConfig(timeout=timeout, exclude=exclude, options=dict(options)))
    ci = build_settings("shardfuzz-ci")
    s = build_settings(
        "shardfuzz-ci",
        max_examples=cap,
        phases=[p for p in ci.phases if p is not Phase.shrink],  # the ci run's, up to its first failure
        report_multiple_bugs=False,
        verbosity=Verbosity.quiet,
    )
    test = build_test(runner, s, database=None, seed_salt=f"/budget{seed}" if seed else "")
    try:
        test()
    except BaseException as e:
        if not findings_of(e):
            raise
    return runner.stats.first_failure_at


def share_within(counts: list[int | None], budget: int) -> float:
    """The percentage of ``counts`` (None: missed) at or under ``budget``."""
    return 100.0 * sum(1 for c in counts if c is not None and c <= budget) / len(counts)


def p95_of(counts: list[int | None]) -> int | None:
    """The 95th percentile of the schedules that found it (None: none did)."""
    found = sorted(c for c in counts if c is not None)
    return found[min(len(found) - 1, math.ceil(0.95 * len(found)) - 1)] if found else None


def main(argv=None) -> int:
    from shardfuzz.frontends.testing import budget
    from shardfuzz.spec.registry import BUILTIN_TARGETS, get_target

    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("targets", nargs="*", default=sorted(BUILTIN_TARGETS))
    p.add_argument("--seeds", type=int, default=20)
    p.add_argument("--cap", type=int, default=500)
    p.add_argument("--need", type=float, default=95.0, help="percent of schedules within 30 examples")
    p.add_argument(
        "--impls", default=None, help="only these planted bugs / expected failures (comma-separated)"
    )
    args = p.parse_args(argv)
    from shardfuzz.engine.settings import build_settings

    ci = build_settings("shardfuzz-ci").max_examples
    only = set(args.impls.split(",")) if args.impls else None
    print(
        f"# budget: loadavg {', '.join(f'{v:.2f}' for v in os.getloadavg())}, {args.seeds} seed "
        f"schedules (0: the ci one), ci budget {ci}, cap {args.cap}"
    )
    head = f"{'target/impl':<44} {'p50':>5} {'p95':>5} {'max':>5} {'missed':>6} {'in ci':>6} {'test':>5}"
    print(f"{head} {'in test':>7} {'ci run':>6} {'time':>6}")
    short = []
    for tname in args.targets:
        t = get_target(tname)
        for impl, rec in [*t.planted.items(), *t.expected_failures.items()]:
            if only is not None and impl not in only:
                continue
            t0 = time.perf_counter()
            timeout = rec.expect.timeout
            counts = [
                examples_to_failure(tname, impl, k, args.cap, timeout, rec.expect.exclude, rec.expect.options)
                for k in range(args.seeds)
            ]
            found = [c for c in counts if c is not None]
            test_budget = budget(rec.p95)
            in_ci, in_test = share_within(counts, ci), share_within(counts, test_budget)
            ci_run = "found" if counts[0] is not None and counts[0] <= test_budget else "MISSED"
            p50 = statistics.median(found) if found else None
            print(
                f"{tname + '/' + impl:<44} {p50!s:>5} {p95_of(counts)!s:>5} {max(found, default=None)!s:>5} "
                f"{len(counts) - len(found):>6} {in_ci:>5.0f}% {test_budget:>5} {in_test:>6.0f}% {ci_run:>6} "
                f"{time.perf_counter() - t0:>5.0f}s",
                flush=True,
            )
            if in_ci < args.need:
                short.append(f"{tname}/{impl} ({in_ci:.0f}%)")
    print(f"# within {ci} examples in fewer than {args.need:g}% of schedules: {', '.join(short) or 'none'}")
    return 1 if short else 0


if __name__ == "__main__":
    sys.exit(main())
