"""Fast while failing: throughput of a campaign where every other example crashes a rank, against
a passing one, with the pool regrouped in place after a crash (the default) and without (a fresh
pool from a warm spare, or started afresh); and the time from ``shardfuzz fuzz`` to its first
example, against the floor of ``import torch`` alone. Figures are measured in the same run.

    python benchmarks/failing_speed.py [--examples 120] [--target tp_mlp] [--starts 3]

Every other example crashes: :func:`crash_every_other` is the target's reference, except that rank
0 raises on cases with an odd seed. Both campaigns run the same cases through a
:class:`~shardfuzz.engine.runner.Runner` on warm pools (untimed warm-up first); ``regroup off`` sets
``SHARDFUZZ_REGROUP=0``, so each crash discards its pool (as before regroups existed), and
``spares off`` also sets ``SHARDFUZZ_SPARE_POOLS=0``, so a discarded pool is started afresh on the
next example (as before spares existed). The goal of issue 10: the crashing campaign runs at >= 50%
of the passing rate, and the first example comes within 3 s on an idle 2-core machine.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import time

os.environ.setdefault("OMP_NUM_THREADS", "1")
HERE = os.path.abspath(__file__)


def crash_every_other(ctx):
    """The target's reference; rank 0 raises on an odd seed (a rank error on every other case)."""
    from shardfuzz.spec.refs import load_ref
    from shardfuzz.spec.registry import get_target

    if ctx.group_rank == 0 and ctx.case.seed % 2:
        raise RuntimeError("planted crash on an odd seed")
    target = get_target(ctx.case.target)
    return load_ref(target.impl_ref().ref)(ctx)


def throughput(target: str, impl: str | None, cases: list, spares: bool, regroup: bool) -> tuple[float, int]:
    from shardfuzz.engine.config import RunConfig
    from shardfuzz.engine.runner import Runner
    from shardfuzz.errors import Finding
    from shardfuzz.ranks import pool_cache as pools

    os.environ["SHARDFUZZ_SPARE_POOLS"] = "1" if spares else "0"
    os.environ["SHARDFUZZ_REGROUP"] = "1" if regroup else "0"
    pools.shutdown()
    runner = Runner(target, impl, RunConfig())
    for case in cases[:6]:  # warm-up: pools started, target imported (not timed)
        try:
            runner.run_case(case)
        except Finding:
            pass
    failed, t0 = 0, time.perf_counter()
    for case in cases:
        try:
            runner.run_case(case)
        except Finding:
            failed += 1
    return len(cases) / (time.perf_counter() - t0), failed


def first_example_seconds(target: str) -> float:
    """Seconds from starting ``shardfuzz fuzz TARGET`` to the progress line that counts 1 example."""
    t0 = time.perf_counter()
    proc = subprocess.Popen(
        [sys.executable, "-m", "shardfuzz.frontends.cli", "fuzz", target, "--max-examples", "3", "--progress-every",
         "0.02", "--failures-dir", os.path.join("/tmp", f"shardfuzz-bench-{os.getpid()}")],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    seen = None
    for line in proc.stdout:  # type: ignore[union-attr]
        m = re.match(r"\[\s*[\d.]+s\] \S+: (\d+) examples", line)
        if seen is None and m and int(m.group(1)) >= 1:
            seen = time.perf_counter() - t0
    proc.wait()
    return seen if seen is not None else float("nan")


def import_torch_seconds() -> float:
    t0 = time.perf_counter()
    subprocess.run([sys.executable, "-c", "import torch"], check=True)
    return time.perf_counter() - t0


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--examples", type=int, default=120)
    p.add_argument("--target", default="tp_mlp")
    p.add_argument("--starts", type=int, default=3, help="cold starts of shardfuzz fuzz to time")
    args = p.parse_args(argv)
    import dataclasses

    from shardfuzz.spec.registry import get_target
    from shardfuzz.spec.sampling import draw_pool

    print(f"# failing_speed: loadavg {', '.join(f'{v:.2f}' for v in os.getloadavg())}, {os.cpu_count()} cpus, "
          f"{time.strftime('%Y-%m-%d %H:%M:%S')}", flush=True)  # fmt: skip
    target = get_target(args.target)
    drawn = [c for c, _ in draw_pool(target.strategy(), 11, args.examples)]
    cases = [dataclasses.replace(c, seed=2 * i + (i % 2)) for i, c in enumerate(drawn)]  # odd every other
    crash = f"{HERE}::crash_every_other"
    rows = []
    for label, impl, spares, regroup in (
        ("passing", None, True, True),
        ("every other crashes, regrouped", crash, True, True),
        ("every other crashes, regroup off", crash, True, False),
        ("every other crashes, no spares", crash, False, False),
    ):
        rate, failed = throughput(args.target, impl, cases, spares, regroup)
        rows.append((label, rate, failed))
    base = rows[0][1]
    print(f"{'campaign':<34} {'examples/s':>10} {'failed':>7} {'vs passing':>10}")
    for label, rate, failed in rows:
        print(f"{label:<34} {rate:>10.1f} {failed:>7} {rate / base:>10.2f}")
    floor = min(import_torch_seconds() for _ in range(args.starts))
    starts = [first_example_seconds(args.target) for _ in range(args.starts)]
    print(f"time to the first example of `shardfuzz fuzz {args.target}`: "
          + ", ".join(f"{s:.2f} s" for s in starts)
          + f" (best {min(starts):.2f} s); `import torch` alone: {floor:.2f} s")  # fmt: skip
    print(f"# loadavg at the end {', '.join(f'{v:.2f}' for v in os.getloadavg())}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
