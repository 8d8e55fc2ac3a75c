"""Parallel ``--jobs``: child ``shardfuzz fuzz`` processes side by side within a rank budget, that
stop with their parent (Ctrl-C and SIGTERM forwarded; PR_SET_PDEATHSIG when it is killed)."""

from __future__ import annotations

import contextlib
import json
import os
import shlex
import signal
import subprocess
import sys
import tempfile
import threading
import time
from typing import Any, TextIO

from shardfuzz.engine.hooks import StickyInterrupt
from shardfuzz.frontends.cli_args import EXIT_FOUND
from shardfuzz.ranks.parent_death import set_pdeathsig


def job_cost(world_sizes: tuple[int, ...] | None) -> int:
    """Ranks a job may have in use at once: its largest world size (4 by default)."""
    return max(world_sizes) if world_sizes else 4


@contextlib.contextmanager
def sigterm_interrupts(enabled: bool = True) -> Any:
    """Within this block (main thread only), SIGTERM raises KeyboardInterrupt: a campaign stopped
    by a CI timeout keeps its verdict and stops its ranks and child jobs, as with Ctrl-C."""
    if not enabled or threading.current_thread() is not threading.main_thread():
        yield
        return

    def _terminate(signum: int, _frame: Any) -> None:
        # pending, as for Ctrl-C: raised inside a garbage-collector callback (importlib's module
        # locks have one) the KeyboardInterrupt is "ignored" and lost; the next example re-raises it
        StickyInterrupt.pending = True
        raise KeyboardInterrupt(f"signal {signum}")

    previous = signal.signal(signal.SIGTERM, _terminate)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)
        StickyInterrupt.pending = False


def die_with_parent(parent_pid: int) -> None:
    """In a child job: be killed (SIGKILL) when the parent dies, however it dies (Linux
    PR_SET_PDEATHSIG; the child's own ranks then follow it), exit now if it is already gone, and
    take the parent's SIGINT as Ctrl-C."""
    set_pdeathsig()  # not on macOS: the parent's SIGTERM handler still stops us there
    if os.getppid() != parent_pid:
        os._exit(130)
    # the parent stops its jobs with SIGINT: heard even where this process inherited SIGINT ignored
    # (a parent started with `&` in a script, nohup), or they would be killed after 30 s, summaries lost
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGINT, signal.default_int_handler)


#: a running job: its process, its summary file, the thread that copies its output to the stream
Running = dict[int, tuple[subprocess.Popen, str, threading.Thread]]


def run_jobs(
    jobs: list[list[str]],
    costs: list[int],
    budget: int,
    parallel: int,
    stream: TextIO | None = None,
    stop_at_first: bool = False,
) -> tuple[list[dict[str, Any]], list[int], bool]:
    """Run child ``shardfuzz fuzz`` commands side by side: at most ``parallel`` at once, and the sum of
    their costs within ``budget`` ranks (a job larger than the budget runs alone).

    Children run in their own session (a terminal's Ctrl-C reaches only this parent, which forwards
    it once) and die with this parent (``--parent-pid``: PR_SET_PDEATHSIG). Ctrl-C or SIGTERM here
    (KeyboardInterrupt) is forwarded to every running child as SIGINT; each stops cleanly, keeping
    its verdict and summary, within 30 s or is killed. ``stop_at_first``: a child that ends with a
    finding stops the others running the same command (a target's ``--workers``) the same way,
    and those not started yet never start. Returns the children's summary rows (each
    names its ``job``, 1-based), their exit codes, and whether the run was interrupted (``stream``:
    ``sys.stdout`` at the call, so that a caller's redirected stdout gets the children's lines)."""
    stream = stream if stream is not None else sys.stdout
    pending = list(range(len(jobs)))
    running: Running = {}
    rows: dict[int, list[dict[str, Any]]] = {}
    codes: dict[int, int] = {}
    tmp = tempfile.mkdtemp(prefix="shardfuzz-jobs-")
    interrupted = False

    def finish(i: int) -> None:
        codes[i], job_rows = _finish_job(*running.pop(i))
        rows[i] = [{**row, "job": i + 1} for row in job_rows]  # its lines' "[job N]" prefix
        if not job_rows:  # killed (kill -9, the OOM killer), or it failed first: it has no row
            print(f"[job {i + 1}] ended {how_it_ended(codes[i])} with no summary", file=stream, flush=True)

    try:
        while pending or running:
            for i in _jobs_to_start(pending, running, costs, budget, parallel):
                running[i] = _start_job(i, jobs[i], tmp, stream)
                pending.remove(i)
            for i, (proc, _, _) in list(running.items()):
                if i in running and proc.poll() is not None:
                    finish(i)
                    if stop_at_first and codes[i] == EXIT_FOUND:
                        pending = [j for j in pending if jobs[j] != jobs[i]]
                        siblings = {j: job for j, job in running.items() if jobs[j] == jobs[i]}
                        _stop_children(siblings)
                        for j in siblings:
                            finish(j)
            time.sleep(0.1)
    except KeyboardInterrupt:
        interrupted = True
        _stop_children(running)
        for i in list(running):
            finish(i)
    finally:
        with contextlib.suppress(OSError):
            os.rmdir(tmp)
    return [row for i in sorted(rows) for row in rows[i]], [codes[i] for i in sorted(codes)], interrupted


def how_it_ended(code: int) -> str:
    """A child's exit code in words: ``killed by signal 9``, ``with exit code 3``."""
    return f"killed by signal {-code}" if code < 0 else f"with exit code {code}"


def _jobs_to_start(
    pending: list[int], running: Running, costs: list[int], budget: int, parallel: int
) -> list[int]:
    """The pending jobs that start now, in order: while fewer than ``parallel`` run, each whose cost
    still fits the ``budget`` ranks beside those running (a later, smaller job may fit where an
    earlier one does not); a job larger than the whole budget starts only when nothing runs."""
    started: list[int] = []
    in_use = sum(costs[i] for i in running)
    for i in pending:
        if len(running) + len(started) >= parallel:
            break
        if (running or started) and in_use + costs[i] > budget:
            continue
        started.append(i)
        in_use += costs[i]
    return started


def _start_job(
    i: int, job: list[str], tmp: str, stream: TextIO
) -> tuple[subprocess.Popen, str, threading.Thread]:
    """Start job ``i`` in its own session (Ctrl-C is forwarded once, by us), telling it where to
    write its summary and whom to die with; a thread copies its output, prefixed, to ``stream``."""
    summary = os.path.join(tmp, f"job{i}.json")
    cmd = [*job, "--summary-json", summary, "--parent-pid", str(os.getpid())]
    print(f"[job {i + 1}] start: shardfuzz {shlex.join(job[3:])}", file=stream, flush=True)
    proc = subprocess.Popen(
        cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True
    )
    t = threading.Thread(target=_pump, args=(i, proc, stream), daemon=True)
    t.start()
    return proc, summary, t


def _pump(i: int, proc: subprocess.Popen, stream: TextIO) -> None:
    for line in proc.stdout:  # type: ignore[union-attr]
        print(f"[job {i + 1}] {line}", end="", file=stream, flush=True)


def _finish_job(
    proc: subprocess.Popen, summary: str, t: threading.Thread
) -> tuple[int, list[dict[str, Any]]]:
    """An ended job's exit code and summary rows (none if it wrote no readable summary: killed,
    or it failed before writing one); its summary file is removed."""
    t.join(timeout=5)
    try:
        with open(summary) as f:
            rows = json.load(f)
    except (OSError, ValueError):
        rows = []
    with contextlib.suppress(OSError):
        os.remove(summary)
    return proc.returncode, rows


def _stop_children(running: Running, wait_s: float = 30.0) -> None:
    """SIGINT to every child, then wait up to ``wait_s`` in all; kill what is left (a second
    Ctrl-C or SIGTERM kills at once)."""
    procs = [proc for proc, _, _ in running.values()]
    for proc in procs:
        with contextlib.suppress(OSError):
            proc.send_signal(signal.SIGINT)
    end = time.monotonic() + wait_s
    try:
        for proc in procs:
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=max(0.0, end - time.monotonic()))
    except KeyboardInterrupt:
        pass
    for proc in procs:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
