"""The cost of the collective trace: examples/s with tracing on and off, on the same cases, in the
same run, alternating so that a change in the machine's load hits both sides alike.

For each target, ``--cases`` cases are drawn from its strategy (derandomized), every pool is
warmed, then the cases run ``--rounds`` times each way, on and off taking turns per round. The
budget (issue 12) is at most 10% fewer examples/s with tracing on.

    python benchmarks/trace_cost.py [--targets tp_mlp,ring_attention,moe] [--cases 60] [--rounds 3]
"""

from __future__ import annotations

import argparse
import os
import time

os.environ.setdefault("OMP_NUM_THREADS", "1")


def draw(runner, n: int) -> list:
    """``n`` random cases of the runner's strategy, the same on every run (shardfuzz's one sampler)."""
    from shardfuzz.spec.sampling import draw_pool, stable_seed

    return [case for case, _ in draw_pool(runner.strategy(), stable_seed("trace_cost"), n)]


def timed(runner, cases: list, trace: bool) -> float:
    from shardfuzz.errors import Finding, Unsupported

    runner.trace = trace
    t0 = time.perf_counter()
    for case in cases:
        try:
            runner.run_case(case)
        except (Finding, Unsupported):
            pass
    return time.perf_counter() - t0


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--targets", default="tp_mlp,ring_attention,moe")
    p.add_argument("--cases", type=int, default=60)
    p.add_argument("--rounds", type=int, default=3)
    args = p.parse_args(argv)
    from shardfuzz.engine.runner import Runner

    print(f"load: {os.getloadavg()}")
    print(f"{'target':<16} {'cases':>5} {'off ex/s':>9} {'on ex/s':>9} {'on/off':>7}")
    worst = 1.0
    for name in args.targets.split(","):
        runner = Runner(name)
        cases = draw(runner, args.cases)
        timed(runner, cases, True)  # warm: pools, imports, oracles' first runs
        off = on = 0.0
        for r in range(args.rounds):
            for trace in (True, False) if r % 2 else (False, True):
                took = timed(runner, cases, trace)
                if trace:
                    on += took
                else:
                    off += took
        n = len(cases) * args.rounds
        ratio = (n / on) / (n / off)
        worst = min(worst, ratio)
        print(f"{name:<16} {len(cases):>5} {n / off:>9.1f} {n / on:>9.1f} {ratio:>7.3f}")
    print(f"load: {os.getloadavg()}")
    print(f"worst on/off ratio {worst:.3f} (budget: >= 0.90)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
