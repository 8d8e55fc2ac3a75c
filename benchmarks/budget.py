"""Size the planted-bug tests' example budgets.

For each planted bug and expected failure, run the covering rows and then Hypothesis' generate
phase alone (no shrinking) with 20 different seeds and record how many examples it took to hit the
first failure (the rows are the same for every seed: a bug found on a row is found at the same
count every time). Prints p50, p95, the largest count, the seeds that missed within ``--cap``, and
the share of seeds that found it within the ``shardfuzz-ci`` budget (30 examples). The tests use
``2 * p95 + 10`` as their ``max_examples``: copy the p95 into the target's record. Run:

    python benchmarks/budget.py [TARGET ...] [--seeds 20] [--impls NAME,NAME]
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
    target: str, impl: str, seed: int, cap: int, timeout: float | None, exclude: tuple[str, ...] = ()
) -> int | None:
    import hypothesis
    from hypothesis import Phase, Verbosity

    from shardfuzz.engine.config import RunConfig
    from shardfuzz.engine.runner import Runner
    from shardfuzz.engine.search import build_test, findings_of
    from shardfuzz.engine.settings import build_settings

    runner = Runner(target, impl, RunConfig(timeout=timeout, exclude=exclude))
    s = build_settings(
        "shardfuzz-ci",
        derandomize=False,
        max_examples=cap,
        phases=[Phase.generate],
        verbosity=Verbosity.quiet,
        database=None,
    )
    test = hypothesis.seed(seed)(build_test(runner, s, database=None))
    try:
        test()
    except BaseException as e:
        if not findings_of(e):
            raise
    return runner.stats.first_failure_at


def main(argv=None) -> int:
    from shardfuzz.spec.registry import BUILTIN_TARGETS, get_target

    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("targets", nargs="*", default=sorted(BUILTIN_TARGETS))
    p.add_argument("--seeds", type=int, default=20)
    p.add_argument("--cap", type=int, default=500)
    p.add_argument(
        "--impls", default=None, help="only these planted bugs / expected failures (comma-separated)"
    )
    args = p.parse_args(argv)
    from shardfuzz.engine.settings import build_settings

    ci = build_settings("shardfuzz-ci").max_examples
    only = set(args.impls.split(",")) if args.impls else None
    print(
        f"# budget: loadavg {', '.join(f'{v:.2f}' for v in os.getloadavg())}, {args.seeds} seeds, ci budget {ci}"
    )
    print(f"{'target/impl':<40} {'p50':>5} {'p95':>5} {'max':>5} {'missed':>6} {'in ci':>6} {'time':>6}")
    for tname in args.targets:
        t = get_target(tname)
        for impl, rec in [*t.planted.items(), *t.expected_failures.items()]:
            if only is not None and impl not in only:
                continue
            t0 = time.perf_counter()
            timeout = rec.expect.timeout
            counts = [
                examples_to_failure(tname, impl, 1000 + k, args.cap, timeout, rec.expect.exclude)
                for k in range(args.seeds)
            ]
            found = sorted(c for c in counts if c is not None)
            missed = len(counts) - len(found)
            p95 = found[min(len(found) - 1, math.ceil(0.95 * len(found)) - 1)] if found else None
            p50 = statistics.median(found) if found else None
            in_ci = 100.0 * sum(1 for c in found if c <= ci) / len(counts)
            print(
                f"{tname + '/' + impl:<40} {p50!s:>5} {p95!s:>5} {max(found, default=None)!s:>5} {missed:>6} "
                f"{in_ci:>5.0f}% {time.perf_counter() - t0:>5.0f}s",
                flush=True,
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
