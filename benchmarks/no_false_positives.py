"""No false positives: every built-in reference under the ``shardfuzz-fuzz`` profile (random seeds,
not derandomized), with at least N examples in float32 and N in bfloat16.

    python benchmarks/no_false_positives.py [--examples 500] [TARGET ...]

Prints, per target and dtype, the examples run, failures (must be 0) and the worst passing
error/tolerance.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

os.environ.setdefault("OMP_NUM_THREADS", "1")


def main(argv=None) -> int:
    import shardfuzz
    from shardfuzz.registry import BUILTIN_TARGETS, get_target

    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("targets", nargs="*", default=sorted(BUILTIN_TARGETS))
    p.add_argument("--examples", type=int, default=500)
    args = p.parse_args(argv)
    print(f"{'target':<18} {'dtype':<9} {'examples':>8} {'failures':>8} {'worst pass':>10} {'time':>7}")
    bad = 0
    for name in args.targets:
        t = get_target(name)
        for dtype in ("float32", "bfloat16"):
            t0 = time.perf_counter()
            r = shardfuzz.run(
                t, profile="shardfuzz-fuzz", max_examples=args.examples, database=None, dtypes=(dtype,)
            )
            bad += r.found
            print(
                f"{name:<18} {dtype:<9} {r.stats.examples:>8} {r.stats.failures:>8} "
                f"{r.stats.worst_pass_ratio:>10.3g} {time.perf_counter() - t0:>6.0f}s",
                flush=True,
            )
            if r.found:
                print(r.report)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
