"""Where the CPU of a test run goes: by kind of process (the pytest-xdist workers that drive the
searches, the ranks, their forkservers, subprocess commands, torchrun, redis, ...) and by OS thread
name (Python threads, gloo's TCP event loops, ...), from ``/proc``, sampled while it runs.

The ci suite is CPU-bound on 2 cores (issue 23): its wall time is about its CPU seconds over 2, so
the figure to cut is the CPU, and this says whose it is. It needs no profiler and changes nothing in
the run (the sampler reads ``/proc`` only, every ``--interval`` seconds, on one of the cores).

    python benchmarks/suite_cpu.py                     # pytest --hypothesis-profile=ci
    python benchmarks/suite_cpu.py -- -n 0 tests/test_targets.py
    python benchmarks/suite_cpu.py --command python -c "..."

What it cannot see: a process that starts and ends between two samples, and the last interval of
one that ends. The machine's own busy CPU over the run (``/proc/stat``) is printed beside what was
attributed, so the gap is visible. Linux only.
"""

from __future__ import annotations

import argparse
import collections
import dataclasses
import os
import subprocess
import sys
import tempfile
import time

os.environ.setdefault("OMP_NUM_THREADS", "1")

TICK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100

#: what some OS thread names are (torch and gloo name their threads)
THREAD_NOTES = {
    "gloo_tcp_loop": (
        "gloo's TCP event loop, one per process group; it polls every 10 ms idle, and spins while a "
        "message waits for its receive to be posted (benchmarks/gloo_floor.py)"
    ),
    "pt_gloo_runloop": "a gloo process group's worker thread",
    "pt_tcpstore_uv": "torch's TCPStore server",
    "pt_elastic": "torchrun's agent",
}


@dataclasses.dataclass
class Proc:
    """A process seen while sampling: its command line and kind."""

    pid: int
    start: str  # the start time in clock ticks since boot: with the pid, a process's identity
    cmd: str
    kind: str


def kind_of(cmd: str, parent_cmd: str, is_root: bool) -> str:
    """The kind of a process, from its command line and its parent's."""
    if is_root:
        return "the command's own process (pytest's main one)"
    if "multiprocessing.forkserver" in cmd:
        # a forkserver's children are forked: they keep its command line
        return "ranks (forkserver children)" if "multiprocessing.forkserver" in parent_cmd else "forkservers"
    if "exec(eval(sys.stdin" in cmd:
        return "pytest-xdist workers (the drivers: search, oracle, noise, judge)"
    if "multiprocessing.resource_tracker" in cmd:
        return "multiprocessing resource trackers"
    if "shardfuzz.ranks.serve" in cmd or "torch.distributed.run" in cmd or "torchrun" in cmd:
        return "torchrun and rank servers"
    if "shardfuzz" in cmd and ("frontends.cli" in cmd or cmd.split()[0].endswith("shardfuzz")):
        return "shardfuzz commands (subprocesses)"
    if "redis-server" in cmd:
        return "redis-server"
    if "chrom" in cmd:
        return "chromium"
    words = cmd.split()
    if (
        "-mpytest" in words
        or " -m pytest " in f"{cmd} "
        or (words and os.path.basename(words[0]) == "pytest")
    ):
        return "pytest subprocesses"
    # a script by its file name (a temporary folder in its path would make each run another kind)
    return "other: " + " ".join(os.path.basename(w) for w in words[:2])[:60]


def read_stat(path: str) -> tuple[str, list[str]] | None:
    """``(name, fields after the name)`` of a ``/proc/.../stat`` file, or None once it is gone."""
    try:
        with open(path) as f:
            text = f.read()
    except OSError:
        return None
    return text[text.find("(") + 1 : text.rfind(")")], text.rsplit(")", 1)[1].split()


def _cmdline(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().replace(b"\0", b" ").decode(errors="replace").strip()
    except OSError:
        return ""


def _machine_busy() -> tuple[int, int]:
    """(busy, idle) clock ticks of the whole machine since boot."""
    with open("/proc/stat") as f:
        v = [int(x) for x in f.readline().split()[1:]]
    idle = v[3] + v[4]
    return sum(v[:8]) - idle, idle


class Sampler:
    """CPU ticks of every thread of ``root`` and its descendants, by process kind and thread name."""

    def __init__(self, root: int) -> None:
        self.root = root
        self.procs: dict[int, Proc] = {}  # the live process of each pid
        self.known: dict[tuple[int, str], Proc] = {}  # every process seen, by (pid, start)
        self.seen: dict[tuple[int, str, int], int] = {}  # (pid, start, tid) -> ticks counted
        self.by_thread: collections.Counter[str] = collections.Counter()
        self.by_process: collections.Counter[tuple[int, str]] = collections.Counter()  # (pid, start)

    @property
    def by_kind(self) -> collections.Counter[str]:
        """CPU ticks by kind of process."""
        kinds: collections.Counter[str] = collections.Counter()
        for key, ticks in self.by_process.items():
            kinds[self.known[key].kind] += ticks
        return kinds

    @property
    def processes(self) -> collections.Counter[str]:
        """How many processes of each kind were seen."""
        return collections.Counter(p.kind for p in self.known.values())

    def sample(self) -> None:
        for entry in os.listdir("/proc"):
            if not entry.isdigit():
                continue
            pid = int(entry)
            st = read_stat(f"/proc/{pid}/stat")
            if st is None:
                continue
            ppid, start = int(st[1][1]), st[1][19]
            proc = self.procs.get(pid)
            if proc is None or proc.start != start:
                parent = self.procs.get(ppid)
                if pid != self.root and parent is None:
                    continue  # not (yet known as) the command's own
                cmd = _cmdline(pid)
                proc = Proc(pid, start, cmd, kind_of(cmd, parent.cmd if parent else "", pid == self.root))
                self.procs[pid] = self.known[pid, start] = proc
            self._threads(proc)

    def _threads(self, proc: Proc) -> None:
        try:
            tids = os.listdir(f"/proc/{proc.pid}/task")
        except OSError:
            return
        for tid in tids:
            st = read_stat(f"/proc/{proc.pid}/task/{tid}/stat")
            if st is None:
                continue
            name, fields = st
            ticks = int(fields[11]) + int(fields[12])
            key = (proc.pid, proc.start, int(tid))
            delta = ticks - self.seen.get(key, 0)  # a new thread: all its CPU so far
            self.seen[key] = ticks
            if delta > 0:
                self.by_thread[name] += delta
                self.by_process[proc.pid, proc.start] += delta


def run(command: list[str], interval: float) -> tuple[int, float, Sampler, tuple[int, int], str]:
    """Run ``command`` sampled every ``interval`` s: its exit code, wall time, the sampler, the
    machine's (busy, idle) ticks over the run and the last lines of its output."""
    with tempfile.TemporaryFile("w+") as out:
        busy0 = _machine_busy()
        t0 = time.monotonic()
        proc = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT)
        sampler = Sampler(proc.pid)
        while proc.poll() is None:
            sampler.sample()
            time.sleep(interval)
        wall = time.monotonic() - t0
        busy1 = _machine_busy()
        out.seek(0)
        tail = "".join(out.readlines()[-3:])
    return proc.returncode, wall, sampler, (busy1[0] - busy0[0], busy1[1] - busy0[1]), tail


def report(code: int, wall: float, s: Sampler, machine: tuple[int, int], tail: str, top: int = 0) -> str:
    by_kind, processes = s.by_kind, s.processes
    total = sum(by_kind.values()) / TICK or 1 / TICK  # a command over before the first sample: 0
    lines = [
        tail.rstrip(),
        f"exit {code}, wall {wall:.1f} s; the machine's busy CPU over the run {machine[0] / TICK:.1f} s, "
        f"idle {machine[1] / TICK:.1f} s ({os.cpu_count()} cores); attributed to the command's "
        f"processes {total:.1f} s",
        "",
        f"{'kind of process':<66} {'processes':>9} {'CPU s':>8} {'share':>6}",
    ]
    for kind, ticks in by_kind.most_common():
        lines.append(f"{kind:<66} {processes[kind]:>9} {ticks / TICK:>8.1f} {ticks / TICK / total:>6.1%}")
    lines += ["", f"{'OS thread name':<24} {'CPU s':>8} {'share':>6}"]
    for name, ticks in s.by_thread.most_common(10):
        note = THREAD_NOTES.get(name, "")
        lines.append(f"{name:<24} {ticks / TICK:>8.1f} {ticks / TICK / total:>6.1%}  {note}")
    if top:
        lines += ["", f"the {top} processes that used the most CPU, ranks and forkservers aside:"]
        own = [(ticks, key) for key, ticks in s.by_process.items() if "fork" not in s.known[key].kind]
        for ticks, key in sorted(own, reverse=True)[:top]:
            lines.append(f"{ticks / TICK:>8.1f} s  {s.known[key].cmd[:150]!r}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    # each sample reads every thread's /proc file (a few thousand in the ci suite), on the cores the
    # suite uses: 1 s keeps that small
    p.add_argument("--interval", type=float, default=1.0, help="seconds between samples (default 1)")
    p.add_argument("--top", type=int, default=0, help="also list the N processes that used the most CPU")
    p.add_argument("--command", nargs=argparse.REMAINDER, help="any command in place of pytest")
    p.add_argument("pytest_args", nargs="*", help="after --: pytest's arguments (default: the ci suite)")
    args = p.parse_args(argv)
    if args.interval <= 0:
        p.error(f"--interval {args.interval}: must be above 0 seconds")
    if args.top < 0:
        p.error(f"--top {args.top}: must be 0 (none) or more")
    if not os.path.isdir("/proc/self/task"):
        p.error("needs Linux's /proc")
    command = args.command or [
        sys.executable,
        "-m",
        "pytest",
        *(args.pytest_args or ["--hypothesis-profile=ci", "-q", "-p", "no:cacheprovider"]),
    ]
    print(f"load before: {os.getloadavg()}", flush=True)
    result = run(command, args.interval)
    print(report(*result, top=args.top))
    print(f"load after: {os.getloadavg()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
