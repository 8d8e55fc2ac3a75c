"""The implementations the built-in targets record as verified to pass (their ``Verified`` records:
PyTorch's own sharded code, each restricted to what it supports), run longer than the ci suite
does (tests/test_verified.py): N examples in each of the record's dtypes under the
``shardfuzz-fuzz`` profile (random seeds, Hypothesis steering towards the closest pass), with the
record's pinned options, world sizes and known failures set aside (counted).

    python benchmarks/torch_impls.py [--examples 500] [--dtypes float32,bfloat16] [TARGET:IMPL ...]

Default: every record. Prints, per implementation and dtype, the examples run, failures (must be
0), what was set aside (``Unsupported`` by reason, excluded known failures by reason), the worst
passing error/tolerance (the closest pass) and the time; a failure's report follows its line.
Exit status 1 on any failure.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

os.environ.setdefault("OMP_NUM_THREADS", "1")


def verified_records() -> dict[str, tuple[str, object]]:
    """``target:impl`` -> (target name, its Verified record), for every built-in target."""
    from shardfuzz.spec.registry import builtin_targets, get_target

    return {
        f"{name}:{impl}": (name, rec)
        for name in sorted(builtin_targets())
        for impl, rec in get_target(name).verified.items()
    }


def _set_aside(stats) -> str:
    parts = [f"unsupported {k} x{v}" for k, v in sorted(stats.unsupported.items())]
    parts += [f"excluded {k} x{v}" for k, v in sorted(stats.excluded.items())]
    return "; ".join(parts) or "-"


def main(argv=None) -> int:
    import shardfuzz

    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("impls", nargs="*", help="target:impl (default: every Verified record)")
    p.add_argument("--examples", type=int, default=500)
    p.add_argument("--dtypes", default=None, help="comma-separated (default: each record's own dtypes)")
    args = p.parse_args(argv)
    records = verified_records()
    unknown = sorted(set(args.impls) - set(records))
    if unknown:
        p.error(f"unknown IMPL {unknown}; known: {sorted(records)}")
    chosen = [records[k] for k in args.impls] if args.impls else list(records.values())
    print(f"# loadavg {os.getloadavg()}, {os.cpu_count()} cpus, {time.strftime('%Y-%m-%d %H:%M:%S')}")
    print(
        f"{'target:impl':<40} {'dtype':<9} {'examples':>8} {'failures':>8} {'worst pass':>10} {'time':>7}  set aside"
    )
    bad = 0
    for target, rec in chosen:
        for dtype in args.dtypes.split(",") if args.dtypes else rec.dtypes:
            t0 = time.perf_counter()
            r = shardfuzz.run(
                target,
                rec.name,
                profile="shardfuzz-fuzz",
                max_examples=args.examples,
                database=None,
                dtypes=(dtype,),
                options=rec.options,
                exclude=rec.exclude,
                world_sizes=rec.world_sizes,
            )
            bad += r.found
            print(
                f"{target + ':' + rec.name:<40} {dtype:<9} {r.stats.examples:>8} {r.stats.failures:>8} "
                f"{r.stats.worst_pass_ratio:>10.3g} {time.perf_counter() - t0:>6.0f}s  {_set_aside(r.stats)}",
                flush=True,
            )
            if r.found:
                print(r.report)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
