"""Throughput of the TP MLP target, three ways, measured in the same run.

1. through shardfuzz: ``shardfuzz.run`` (Hypothesis, statistics, reports on failure);
2. the floor: the very cases Hypothesis generated in (1), run in a plain loop over the same warm
   pools with the same implementation, oracle and comparison, without Hypothesis;
3. a fresh process launch per example (spawned ranks, ``import torch`` each time) for a few cases.

It also times a pool restart, from the kill decision to the new pool being ready. Goals on the
2-core dev machine: >= 40 examples/s through shardfuzz, within 2x of the floor, restart < 1 s.

    python benchmarks/bench_tp.py [--examples 300] [--fresh 4]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

os.environ.setdefault("OMP_NUM_THREADS", "1")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--examples", type=int, default=300)
    p.add_argument(
        "--fresh", type=int, default=4, help="examples for the fresh-launch way (one per world size)"
    )
    args = p.parse_args(argv)

    import multiprocessing as mp

    import shardfuzz.spawn
    from shardfuzz import RunHooks
    from shardfuzz.case import Case
    from shardfuzz.config import RunConfig
    from shardfuzz.pool import Pool
    from shardfuzz.pools import discard_pool, get_pool
    from shardfuzz.protocol import Completed, Task
    from shardfuzz.runner import Runner
    from shardfuzz.search import search, settings_for

    class Record(RunHooks):
        """Remembers every case Hypothesis runs (the floor reruns the very same cases)."""

        def __init__(self) -> None:
            self.seen: list = []
            self.on = False

        def before_example(self, runner, case) -> None:
            if self.on:
                self.seen.append(case)

    record = Record()
    config = RunConfig(profile="shardfuzz-ci", max_examples=args.examples)
    runner = Runner("tp_mlp", None, config, hooks=[record])
    # warm every pool (world sizes 1-4) so that all three ways start from the same state
    for w in (1, 2, 3, 4):
        runner.run_case(
            Case(
                target="tp_mlp",
                world_size=w,
                mesh=(w,),
                sizes=dict(batch=1, seq=1, d_model=2, hidden=w, d_out=2),
                split=("hidden",),
            )
        )

    record.on = True
    t0 = time.perf_counter()
    result = search(runner, settings_for(config, quiet=True), database=None)
    seen = list(record.seen)
    record.on = False
    through = len(seen) / (time.perf_counter() - t0)
    assert not result.found, result.report
    worlds = sorted({c.world_size for c in seen})

    t0 = time.perf_counter()
    for case in seen:
        runner.run_case(case)
    floor = len(seen) / (time.perf_counter() - t0)

    # a fresh process launch per example: spawned ranks that import torch each time
    fresh_cases = [next(c for c in seen if c.world_size == w) for w in worlds][: args.fresh]
    forkserver, shardfuzz.spawn._ctx = shardfuzz.spawn._ctx, mp.get_context("spawn")
    try:
        t0 = time.perf_counter()
        for case in fresh_cases:
            pool = Pool("gloo", case.world_size, 30.0).start()
            pool.submit(Task(case, runner.worker_target, runner.impl_ref, 30.0))
            out = pool.collect(60.0)
            assert isinstance(out, Completed), out
            assert runner.verdict(case, out.replies, runner.expected(case)).passed  # type: ignore[arg-type]
            pool.stop()
        fresh = len(fresh_cases) / (time.perf_counter() - t0)
    finally:
        shardfuzz.spawn._ctx = forkserver

    restarts = []
    for _ in range(5):
        pool = get_pool("gloo", 4, 30.0)
        t0 = time.perf_counter()
        discard_pool(pool)
        get_pool("gloo", 4, 30.0)
        restarts.append(time.perf_counter() - t0)

    print(
        f"TP MLP forward+backward, world sizes {worlds}, {len(seen)} cases "
        f"(os.cpu_count()={os.cpu_count()}, OMP_NUM_THREADS={os.environ['OMP_NUM_THREADS']})"
    )
    print(f"{'way':<34} {'examples/s':>11} {'vs floor':>9}")
    print(f"{'through shardfuzz (Hypothesis)':<34} {through:>11.1f} {through / floor:>8.2f}x")
    print(f"{'floor: plain loop, warm pool':<34} {floor:>11.1f} {1.0:>8.2f}x")
    print(f"{'fresh process launch per example':<34} {fresh:>11.2f} {fresh / floor:>8.3f}x")
    print(
        f"shardfuzz is {floor / through:.2f}x slower than the floor (goal: within 2x) and "
        f"{through / fresh:.0f}x faster than a launch per example"
    )
    print(
        f"pool restart, world size 4, kill decision to ready: median {statistics.median(restarts) * 1000:.0f} ms, "
        f"max {max(restarts) * 1000:.0f} ms (goal: < 1000 ms)"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
