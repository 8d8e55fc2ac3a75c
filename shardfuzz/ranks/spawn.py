"""Starting rank processes (the forkserver with torch preloaded, the driver's rendezvous store, no
re-import of the driver's ``__main__``) and watching them (:class:`ProgressWatch`).

* Workers are forkserver children of a server that has torch preloaded, so a (re)start costs
  tens of milliseconds, not the ~2 s of ``import torch`` (plain fork is unsafe after the driver used
  OpenMP, and a child of a process holding a process group cannot init its own).
* The driver owns the rendezvous: one ``TCPStore`` per driver process on a port the kernel picks,
  listening on 127.0.0.1 only (the ranks are local; the store has no authentication), a fresh key
  prefix per pool start. No fixed or probed port, so ``pytest -n 2`` cannot race.
* A hang needs evidence: :class:`ProgressWatch` reads the ranks' CPU time, and an example is
  stuck only when no rank used CPU over the last window (a rank waiting in a gloo collective or a
  sleep uses none; a computing or importing one uses most of a core).
"""

from __future__ import annotations

import collections
import contextlib
import datetime
import importlib
import multiprocessing as mp
import multiprocessing.forkserver
import multiprocessing.spawn
import os
import socket
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any

# torch.distributed is imported inside driver_store: the seams (the CLI's commands, the pytest
# plugin's tests) import this module and call start_forkserver before they import the engine, so
# that the forkserver's preload overlaps with the driver's own import of torch (BEFORE_TORCH in
# tests/test_structure.py)

#: a rank progresses when its CPU time grew by more than this share of the window
PROGRESS_FRACTION = 0.02
#: a busy example may extend its wait up to max(HARD_CAP_MIN_S, HARD_CAP_FACTOR x window)
HARD_CAP_MIN_S = 120.0
HARD_CAP_FACTOR = 10.0
#: how often the driver reads the ranks' CPU times while it waits
TICK_S = 0.25

_ctx: Any = None
_store: Any = None


def context() -> Any:
    global _ctx
    if _ctx is None:
        # explicit start method: Python 3.14 changes Linux's default
        _ctx = mp.get_context("forkserver")
        # preload once in the forkserver what every (re)started rank would otherwise import inside
        # an example: torch.distributed.tensor (DTensor, DeviceMesh, TP: ~0.5 s),
        # torch._inductor.config, which torch.use_deterministic_algorithms imports (with
        # torch._dynamo: ~300 modules, 0.5-0.6 s idle, 2-7 s under load), and Hypothesis and the
        # strategies, which every target module imports (most of the 0.15-0.45 s a fresh rank's
        # first example spent importing its target; a spare imports the target itself). The
        # forkserver exits without the teardown of all that (1.2-1.7 s): shardfuzz.ranks.fast_exit
        _ctx.set_forkserver_preload(
            [
                "torch",
                "torch.distributed",
                "torch.distributed.tensor.parallel",
                "torch._dynamo",
                "torch._inductor.config",
                "shardfuzz.ranks.worker",
                "hypothesis",
                "shardfuzz.strategies",
                # last: the forkserver then leaves without tearing torch down (its own atexit)
                "shardfuzz.ranks.fast_exit",
            ]
        )
    return _ctx


def start_forkserver() -> None:
    """Start the forkserver (and its preloading, ~2 s) in a background thread, so that it overlaps
    with the driver's own start (imports, covering rows, Hypothesis); idempotent."""
    global _early
    with _start_lock:
        if _early is not None:
            return
        _early = threading.Thread(target=_ensure_forkserver, name="shardfuzz-forkserver", daemon=True)
    _early.start()


def _ensure_forkserver() -> None:
    context()
    with no_main_import():
        mp.forkserver.ensure_running()


#: how long a rank's start waits for a forkserver killed from outside to be seen dead
FORKSERVER_GONE_S = 10.0


def start_process(process: Any) -> None:
    """``process.start()`` through the forkserver. A forkserver killed from outside (``kill -9``,
    the OOM killer) closes its socket before ``os.waitpid`` shows it dead, and a start in that window
    fails (the connection refused, or the reply cut short) where it should launch a new forkserver:
    so a start that fails that way is retried until the death shows (a new forkserver then starts)
    or :data:`FORKSERVER_GONE_S` has passed. A failed start leaves the process unstarted."""
    deadline = time.monotonic() + FORKSERVER_GONE_S
    while True:
        try:
            with no_main_import():
                process.start()
            return
        except (ConnectionRefusedError, FileNotFoundError, EOFError):
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)


_early: threading.Thread | None = None
_start_lock = threading.Lock()


def driver_store() -> Any:
    global _store
    with _start_lock:
        if _store is None:
            import torch.distributed as dist

            # TCPStore("127.0.0.1", 0, is_master=True) listens on every interface (IPv4 and IPv6)
            # without authentication: hand it a socket bound to the loopback address instead
            listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            listener.bind(("127.0.0.1", 0))
            listener.listen(128)
            port = listener.getsockname()[1]
            _store = dist.TCPStore(
                "127.0.0.1",
                port,
                is_master=True,
                wait_for_workers=False,
                timeout=datetime.timedelta(seconds=60),
                master_listen_fd=listener.detach(),  # the store owns the descriptor from here
            )
    return _store


@contextlib.contextmanager
def no_main_import() -> Iterator[None]:
    """Start workers without re-importing the driver's ``__main__``.

    multiprocessing makes every forkserver/spawn child import the parent's main script, so a user's
    script that calls ``shardfuzz.run()`` at top level would run again in every rank. Workers need
    nothing from ``__main__`` (implementations are imported by reference), so drop it from the
    preparation data.
    """
    with _main_lock:  # pools may start from several threads (spares): one patch at a time
        original = mp.spawn.get_preparation_data

        def prepare(name: str) -> dict[str, Any]:
            data = original(name)
            data.pop("init_main_from_path", None)
            data.pop("init_main_from_name", None)
            data.pop("main_path", None)  # what the forkserver itself would import
            return data

        mp.spawn.get_preparation_data = prepare
        try:
            yield
        finally:
            mp.spawn.get_preparation_data = original


_main_lock = threading.RLock()


def hard_cap(window_s: float) -> float:
    """The longest an example may run while its ranks keep using CPU; also the ranks' gloo timeout."""
    return max(HARD_CAP_MIN_S, HARD_CAP_FACTOR * window_s)


_CLOCK_TICKS = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def _proc_stat(pid: int | str) -> list[bytes] | None:
    """The fields of ``/proc/PID/stat`` after the command name (state first), or None where it
    cannot be read (no /proc, or the process is gone)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return f.read().rsplit(b")", 1)[1].split()
    except (OSError, IndexError):
        return None


def os_threads(pid: int | str = "self") -> int:
    """OS threads of a process (C++ threads such as gloo's included); Python's threads without /proc."""
    fields = _proc_stat(pid)
    return int(fields[17]) if fields is not None else threading.active_count()


def runnable(pid: int) -> bool:
    """Whether process ``pid``'s main thread is running or waiting for a core (state ``R``), not
    blocked (in a collective, on a pipe); False where ``/proc`` cannot tell."""
    fields = _proc_stat(pid)
    return fields is not None and fields[0] == b"R"


def open_fds(pid: int | str = "self") -> int:
    """Open file descriptors of a process (0 when it cannot be read)."""
    for folder in (f"/proc/{pid}/fd", "/dev/fd"):
        try:
            return len(os.listdir(folder))
        except OSError:
            pass
    return 0


def cpu_seconds(pid: int) -> float | None:
    """CPU time (user + system, all threads) process ``pid`` has used; None when unknown: from
    ``/proc``, or psutil where there is no ``/proc`` (macOS) and psutil is installed."""
    global _psutil
    fields = _proc_stat(pid)
    if fields is not None:
        return (int(fields[11]) + int(fields[12])) / _CLOCK_TICKS
    if os.path.isdir("/proc/self"):
        return None  # /proc works: the process is gone
    if _psutil is None:
        try:
            _psutil = importlib.import_module("psutil")  # optional: not a dependency
        except ImportError:
            _psutil = False
    if not _psutil:
        return None
    try:
        t = _psutil.Process(pid).cpu_times()
    except (_psutil.Error, OSError):  # gone (NoSuchProcess) or not ours to read (AccessDenied)
        return None
    return float(t.user + t.system)


_psutil: Any = None


class ProgressWatch:
    """Tells a stuck example from a slow one by the CPU time of the rank processes ``pids``.

    :meth:`check` says why to stop waiting, or None to go on: ``"idle"`` when the example has run
    ``window_s`` and no rank's CPU time grew by more than ``PROGRESS_FRACTION * window_s`` over the
    last ``window_s`` (stuck); ``"cap"`` at ``cap_s`` whatever the ranks do (busy for too long:
    ``busy`` names the ranks still using CPU); ``"timeout"`` after ``window_s`` when CPU times
    cannot be read on this system (a plain timeout). The first reading, the baseline, is taken at
    the first check, one tick in, so that an example that ends sooner reads nothing.
    """

    def __init__(
        self,
        pids: Sequence[int],
        window_s: float,
        cap_s: float,
        read: Callable[[], list[float | None]] | None = None,
    ) -> None:
        self.pids = list(pids)
        self._reader = read  # CPU times read another way (ranks on other machines: they say)
        self.window, self.cap = window_s, max(cap_s, window_s)
        self.threshold = PROGRESS_FRACTION * window_s
        self.tick = min(TICK_S, window_s / 4)
        self.t0 = time.monotonic()
        self.next_check = self.t0 + self.tick  # fast examples end before it: no reads at all
        self.samples: collections.deque = collections.deque()
        self.first: list[float | None] = []
        self.evidence = True
        self.busy: tuple[int, ...] = ()

    def _read(self) -> list[float | None]:
        return self._reader() if self._reader is not None else [cpu_seconds(p) for p in self.pids]

    def check(self) -> str | None:
        now = time.monotonic()
        self.next_check = now + self.tick
        if self.evidence:
            cur = self._read()
            if not self.samples:  # the baseline, one tick into the example
                self.first = cur
                self.evidence = all(v is not None for v in cur)
            self.samples.append((now, cur))
            # the reference sample: the latest one at least a window old (else the baseline)
            while len(self.samples) > 1 and self.samples[1][0] <= now - self.window:
                self.samples.popleft()
            ref_t, ref = self.samples[0]
            self.busy = tuple(
                r
                for r, (c, b) in enumerate(zip(cur, ref))
                if c is not None and b is not None and c - b > self.threshold
            )
        if now - self.t0 >= self.cap:
            return "cap"
        if not self.evidence:
            return "timeout" if now - self.t0 >= self.window else None
        if now - ref_t < self.window:
            return None
        return None if self.busy else "idle"

    def used(self) -> dict[int, float]:
        """CPU seconds each rank has used since the baseline (ranks that can be read)."""
        if not self.evidence or not self.first:
            return {}
        cur = self._read()
        return {r: c - b for r, (c, b) in enumerate(zip(cur, self.first)) if c is not None and b is not None}
