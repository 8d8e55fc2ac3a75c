"""Fault check (issue 24): every fault of the issue, injected deterministically, and the count of
false findings (a correct implementation reported, or one fault reported as two kinds) and lost
ones (a finding missing from disk or from the CLI's summary, a file left half written).

* a forkserver killed in the middle of an example (every rank dies with exit code 255);
* a rank death that recurs only sometimes (it must be reported, as flaky, not set aside);
* a rank death whose exit code the forkserver reports late (stopped for 2 s): a death, not a hang;
* an implementation that leaks an environment variable and a working directory, then one that
  reads them;
* each of shardfuzz.spec.parallel's helpers fed transposed, sliced, offset and expanded inputs;
* two and three processes writing the same failure file at once, and a disk that fills up;
* the CLI's summary of a run with an external fault and leaks.

    python benchmarks/faults.py [--repeat 3]

Prints one line per fault and ``false findings: N``, ``lost: N``; exit code 1 unless both are 0.
Uses the test targets in tests/data (toy_target.py, parallel_target.py, failure_writer.py).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time

os.environ.setdefault("OMP_NUM_THREADS", "1")
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DATA = os.path.join(ROOT, "tests", "data")
TOY, PARALLEL = os.path.join(DATA, "toy_target.py"), os.path.join(DATA, "parallel_target.py")


def toy_case(**options):
    from shardfuzz import Case

    return Case(target="toy", world_size=2, mesh=(2,), sizes={"n": 3}, split=("n",), options=options)


def outcome(runner, case) -> str:
    """``pass``, ``external`` or the finding's kind (``flaky ...`` when its report says so)."""
    from shardfuzz import ExternalFault, Finding

    try:
        runner.run_case(case)
        return "pass"
    except ExternalFault:
        return "external"
    except Finding as f:
        return ("flaky " if "(flaky)" in f.report else "") + f.kind


def killed_forkserver(tmp: str, i: int) -> tuple[int, int, str]:
    from shardfuzz import Runner

    got = outcome(Runner(TOY, "kill_forkserver_once"), toy_case(marker=os.path.join(tmp, f"killed{i}")))
    return int(got != "external"), 0, got


def sometimes_dies(tmp: str, i: int) -> tuple[int, int, str]:
    from shardfuzz import Runner

    runner, case = Runner(TOY, "dies_on_odd_runs"), toy_case(counter=os.path.join(tmp, f"runs{i}"))
    got = [outcome(runner, case), outcome(runner, case)]
    return 0, int(got != ["external", "flaky rank-error"]), ", ".join(got)


def late_exit_code(_tmp: str, _i: int) -> tuple[int, int, str]:
    from multiprocessing import forkserver

    from shardfuzz import RunConfig, Runner

    Runner(TOY, "reference").run_case(toy_case())  # a warm pool, and a forkserver
    server = forkserver._forkserver._forkserver_pid  # type: ignore[attr-defined]
    os.kill(server, signal.SIGSTOP)
    resume = threading.Timer(2.0, os.kill, (server, signal.SIGCONT))
    resume.start()
    try:
        got = outcome(Runner(TOY, "sigkill_rank1", RunConfig(timeout=10)), toy_case())
    finally:
        resume.join()
        os.kill(server, signal.SIGCONT)
    return int(got != "rank-error"), 0, got  # a hang here is a second, false finding of one death


def leaked_environment(_tmp: str, _i: int) -> tuple[int, int, str]:
    from shardfuzz import Runner

    leaker = Runner(TOY, "leak_environment")
    got = [outcome(leaker, toy_case()), outcome(Runner(TOY, "reads_environment"), toy_case())]
    shown = "leaks (not findings): rank" in leaker.stats.summary()
    return int(got != ["pass", "pass"]), int(not shown), ", ".join(got)


def parallel_layouts(_tmp: str, i: int) -> tuple[int, int, str]:
    from shardfuzz import Case, Runner

    layouts = ("transposed", "sliced", "offset", "expanded")
    got = []
    for world in (1, 2, 3):
        rotated = [layouts[(i + r) % 4] for r in range(3)]
        case = Case(
            target="parallel_helpers",
            world_size=world,
            mesh=(world,),
            sizes={"s": world + 1},
            split=("s",),
            dtype="float64",
            options={"layouts": [True, *rotated]},
        )
        got.append(outcome(Runner(PARALLEL, "reference"), case))
    return sum(g != "pass" for g in got), 0, ", ".join(got)


def writers(tmp: str, i: int) -> tuple[int, int, str]:
    """Two and three writers at once, and a full disk: lost = a writer whose file does not hold its
    own last update, a file left half written, or a warning per update instead of one."""
    base = os.path.join(tmp, f"writers{i}")
    args = [f"{base}/two:2", f"{base}/three:3", f"{base}/full:1:1000"]
    out = subprocess.run(
        [sys.executable, os.path.join(DATA, "failure_writer.py"), *args],
        capture_output=True,
        text=True,
        check=True,
    )
    scenarios = [json.loads(line) for line in out.stdout.splitlines()]
    lost = 0
    for name, results in zip(("two", "three"), scenarios):
        for writer, result in zip("ABC", results):
            paths = result["written"]  # one file, holding this writer's own last update
            text = open(paths[0]).read() if len(paths) == 1 else ""
            lost += f"bug of writer {writer}, update 12" not in text
        lost += len(os.listdir(os.path.join(base, name))) != len(results)  # a temporary file left
    (full,) = scenarios[2]
    lost += bool(os.listdir(os.path.join(base, "full"))) + (full["stderr"].count("could not write") != 1)
    files = {n: len(os.listdir(os.path.join(base, n))) for n in ("two", "three", "full")}
    return 0, lost, f"files {files}"


def cli_summary(tmp: str, i: int) -> tuple[int, int, str]:
    env = dict(os.environ, SHARDFUZZ_FAILURES_DIR=os.path.join(tmp, f"cli{i}"))
    cmd = [sys.executable, "-m", "shardfuzz.frontends.cli", "fuzz", TOY, "--impl", "killed_once_and_leaky"]
    out = subprocess.run(
        [*cmd, "--max-examples", "6", "--world-sizes", "2"], capture_output=True, text=True, env=env
    )
    shown = "external faults set aside" in out.stdout, "leaks (not findings;" in out.stdout
    return int(out.returncode != 0), sum(not s for s in shown), f"exit {out.returncode}, shown {shown}"


FAULTS = {
    "forkserver killed mid-example": killed_forkserver,
    "rank death that recurs only sometimes": sometimes_dies,
    "rank death reported late (forkserver stopped 2 s)": late_exit_code,
    "leaked environment variable and working directory": leaked_environment,
    "parallel helpers, transposed/sliced/offset/expanded inputs": parallel_layouts,
    "2 and 3 concurrent writers, full disk": writers,
    "CLI summary of an external fault and leaks": cli_summary,
}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--repeat", type=int, default=3, help="runs of each fault (default 3)")
    args = p.parse_args(argv)
    false_total = lost_total = 0
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        for name, fault in FAULTS.items():
            for i in range(args.repeat):
                started = time.perf_counter()
                false, lost, what = fault(tmp, i)
                false_total, lost_total = false_total + false, lost_total + lost
                took = time.perf_counter() - started
                print(f"{name} #{i + 1}: false {false}, lost {lost} ({what}; {took:.1f} s)", flush=True)
    load = os.getloadavg()[0]
    print(
        f"\n=== fault check: {len(FAULTS)} faults x {args.repeat}, {time.perf_counter() - t0:.0f} s, load {load:.1f} ==="
    )
    print(f"false findings: {false_total}")
    print(f"lost: {lost_total}")
    return 1 if false_total or lost_total else 0


if __name__ == "__main__":
    sys.exit(main())
