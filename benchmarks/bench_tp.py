"""Throughput of the TP MLP target, four ways, measured in the same run on the very same cases.

1. through shardfuzz: ``shardfuzz.run`` (Hypothesis, statistics, reports on failure);
2. the ``Runner`` loop: the cases Hypothesis generated in (1), run with ``Runner.run_case`` in a
   plain loop over the same warm pools (everything shardfuzz does per example, without Hypothesis);
3. the bare floor: the same cases on warm bare ranks that only build the inputs and run the
   implementation, while the driver computes the float64 oracle and calls
   ``torch.testing.assert_close`` with fixed tolerances (:mod:`bare_ranks`): what a hand-written
   differential test costs;
4. a fresh process launch per example (spawned ranks, ``import torch`` each time) for a few cases.

It also times a pool restart, from the kill decision to the new pool being ready. Goals on the
2-core dev machine: >= 40 examples/s through shardfuzz, within 1.3x of the bare floor, restart < 1 s.

``--breakdown``: one more, instrumented, pass of the ``Runner`` loop over the same cases, timing
each stage of an example in the driver (send, oracle, wait for the ranks, noise, judge, budget,
report) and in the ranks (:mod:`rank_probe`: state reset and leak checks, trace, encode), plus
Hypothesis' own share (draw, shrink, statistics) from (1); so the next regression shows where it
lands. Timers cost a little themselves: compare breakdowns with each other, not with (1)-(3).

``--plain``: the plain MLP's cases only (:mod:`tp_mlp_plain`), which is what this benchmark drew at
37b22b1; the sequence-parallel cases added since cost the ranks about twice as much, so only this
way compares engines across that change on the same kind of work.

    python benchmarks/bench_tp.py [--examples 300] [--fresh 4] [--breakdown] [--plain]
"""

from __future__ import annotations

import argparse
import collections
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
    p.add_argument("--breakdown", action="store_true", help="the cost per stage, from one instrumented pass")
    p.add_argument(
        "--plain",
        action="store_true",
        help="only the plain MLP's cases (benchmarks/tp_mlp_plain.py): the case distribution of this "
        "benchmark at 37b22b1, before tp_mlp's sequence-parallel branch",
    )
    args = p.parse_args(argv)

    import multiprocessing as mp

    import shardfuzz.ranks.spawn
    from shardfuzz import RunHooks
    from shardfuzz.case import Case
    from shardfuzz.engine import covering
    from shardfuzz.engine.config import RunConfig
    from shardfuzz.engine.runner import Runner
    from shardfuzz.engine.search import search, settings_for
    from shardfuzz.protocol import Completed, Task
    from shardfuzz.ranks.pool import Pool
    from shardfuzz.ranks.pool_cache import discard_pool, get_pool

    class Record(RunHooks):
        """Remembers every case Hypothesis runs (the floor reruns the very same cases)."""

        def __init__(self) -> None:
            self.seen: list = []
            self.on = False

        def before_example(self, runner, case) -> None:
            if self.on:
                self.seen.append(case)

    load_before = f"{os.getloadavg()[0]:.2f}"
    record = Record()
    config = RunConfig(profile="shardfuzz-ci", max_examples=args.examples)
    target = (
        f"{os.path.join(os.path.dirname(os.path.abspath(__file__)), 'tp_mlp_plain.py')}::tp_mlp_plain"
        if args.plain
        else "tp_mlp"
    )
    runner = Runner(target, None, config, hooks=[record])
    # warm every pool (world sizes 1-4) so that all three ways start from the same state
    for w in (1, 2, 3, 4):
        runner.run_case(
            Case(
                target=runner.target.name,
                world_size=w,
                mesh=(w,),
                sizes=dict(batch=1, seq=1, d_model=2, hidden=w, d_out=2),
                split=("hidden",),
            )
        )

    # the covering rows' pool of the target: drawn once per process (like the pools' start, a
    # one-time cost that a campaign amortises), timed here and printed on its own
    t0 = time.perf_counter()
    covering.rows_for(runner)
    covering_s = time.perf_counter() - t0

    record.on = True
    in_cases = [0.0]  # seconds inside run_case during the search: the rest is Hypothesis' own
    run_case = runner.run_case

    def timed_run_case(case):
        t = time.perf_counter()
        try:
            return run_case(case)
        finally:
            in_cases[0] += time.perf_counter() - t

    runner.run_case = timed_run_case  # type: ignore[method-assign]
    c0, t0 = cpu(pool_pids()), time.perf_counter()
    result = search(runner, settings_for(config, quiet=True), database=None)
    searching = time.perf_counter() - t0
    cpu_through = cpu(pool_pids()) - c0
    del runner.run_case
    seen = list(record.seen)
    record.on = False
    through = len(seen) / searching
    assert not result.found, result.report
    worlds = sorted({c.world_size for c in seen})

    c0, t0 = cpu(pool_pids()), time.perf_counter()
    for case in seen:
        runner.run_case(case)
    loop = len(seen) / (time.perf_counter() - t0)
    cpu_loop = cpu(pool_pids()) - c0

    from bare_ranks import BareFloor

    bare = BareFloor(runner.target, runner.worker_target, runner.impl_ref.ref, worlds)
    try:
        bare.run(seen[:20])  # warm: first examples per mesh build groups and import lazily
        bare_pids = [p.pid for procs in bare.ranks.values() for p, _ in procs]
        c0, t0 = cpu(bare_pids), time.perf_counter()
        flagged = bare.run(seen)
        floor = len(seen) / (time.perf_counter() - t0)
        cpu_floor = cpu(bare_pids) - c0
    finally:
        bare.stop()

    stages = breakdown(runner, seen, searching - in_cases[0]) if args.breakdown else None

    # a fresh process launch per example: spawned ranks that import torch each time
    fresh_cases = [next(c for c in seen if c.world_size == w) for w in worlds][: args.fresh]
    forkserver, shardfuzz.ranks.spawn._ctx = shardfuzz.ranks.spawn._ctx, mp.get_context("spawn")
    try:
        t0 = time.perf_counter()
        for case in fresh_cases:
            pool = Pool("gloo", case.world_size, 30.0).start()
            pool.submit(Task(case, runner.worker_target, runner.impl_ref, 30.0))
            out = pool.collect(60.0)
            assert isinstance(out, Completed), out
            assert runner.verdict(case, out.replies, runner.expected(case)).passed  # type: ignore[arg-type]
            pool.stop()
        fresh = len(fresh_cases) / (time.perf_counter() - t0) if fresh_cases else 0.0
    finally:
        shardfuzz.ranks.spawn._ctx = forkserver

    restarts = []
    for _ in range(5):
        pool = get_pool("gloo", 4, 30.0)
        t0 = time.perf_counter()
        discard_pool(pool)
        get_pool("gloo", 4, 30.0)
        restarts.append(time.perf_counter() - t0)

    print(
        f"TP MLP forward+backward{' (plain MLP cases only)' if args.plain else ''}, world sizes {worlds}, {len(seen)} cases "
        f"(os.cpu_count()={os.cpu_count()}, OMP_NUM_THREADS={os.environ['OMP_NUM_THREADS']}); "
        f"load average {load_before} before the run, {os.getloadavg()[0]:.2f} after"
    )
    n = len(seen)
    ms = lambda seconds: f"{seconds / n * 1000:>13.1f}"
    print(f"{'way':<38} {'examples/s':>11} {'vs floor':>9} {'CPU ms/case':>13} {'CPU vs floor':>13}")
    print(
        f"{'through shardfuzz (Hypothesis)':<38} {through:>11.1f} {through / floor:>8.2f}x "
        f"{ms(cpu_through)} {cpu_through / cpu_floor:>12.2f}x"
    )
    print(
        f"{'Runner loop: run_case, warm pools':<38} {loop:>11.1f} {loop / floor:>8.2f}x "
        f"{ms(cpu_loop)} {cpu_loop / cpu_floor:>12.2f}x"
    )
    print(
        f"{'bare floor: ranks, oracle, assert_close':<38} {floor:>11.1f} {1.0:>8.2f}x {ms(cpu_floor)} {1.0:>12.2f}x"
    )
    if fresh:  # --fresh 0 skips it
        print(f"{'fresh process launch per example':<38} {fresh:>11.2f} {fresh / floor:>8.3f}x")
    than_fresh = f" and {through / fresh:.0f}x faster than a launch per example" if fresh else ""
    print(
        f"shardfuzz takes {floor / through:.2f}x the bare floor's time per case (goal: within 1.3x){than_fresh}; "
        f"the floor's fixed tolerances flagged {flagged} of these {len(seen)} correct cases"
    )
    # the draws decide how much rank work a case is: a 4-rank case is about twice a 2-rank one on
    # 2 cores, so two checkouts whose strategies draw other world sizes compare per rank-case too
    mix = collections.Counter(c.world_size for c in seen)
    ranks_per_case = sum(w * k for w, k in mix.items()) / n
    print(
        f"case mix: world sizes {dict(sorted(mix.items()))}, {ranks_per_case:.2f} ranks per case; "
        f"through shardfuzz {through * ranks_per_case:.1f} rank-cases/s (one rank's part of one case)"
    )
    print(
        f"pool restart, world size 4, kill decision to ready: median {statistics.median(restarts) * 1000:.0f} ms, "
        f"max {max(restarts) * 1000:.0f} ms (goal: < 1000 ms)"
    )
    print(f"covering rows' pool of the target (once per process, before the search): {covering_s:.2f} s")
    if stages is not None:
        print_breakdown(stages, len(seen))
    return 0


def cpu(pids: list[int]) -> float:
    """CPU seconds used so far by the driver (all its threads) and the processes ``pids``: a
    figure that a loaded machine changes far less than the wall time."""
    from shardfuzz.ranks.spawn import cpu_seconds

    return time.process_time() + sum(cpu_seconds(p) or 0.0 for p in pids)


def pool_pids() -> list[int]:
    from shardfuzz.ranks.pool_cache import _pools

    return [p.pid for pool in _pools.values() for p in pool.procs]


def breakdown(runner, cases, hypothesis_s: float) -> dict[str, float]:
    """Seconds per stage over ``cases``: one instrumented pass of the Runner loop (driver-side
    wrappers; rank-side timers from :mod:`rank_probe`), and Hypothesis' share of the search."""
    import collections
    import functools
    import glob
    import json

    import shardfuzz.engine.runner as runner_mod
    import shardfuzz.verdict.decide as decide_mod
    from shardfuzz.protocol import Warm
    from shardfuzz.ranks.pool import Pool
    from shardfuzz.ranks.pool_cache import _pools
    from shardfuzz.report.findings import Reporter

    totals: collections.Counter = collections.Counter()
    pools = list(_pools.values())
    for pool in pools:
        pool.send_all(Warm("rank_probe:none", runner.impl_ref.ref))  # imports the probe; no answer
    patched = []

    def timed(owner, name, stage):
        fn = getattr(owner, name)

        @functools.wraps(fn)
        def wrapper(*args, **kwargs):
            t0 = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                totals[stage] += time.perf_counter() - t0

        setattr(owner, name, wrapper)
        patched.append((owner, name, fn))

    timed(Pool, "submit", "send")
    timed(runner, "expected", "oracle (while the ranks work)")
    timed(Pool, "collect", "ranks (the wait after the oracle)")
    timed(decide_mod, "estimate_noise", "noise estimate")
    timed(decide_mod, "confirm_noise", "noise recheck")
    timed(runner, "verdict", "judge (with the noise)")
    timed(runner_mod, "over_budget", "communication budget")
    timed(Reporter, "raise_verdict", "report (verdict to finding)")
    timed(runner, "_note_leaks", "leak summary (driver)")
    timed(runner_mod, "regroup", "regroup check (driver)")
    try:
        t0 = time.perf_counter()
        for case in cases:
            runner.run_case(case)
        totals["Runner loop (instrumented)"] = time.perf_counter() - t0
    finally:
        for owner, name, fn in reversed(patched):
            setattr(owner, name, fn)
    totals["judge (with the noise)"] -= totals["noise estimate"] + totals["noise recheck"]
    totals["draw, shrink, stats (Hypothesis, from the search)"] = hypothesis_s
    ranks: collections.Counter = collections.Counter()
    for path in [p for pool in pools for p in glob.glob(os.path.join(pool.outdir, "probe-*.json"))]:
        with open(path) as f:
            ranks.update(json.load(f))
    for stage in ("state reset and leak checks", "trace", "encode outputs", "run_task"):
        totals[f"in ranks: {stage} (sum over ranks)"] = ranks.get(stage, 0.0)
    return dict(totals)


def print_breakdown(stages: dict[str, float], n: int) -> None:
    print(f"breakdown over {n} cases (ms per example; rank stages summed over the ranks):")
    for stage, seconds in stages.items():
        print(f"  {stage:<52} {seconds / n * 1000:>8.2f} ms")


if __name__ == "__main__":
    sys.exit(main())
