"""Engine cost on the very same cases, across checkouts: what ``bench_tp.py`` cannot separate.

``bench_tp.py`` through shardfuzz measures the engine *and* what the search draws: a checkout whose
search draws more 4-rank cases (each costs 2-3x a 2-rank case on 2 cores) or more cases near the
tolerance (which need the noise samples) is slower there with the same engine. This script takes
the search out: ``dump`` records the cases of one derandomized search of tp_mlp (the plain MLP's
cases, as at 37b22b1) to a JSON file, and ``run`` times ``run_case`` over a file's cases, in
rounds, in whatever checkout imports as ``shardfuzz``: today's, or 37b22b1's (its older API is
read as well). Run ``run`` in both checkouts, alternating, on the cases of each.

    python benchmarks/same_cases.py dump CASES.json [--examples 200]
    python benchmarks/same_cases.py run CASES.json [--rounds 3]

The second, from an old checkout: ``cd OLD && OLD_VENV/bin/python NEW/benchmarks/same_cases.py run
CASES.json`` (the old venv imports its own ``shardfuzz``).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

os.environ.setdefault("OMP_NUM_THREADS", "1")
HERE = os.path.dirname(os.path.abspath(__file__))
FIELDS = ("world_size", "mesh", "sizes", "split", "dtype", "profile", "seed", "options")


def _runner():
    """A Runner of the plain MLP's cases, and the target name its cases carry (today's, or
    37b22b1's ``tp_mlp``, which had no sequence-parallel branch)."""
    try:
        from shardfuzz.engine.config import RunConfig
        from shardfuzz.engine.runner import Runner
    except ImportError:  # 37b22b1: shardfuzz.engine was a module, its Runner took a target name
        from shardfuzz.engine import Runner  # type: ignore[attr-defined,no-redef]

        return Runner("tp_mlp"), "tp_mlp"
    target = os.path.join(HERE, "tp_mlp_plain.py") + "::tp_mlp_plain"
    return Runner(target, None, RunConfig(profile="shardfuzz-ci")), "tp_mlp_plain"


def dump(path: str, examples: int) -> None:
    from shardfuzz import RunHooks
    from shardfuzz.engine.config import RunConfig
    from shardfuzz.engine.runner import Runner
    from shardfuzz.engine.search import search, settings_for

    class Record(RunHooks):
        def __init__(self) -> None:
            self.seen: list = []

        def before_example(self, runner, case) -> None:
            self.seen.append(case)

    record = Record()
    config = RunConfig(profile="shardfuzz-ci", max_examples=examples)
    runner = Runner(os.path.join(HERE, "tp_mlp_plain.py") + "::tp_mlp_plain", None, config, hooks=[record])
    search(runner, settings_for(config, quiet=True), database=None)
    cases = [{f: getattr(c, f) for f in FIELDS} for c in record.seen]
    with open(path, "w") as f:
        json.dump(cases, f)
    worlds = sorted({c["world_size"] for c in cases})
    share = {w: sum(c["world_size"] == w for c in cases) / len(cases) for w in worlds}
    print(
        f"{len(cases)} cases to {path}; world sizes: " + ", ".join(f"{w}: {s:.0%}" for w, s in share.items())
    )


def run(path: str, rounds: int) -> None:
    from shardfuzz.case import Case

    runner, name = _runner()
    with open(path) as f:
        raw = json.load(f)
    cases = [
        Case(target=name, **{k: tuple(v) if k in ("mesh", "split") else v for k, v in d.items()}) for d in raw
    ]
    for case in cases:  # warm every pool and lazy import first
        runner.run_case(case)
    rates = []
    for _ in range(rounds):
        t0 = time.perf_counter()
        for case in cases:
            runner.run_case(case)
        rates.append(len(cases) / (time.perf_counter() - t0))
    print(
        f"{len(cases)} cases, run_case in a loop: "
        + ", ".join(f"{r:.1f}" for r in rates)
        + f" ex/s (median {statistics.median(rates):.1f}); load average {os.getloadavg()[0]:.2f}"
    )


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="command", required=True)
    d = sub.add_parser("dump", help="record one derandomized search's cases")
    d.add_argument("file")
    d.add_argument("--examples", type=int, default=200)
    r = sub.add_parser("run", help="time run_case over a file's cases")
    r.add_argument("file")
    r.add_argument("--rounds", type=int, default=3)
    args = p.parse_args(argv)
    if args.command == "dump":
        dump(args.file, args.examples)
    else:
        run(args.file, args.rounds)
    return 0


if __name__ == "__main__":
    sys.exit(main())
