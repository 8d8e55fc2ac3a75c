"""Stress check: is a red run still a bug and a green run still none on a loaded machine?

While N busy-loop processes load the machine, this runs

* every planted bug and expected failure of the built-in targets whose finding is a hang or a
  crash (``expect.kind`` ``"hang"`` or ``"rank-error"``), exactly as ``tests/test_targets.py`` does
  (``shardfuzz.frontends.testing.assert_planted_bug_found``: ``shardfuzz-ci`` settings, database off,
  ``2 * p95 + 10`` examples, the check's declared ``exclude``), but reporting instead of asserting;
* N examples (200 by default) of the ``tp_mlp`` and ``ring_attention`` references with fresh seeds,

and prints false findings (a reference flagged), missed findings (not found, the wrong kind, or a
minimal case other than the declared one), leftover processes (anything this run started, ranks
included, still alive at the end, found by an environment tag so that orphans count too) and the
load average. Exit code 1 if any of those is not zero.

    python benchmarks/stress.py [--busy 8] [--examples 200] [--references tp_mlp,ring_attention]
                                [--only TARGET/IMPL ...] [--skip-planted] [--skip-references]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
import uuid

os.environ.setdefault("OMP_NUM_THREADS", "1")

TAG = "SHARDFUZZ_STRESS_TAG"
KINDS = ("hang", "rank-error")


def busy_loops(n: int) -> list[subprocess.Popen]:
    env = {k: v for k, v in os.environ.items() if k != TAG}  # never counted as leftovers
    code = "while True: pass"
    return [subprocess.Popen([sys.executable, "-c", code], env=env) for _ in range(n)]


class LoadSampler:
    """The 1-minute load average every few seconds while the check runs."""

    def __init__(self, every: float = 5.0) -> None:
        self.samples: list[float] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, args=(every,), daemon=True)
        self._thread.start()

    def _loop(self, every: float) -> None:
        while True:
            self.samples.append(os.getloadavg()[0])
            if self._stop.wait(every):
                return

    def stop(self) -> str:
        self._stop.set()
        self._thread.join()
        s = self.samples or [os.getloadavg()[0]]
        return f"load average (1 min): mean {sum(s) / len(s):.1f}, max {max(s):.1f}, {len(os.sched_getaffinity(0))} cores"


def tagged_processes(tag: str) -> list[str]:
    """Processes other than this one whose environment carries ``tag`` (Linux /proc)."""
    out = []
    me = os.getpid()
    needle = f"{TAG}={tag}".encode()
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == me:
            continue
        try:
            with open(f"/proc/{entry}/environ", "rb") as f:
                if needle not in f.read().split(b"\0"):
                    continue
            with open(f"/proc/{entry}/stat") as f:
                if f.read().split(") ")[1][0] == "Z":
                    continue
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                cmd = f.read().replace(b"\0", b" ").decode(errors="replace").strip()
        except OSError:
            continue
        out.append(f"pid {entry}: {cmd[:120]}")
    return out


def structure_problem(result, expect) -> str | None:
    """What differs from the declared minimal finding (the checks of assert_planted_bug_found)."""
    from shardfuzz.errors import Mismatch
    from shardfuzz.frontends.testing import uneven_sizes

    if not result.found:
        return "not found"
    if result.kind not in expect.kinds:
        return f"wrong kind: {result.kind}, expected {' or '.join(expect.kinds)}"
    case = result.case
    worlds = expect.world_size if isinstance(expect.world_size, tuple) else (expect.world_size,)
    mesh = expect.mesh if expect.mesh is not None else (case.world_size,)
    if case.world_size not in worlds or case.mesh != mesh:
        return f"wrong minimal case: world {case.world_size}, mesh {case.mesh}; expected {worlds}, {mesh}"
    if expect.uneven is not None and uneven_sizes(case) != tuple(expect.uneven):
        return f"wrong minimal case: uneven {uneven_sizes(case)}, expected {tuple(expect.uneven)}"
    if expect.check is not None and not expect.check(case):
        return f"wrong minimal case: fails the declared check ({expect.note or 'check'})"
    if expect.outputs is not None:
        first = result.failures[0]
        wrong = tuple(first.outputs) if isinstance(first, Mismatch) else ()
        if not expect.allows_outputs(wrong):
            return f"wrong outputs: {wrong}"
    return None


def planted_checks(only: set[str]) -> list[tuple[str, str, object]]:
    from shardfuzz.spec.registry import BUILTIN_TARGETS, get_target

    out = []
    for name in sorted(BUILTIN_TARGETS):
        t = get_target(name)
        for impl, rec in [*t.planted.items(), *t.expected_failures.items()]:
            if set(rec.expect.kinds) & set(KINDS) and (not only or f"{name}/{impl}" in only):
                out.append((name, impl, rec))
    return out


def run_checks(args: argparse.Namespace) -> dict:
    """The checks themselves (in the driver process): false findings, missed findings, errors."""
    import shardfuzz
    from shardfuzz.frontends.testing import budget

    false_findings: list[tuple[str, str]] = []
    missed: list[tuple[str, str, str]] = []
    errors: list[str] = []
    if not args.skip_planted:
        for target, impl, rec in planted_checks(set(args.only)):
            name, t0 = f"{target}/{impl}", time.perf_counter()
            try:
                res = shardfuzz.run(
                    target,
                    impl,
                    profile="shardfuzz-ci",
                    database=None,
                    max_examples=budget(rec.p95),
                    timeout=rec.expect.timeout,
                    exclude=rec.expect.exclude,  # its declared known failures, as the suite's helper
                )
            except Exception as e:  # noqa: BLE001 (the check could not run, whatever the cause: say so, and go on)
                errors.append(f"planted {name}: {type(e).__name__}: {e}")
                print(f"planted {name}: ERROR {type(e).__name__}: {e}", flush=True)
                continue
            problem = structure_problem(res, rec.expect)
            if res.flaky and problem is None:
                problem = "reported as flaky"
            state = "ok" if problem is None else f"MISSED ({problem})"
            took = time.perf_counter() - t0
            print(
                f"planted {name} ({' or '.join(rec.expect.kinds)}): {state}; {took:.0f} s, {res.stats.summary()}",
                flush=True,
            )
            if problem is not None:
                missed.append((name, problem, res.report))
    if not args.skip_references:
        for target in [t for t in args.references.split(",") if t]:
            t0 = time.perf_counter()
            try:
                res = shardfuzz.run(
                    target, profile="shardfuzz-fuzz", database=None, max_examples=args.examples
                )
            except Exception as e:  # noqa: BLE001 (the check could not run, whatever the cause: say so, and go on)
                errors.append(f"reference {target}: {type(e).__name__}: {e}")
                print(f"reference {target}: ERROR {type(e).__name__}: {e}", flush=True)
                continue
            state = f"FALSE FINDING ({res.kind})" if res.found else "ok"
            took = time.perf_counter() - t0
            print(f"reference {target}: {state}; {took:.0f} s, {res.stats.summary()}", flush=True)
            if res.found:
                false_findings.append((target, res.report))
    return {"false_findings": false_findings, "missed": missed, "errors": errors}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--busy", type=int, default=8, help="busy-loop processes beside the check (default 8)")
    p.add_argument("--examples", type=int, default=200, help="examples of each reference (default 200)")
    p.add_argument("--references", default="tp_mlp,ring_attention")
    p.add_argument("--only", nargs="*", default=[], metavar="TARGET/IMPL", help="these planted checks only")
    p.add_argument("--skip-planted", action="store_true")
    p.add_argument("--skip-references", action="store_true")
    p.add_argument("--driver-json", default=None, help=argparse.SUPPRESS)  # the driver process
    args = p.parse_args(argv)
    if args.busy < 0 or args.examples < 1:
        p.error("--busy must be >= 0 and --examples >= 1")
    if args.driver_json:  # the driver: run the checks, hand the verdicts back, exit
        with open(args.driver_json, "w") as f:
            json.dump(run_checks(args), f)
        return 0

    # the checks run in a driver process of their own: what is alive after it exited is left over
    tag = uuid.uuid4().hex
    loops = busy_loops(args.busy)
    load = LoadSampler()
    t_start = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        verdicts_file = os.path.join(tmp, "verdicts.json")
        cmd = [sys.executable, os.path.abspath(__file__), *(argv if argv is not None else sys.argv[1:])]
        try:
            driver = subprocess.run(
                [*cmd, "--driver-json", verdicts_file], env=dict(os.environ, **{TAG: tag}), check=False
            )
        finally:
            for proc in loops:
                proc.kill()
            for proc in loops:
                proc.wait()
            load_line = load.stop()
        try:
            with open(verdicts_file) as f:
                verdicts = json.load(f)
        except (OSError, ValueError):
            verdicts = {
                "false_findings": [],
                "missed": [],
                "errors": [f"the driver exited with {driver.returncode}"],
            }
    time.sleep(2.0)  # let killed ranks be reaped
    leftovers = tagged_processes(tag)
    false_findings, missed, errors = verdicts["false_findings"], verdicts["missed"], verdicts["errors"]

    print(f"\n=== stress check, {args.busy} busy loops, {time.perf_counter() - t_start:.0f} s ===")
    print(load_line)
    print(f"false findings: {len(false_findings)}")
    for target, report in false_findings:
        print(f"  {target}:\n    " + "\n    ".join(report.splitlines()[:12]))
    print(f"missed findings: {len(missed)}")
    for name, problem, report in missed:
        print(f"  {name}: {problem}")
        if report:
            print("    " + "\n    ".join(report.splitlines()[:8]))
    print(f"leftover processes: {len(leftovers)}")
    for line in leftovers:
        print(f"  {line}")
    if errors:
        print(f"checks that could not run: {len(errors)}")
        for line in errors:
            print(f"  {line}")
    return 1 if (false_findings or missed or leftovers or errors) else 0


if __name__ == "__main__":
    sys.exit(main())
