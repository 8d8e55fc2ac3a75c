"""Warm pools of rank processes, keyed by (backend, world size).

* Workers are forkserver children of a server that has torch preloaded, so a (re)start costs
  tens of milliseconds, not the ~2 s of ``import torch`` (plain fork is unsafe after the driver used
  OpenMP, and a child of a process holding a process group cannot init its own).
* The driver owns the rendezvous: one ``TCPStore`` on port 0 per driver process, a fresh key
  prefix per pool start. No fixed or probed port, so ``pytest -n 2`` cannot race.
* The driver never joins a process group.
* Nothing outlives the driver: workers arm ``PR_SET_PDEATHSIG`` (their parent is the forkserver,
  which exits when the driver does) and re-check their parent; a watchdog thread in every worker
  exits as soon as the driver's end of a pipe closes (this alone covers macOS, which has no
  PDEATHSIG); pools are daemonic and killed at exit.
* :meth:`Pool.collect` waits on every rank's pipe and process sentinel at once. At the first
  exception or EOF it returns at once; on a timeout it dumps every rank's stack (faulthandler on
  SIGUSR1, one file per rank) before the pool is killed.
"""

from __future__ import annotations

import atexit
import collections
import contextlib
import dataclasses
import os
import shutil
import signal
import tempfile
import threading
import time
import uuid
from multiprocessing.connection import wait
from typing import Any

from shardfuzz.errors import InfrastructureError

START_TIMEOUT_S = 120.0
OUTPUT_TAIL = 4000

_lock = threading.Lock()
_ctx = None
_store = None
_pools: collections.OrderedDict[tuple, Pool] = collections.OrderedDict()


def _context(start_method: str = "forkserver"):
    global _ctx
    if start_method != "forkserver":  # only for measurements (benchmarks/): no torch preloaded
        import multiprocessing as mp

        return mp.get_context(start_method)
    if _ctx is None:
        import multiprocessing as mp

        # explicit start method: Python 3.14 changes Linux's default
        _ctx = mp.get_context("forkserver")
        # torch.distributed.tensor (DTensor, DeviceMesh, TP) costs ~0.5 s to import: preload it once
        # in the forkserver rather than in every (re)started rank
        _ctx.set_forkserver_preload(
            ["torch", "torch.distributed", "torch.distributed.tensor.parallel", "shardfuzz.worker"]
        )
    return _ctx


def _driver_store():
    global _store
    if _store is None:
        import datetime

        import torch.distributed as dist

        _store = dist.TCPStore(
            "127.0.0.1", 0, is_master=True, wait_for_workers=False, timeout=datetime.timedelta(seconds=60)
        )
    return _store


@contextlib.contextmanager
def _no_main_import():
    """Start workers without re-importing the driver's ``__main__``.

    multiprocessing makes every forkserver/spawn child import the parent's main script, so a user's
    script that calls ``shardfuzz.run()`` at top level would run again in every rank. Workers need
    nothing from ``__main__`` (implementations are imported by reference), so drop it from the
    preparation data.
    """
    from multiprocessing import spawn

    original = spawn.get_preparation_data

    def prepare(name):
        data = original(name)
        data.pop("init_main_from_path", None)
        data.pop("init_main_from_name", None)
        return data

    spawn.get_preparation_data = prepare
    try:
        yield
    finally:
        spawn.get_preparation_data = original


@dataclasses.dataclass
class Outcome:
    """What came back from one example on a pool."""

    status: str  # "ok" | "error" | "dead" | "hang"
    replies: list[Any]  # per rank: ("ok", outputs, info) or None
    rank: int | None = None  # the failing rank
    traceback: str = ""
    stacks: dict[int, str] = dataclasses.field(default_factory=dict)
    output: dict[int, str] = dataclasses.field(default_factory=dict)
    elapsed: float = 0.0
    exitcode: int | None = None


class Pool:
    """``world_size`` warm worker processes joined in one process group."""

    def __init__(
        self,
        backend: str,
        world_size: int,
        timeout_s: float,
        start_method: str = "forkserver",
        device: str = "cpu",
        debug: bool = False,
    ) -> None:
        self.start_method = start_method
        self.device = device
        self.debug = debug
        self.backend = backend
        self.world_size = world_size
        self.timeout_s = timeout_s
        self.procs: list[Any] = []
        self.conns: list[Any] = []
        self.alive_w: list[Any] = []
        self.outdir = ""
        self.started = False
        self.start_seconds = 0.0
        self._offsets: list[tuple[int, int]] = []

    # -- lifecycle ------------------------------------------------------------------------
    def start(self) -> Pool:
        from shardfuzz.worker import worker_main

        t0 = time.perf_counter()
        ctx = _context(self.start_method)
        store = _driver_store()
        self.outdir = tempfile.mkdtemp(prefix=f"shardfuzz-{self.backend}-w{self.world_size}-")
        prefix = f"shardfuzz/{os.getpid()}/{uuid.uuid4().hex}/"
        for rank in range(self.world_size):
            parent, child = ctx.Pipe(duplex=True)
            alive_r, alive_w = ctx.Pipe(duplex=False)
            p = ctx.Process(
                target=worker_main,
                args=(
                    rank,
                    self.world_size,
                    self.backend,
                    ("127.0.0.1", store.port, prefix),
                    child,
                    alive_r,
                    self.outdir,
                    self.timeout_s,
                    self.device,
                    self.debug,
                ),
                name=f"shardfuzz-{self.backend}-w{self.world_size}-rank{rank}",
                daemon=True,
            )
            with _no_main_import():
                p.start()
            child.close()
            alive_r.close()
            self.procs.append(p)
            self.conns.append(parent)
            self.alive_w.append(alive_w)
        self.started = True
        deadline = time.monotonic() + START_TIMEOUT_S
        waiting = dict(enumerate(self.conns))
        while waiting:
            left = deadline - time.monotonic()
            ready = wait(
                list(waiting.values()) + [self.procs[r].sentinel for r in waiting], timeout=max(0, left)
            )
            if not ready:
                self.kill()
                raise InfrastructureError(
                    f"pool backend={self.backend!r} world_size={self.world_size} did not start "
                    f"within {START_TIMEOUT_S:.0f} s"
                )
            for r, c in list(waiting.items()):
                if c in ready or self.procs[r].sentinel in ready:
                    msg = None
                    try:
                        if c.poll():
                            msg = c.recv()
                    except (EOFError, OSError):
                        msg = None
                    if msg is not None and msg[0] == "ready":
                        del waiting[r]
                        continue
                    detail = msg[1] if msg else self._tail(r, "err", 0)
                    self.kill()
                    raise InfrastructureError(
                        f"rank {r} of pool backend={self.backend!r} world_size={self.world_size} "
                        f"failed to start:\n{detail}"
                    )
        self.start_seconds = time.perf_counter() - t0
        return self

    @property
    def alive(self) -> bool:
        return self.started and all(p.is_alive() for p in self.procs)

    def kill(self) -> None:
        """Kill every rank now (SIGKILL) and reap them."""
        for p in self.procs:
            if p.is_alive():
                try:
                    p.kill()
                except Exception:
                    pass
        for p in self.procs:
            p.join(timeout=5)
        for c in self.conns + self.alive_w:
            try:
                c.close()
            except Exception:
                pass
        self.procs, self.conns, self.alive_w = [], [], []
        self.started = False
        if self.outdir:
            shutil.rmtree(self.outdir, ignore_errors=True)
            self.outdir = ""

    def stop(self) -> None:
        """Ask ranks to leave cleanly, then make sure they are gone."""
        for c in self.conns:
            try:
                c.send(("stop",))
            except Exception:
                pass
        deadline = time.monotonic() + 2
        for p in self.procs:
            p.join(timeout=max(0, deadline - time.monotonic()))
        self.kill()

    # -- running --------------------------------------------------------------------------
    def submit(self, task: dict[str, Any]) -> None:
        self._offsets = [(self._size(r, "out"), self._size(r, "err")) for r in range(self.world_size)]
        self._t0 = time.perf_counter()
        for c in self.conns:
            c.send(("run", task))

    def collect(self, timeout_s: float, grace_s: float = 0.3) -> Outcome:
        """Wait for every rank. Returns soon after the first error or dead rank, or after ``timeout_s``.

        After the first failure it waits up to ``grace_s`` for the other ranks, so that the *cause*
        is reported (a rank that died, or raised on its own) rather than a peer's "connection
        closed" that followed from it: Hypothesis must see one bug as one failure kind.
        """
        n = self.world_size
        replies: list[Any] = [None] * n
        pending = set(range(n))
        errors: dict[int, tuple] = {}
        dead: list[int] = []
        end = time.monotonic() + timeout_s
        while pending:
            objs = {self.conns[r]: r for r in pending}
            objs.update({self.procs[r].sentinel: r for r in pending})
            ready = wait(list(objs), timeout=max(0.0, end - time.monotonic()))
            if not ready:
                break
            for obj in ready:
                r = objs[obj]
                if r not in pending:
                    continue
                msg = None
                try:
                    if self.conns[r].poll():
                        msg = self.conns[r].recv()
                except (EOFError, OSError):
                    msg = None
                if msg is None:
                    if self.procs[r].is_alive() and obj is not self.procs[r].sentinel:
                        continue
                    self.procs[r].join(timeout=1)
                    dead.append(r)
                elif msg[0] in ("ok", "unsupported"):
                    replies[r] = msg
                else:
                    errors[r] = msg
                pending.discard(r)
            if (errors or dead) and pending:
                end = min(end, time.monotonic() + grace_s)
        if dead:
            r = min(dead)
            return self._finish(
                Outcome("dead", replies, rank=r, exitcode=self.procs[r].exitcode), include=[r]
            )
        own = sorted(r for r, m in errors.items() if not m[3] and not m[4])
        if own:
            return self._finish(
                Outcome("error", replies, rank=own[0], traceback=errors[own[0]][1]), include=[own[0]]
            )
        timed_out = {r: m[1] for r, m in errors.items() if m[3]}
        if pending or timed_out:
            return self._hang(replies, timed_out, pending)
        if errors:
            r = min(errors)
            return self._finish(Outcome("error", replies, rank=r, traceback=errors[r][1]), include=[r])
        return Outcome("ok", replies, elapsed=time.perf_counter() - self._t0)

    def _hang(self, replies, timed_out_errors, pending) -> Outcome:
        stacks = self.dump_stacks()
        out = Outcome("hang", replies, stacks=stacks)
        out.traceback = "\n".join(f"rank {r}:\n{tb}" for r, tb in sorted(timed_out_errors.items()))
        out.rank = min(pending) if pending else min(timed_out_errors)
        return self._finish(out, include=range(self.world_size))

    def _finish(self, out: Outcome, include) -> Outcome:
        out.elapsed = time.perf_counter() - self._t0
        for r in include:
            text = self._tail(r, "out", self._offsets[r][0] if self._offsets else 0)
            text_err = self._tail(r, "err", self._offsets[r][1] if self._offsets else 0)
            out.output[r] = "".join(
                f"--- rank {r} {name} ---\n{t}"
                for name, t in (("stdout", text), ("stderr", text_err))
                if t.strip()
            )
        return out

    def dump_stacks(self, wait_s: float = 1.0) -> dict[int, str]:
        """Every live rank's Python stack (all threads), via faulthandler on SIGUSR1."""
        before = {r: self._size(r, "stack") for r in range(self.world_size)}
        for p in self.procs:
            if p.is_alive():
                try:
                    os.kill(p.pid, signal.SIGUSR1)
                except ProcessLookupError:
                    pass
        deadline = time.monotonic() + wait_s
        while time.monotonic() < deadline:
            if all(self._size(r, "stack") > before[r] or not self.procs[r].is_alive() for r in before):
                time.sleep(0.05)  # let the dump finish writing
                break
            time.sleep(0.01)
        return {r: self._tail(r, "stack", before[r]) or "(no stack: process not alive)" for r in before}

    # -- files ----------------------------------------------------------------------------
    def _path(self, r: int, name: str) -> str:
        return os.path.join(self.outdir, f"rank{r}.{name}")

    def _size(self, r: int, name: str) -> int:
        try:
            return os.path.getsize(self._path(r, name))
        except OSError:
            return 0

    def _tail(self, r: int, name: str, offset: int) -> str:
        try:
            with open(self._path(r, name), errors="replace") as f:
                f.seek(offset)
                text = f.read()
        except OSError:
            return ""
        if len(text) > OUTPUT_TAIL:
            text = f"[... {len(text) - OUTPUT_TAIL} characters cut ...]\n" + text[-OUTPUT_TAIL:]
        return text


def max_pool_ranks() -> int:
    return int(os.environ.get("SHARDFUZZ_MAX_POOL_RANKS", "12"))


def get_pool(
    backend: str, world_size: int, timeout_s: float, *, device: str = "cpu", debug: bool = False
) -> Pool:
    """A warm pool for (backend, world size), started if needed. Idle pools beyond
    ``SHARDFUZZ_MAX_POOL_RANKS`` ranks in all (default 12) are stopped, least recently used first."""
    key = (backend, world_size, device, debug)
    with _lock:
        pool = _pools.pop(key, None)
        if pool is not None and not pool.alive:
            pool.kill()
            pool = None
        if pool is None:
            pool = Pool(backend, world_size, timeout_s, device=device, debug=debug).start()
        _pools[key] = pool
        while len(_pools) > 1 and sum(p.world_size for p in _pools.values()) > max_pool_ranks():
            _, old = _pools.popitem(last=False)
            old.stop()
        return pool


def discard_pool(pool: Pool) -> None:
    """Kill a pool after a failure; the next :func:`get_pool` starts a fresh one."""
    with _lock:
        for k, v in list(_pools.items()):
            if v is pool:
                del _pools[k]
    pool.kill()


def shutdown() -> None:
    """Stop every pool (registered with atexit)."""
    with _lock:
        pools = list(_pools.values())
        _pools.clear()
    for p in pools:
        p.stop()


atexit.register(shutdown)
