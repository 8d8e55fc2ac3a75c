"""No false positives: every built-in reference, and any target file given (``examples/*.py``),
under the ``shardfuzz-fuzz`` profile (random seeds, not derandomized, Hypothesis steering towards
the largest measured error/tolerance), N examples per target and dtype set.

    python benchmarks/no_false_positives.py [--examples 2000] [--dtypes mixed|each] [--edge] [TARGET-or-FILE ...]

``--dtypes mixed`` (default) draws float32, bfloat16 and float64 in one run of N examples;
``each`` runs N examples of each of float32, bfloat16 and float64. Prints, per target and dtype
set, the examples run, failures (must be 0), the worst passing error/tolerance (the closest pass),
the cases refused as unsupported and the time; a failure's report follows its line. ``--edge``
draws the ``edge`` value profile too, for every target that takes the default profiles (it is opt
in: ``docs/design.md`` D46).
"""

from __future__ import annotations

import argparse
import os
import sys
import time

os.environ.setdefault("OMP_NUM_THREADS", "1")


def main(argv=None) -> int:
    import shardfuzz
    from shardfuzz.spec.registry import BUILTIN_TARGETS, get_target

    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("targets", nargs="*", default=sorted(BUILTIN_TARGETS))
    p.add_argument("--examples", type=int, default=2000)
    p.add_argument("--dtypes", choices=("mixed", "each"), default="mixed")
    p.add_argument("--edge", action="store_true", help="add the edge profile to the default profiles")
    args = p.parse_args(argv)
    if args.edge:  # the targets call sst.cases() with its default profiles: widen the default
        import shardfuzz.strategies as sst

        sst.cases.__kwdefaults__["profiles"] = (*sst.cases.__kwdefaults__["profiles"], "edge")
    print(f"# loadavg {os.getloadavg()}, {os.cpu_count()} cpus, {time.strftime('%Y-%m-%d %H:%M:%S')}")
    print(
        f"{'target':<22} {'dtype':<9} {'examples':>8} {'failures':>8} {'worst pass':>10} {'unsupported':>11} "
        f"{'time':>7}"
    )
    bad = 0
    for name in args.targets:
        t = get_target(name)
        all3 = ("float32", "bfloat16", "float64")
        sets = [all3] if args.dtypes == "mixed" else [(d,) for d in all3]
        for dtypes in sets:
            dtype = "mixed" if len(dtypes) > 1 else dtypes[0]
            t0 = time.perf_counter()
            r = shardfuzz.run(
                t, profile="shardfuzz-fuzz", max_examples=args.examples, database=None, dtypes=dtypes
            )
            bad += r.found
            print(
                f"{t.name:<22} {dtype:<9} {r.stats.examples:>8} {r.stats.failures:>8} "
                f"{r.stats.worst_pass_ratio:>10.3g} {sum(r.stats.unsupported.values()):>11} "
                f"{time.perf_counter() - t0:>6.0f}s",
                flush=True,
            )
            if r.found:
                print(r.report)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
