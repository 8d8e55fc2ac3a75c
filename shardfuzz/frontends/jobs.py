"""Parallel ``--jobs``: child ``shardfuzz fuzz`` processes side by side within a rank budget, that
stop with their parent (Ctrl-C and SIGTERM forwarded; PR_SET_PDEATHSIG when it is killed)."""

from __future__ import annotations

import contextlib
import ctypes
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
    PR_SET_PDEATHSIG; the child's own ranks then follow it), and exit now if it is already gone."""
    try:
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):  # not Linux: the parent's SIGTERM handler still stops us
        pass
    if os.getppid() != parent_pid:
        os._exit(130)


def run_jobs(  # noqa: C901 (not split yet: issue 24 (faults) changes it at the same time)
    jobs: list[list[str]], costs: list[int], budget: int, parallel: int, stream: TextIO = sys.stdout
) -> tuple[list[dict[str, Any]], list[int], bool]:
    """Run child ``shardfuzz fuzz`` commands side by side: at most ``parallel`` at once, and the sum of
    their costs within ``budget`` ranks (a job larger than the budget runs alone).

    Children run in their own session (a terminal's Ctrl-C reaches only this parent, which forwards
    it once) and die with this parent (``--parent-pid``: PR_SET_PDEATHSIG). Ctrl-C or SIGTERM here
    (KeyboardInterrupt) is forwarded to every running child as SIGINT; each stops cleanly, keeping
    its verdict and summary, within 30 s or is killed. Returns the children's summary rows, their
    exit codes, and whether the run was interrupted."""
    pending = list(range(len(jobs)))
    running: dict[int, tuple[subprocess.Popen, str, threading.Thread]] = {}
    rows: dict[int, list[dict[str, Any]]] = {}
    codes: dict[int, int] = {}
    tmp = tempfile.mkdtemp(prefix="shardfuzz-jobs-")
    interrupted = False

    def pump(i: int, proc: subprocess.Popen) -> None:
        for line in proc.stdout:  # type: ignore[union-attr]
            print(f"[job {i + 1}] {line}", end="", file=stream, flush=True)

    def finish(i: int) -> None:
        proc, summary, t = running.pop(i)
        t.join(timeout=5)
        codes[i] = proc.returncode
        try:
            with open(summary) as f:
                rows[i] = json.load(f)
        except (OSError, ValueError):
            rows[i] = []
        with contextlib.suppress(OSError):
            os.remove(summary)

    try:
        while pending or running:
            in_use = sum(costs[i] for i in running)
            for i in list(pending):
                if len(running) >= parallel:
                    break
                if running and in_use + costs[i] > budget:
                    continue
                summary = os.path.join(tmp, f"job{i}.json")
                cmd = [*jobs[i], "--summary-json", summary, "--parent-pid", str(os.getpid())]
                print(f"[job {i + 1}] start: shardfuzz {shlex.join(jobs[i][3:])}", file=stream, flush=True)
                proc = subprocess.Popen(
                    cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True
                )
                t = threading.Thread(target=pump, args=(i, proc), daemon=True)
                t.start()
                running[i] = (proc, summary, t)
                pending.remove(i)
                in_use += costs[i]
            for i, (proc, _, _) in list(running.items()):
                if proc.poll() is not None:
                    finish(i)
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


def _stop_children(
    running: dict[int, tuple[subprocess.Popen, str, threading.Thread]], wait_s: float = 30.0
) -> None:
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
