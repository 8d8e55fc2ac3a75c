"""A warm pool of rank processes: start, submit a task, collect one outcome, kill.

* Ranks are started by :mod:`shardfuzz.ranks.spawn` (forkserver with torch preloaded, driver-owned
  store); the driver never joins a process group.
* Nothing outlives the driver: workers arm ``PR_SET_PDEATHSIG`` and watch a pipe to the driver
  (:mod:`shardfuzz.ranks.worker`); pools are daemonic and killed at exit.
* :meth:`Pool.collect` waits on every rank's pipe and process sentinel at once. At the first
  exception or EOF it returns at once. It calls an example hung only with evidence (no rank used
  CPU over the window, or the hard cap passed) and then dumps every rank's stack (faulthandler on
  SIGUSR1, one file per rank) before the pool is killed.
* An idle pool can be suspended (:meth:`Pool.suspend`, SIGSTOP) until its next task: an idle rank
  is not idle to the CPU, since each of its gloo groups has a loop thread that wakes every 10 ms
  (gloo's TCP transport polls). The driver suspends each pool unused for a second
  (:mod:`shardfuzz.ranks.pool_cache`).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Iterable
from multiprocessing.connection import wait
from typing import Any

from shardfuzz.errors import InfrastructureError
from shardfuzz.limits import env_int
from shardfuzz.protocol import (
    Completed,
    ErrorReply,
    Hung,
    Outcome,
    RankDied,
    RankFailed,
    Ready,
    Reply,
    StartFailed,
    Stop,
    Task,
    UnsupportedReply,
)
from shardfuzz.ranks.spawn import ProgressWatch, context, driver_store, hard_cap, runnable, start_process
from shardfuzz.ranks.trace import Collective, read_trace
from shardfuzz.ranks.worker import worker_main

START_TIMEOUT_S = 120.0
#: after a rank's own exception (not a peer's closed connection), how long to wait for the others
OWN_ERROR_GRACE_S = 0.05
#: after the grace, how much longer to wait for peers still on their way (runnable, or in no
#: collective of this example yet: a peer can sleep briefly before its first one, on a page fault
#: or a lazy import): on a loaded machine a peer may not have reached its next collective yet, and
#: the report's first divergent collective comes from where each rank got to
RUNNABLE_GRACE_S = 1.0
#: how long to wait for a dead rank's exit code (its pipe closed; the forkserver reports the code)
EXIT_CODE_WAIT_S = 10.0
OUTPUT_TAIL = 4000
#: and of its first lines: an abort's 'terminate called after throwing' comes before the noise
OUTPUT_HEAD = 2000


class Pool:
    """``world_size`` warm worker processes joined in one process group."""

    def __init__(
        self,
        backend: str,
        world_size: int,
        timeout_s: float,
        device: str = "cpu",
        debug: bool = False,
    ) -> None:
        self.backend, self.world_size, self.device, self.debug = backend, world_size, device, debug
        self.timeout_s = timeout_s  # the world group's gloo timeout (the hard cap of the first user)
        #: worker refs of the targets that ran an example here (the first one pays their imports)
        self.ran: set[str] = set()
        self.procs: list[Any] = []
        self.conns: list[Any] = []
        self.alive_w: list[Any] = []
        self.outdir = ""
        self.started = False
        self.generation = 0  # of the world group: :func:`shardfuzz.ranks.regroup.regroup` counts up
        self.unanswered: set[int] = set()  # ranks still running the last task when collect returned
        self.regrouping: float | None = None  # when an unsettled regroup was sent (recover.py)
        self._offsets: list[tuple[int, int]] = []
        self.suspended = False  # every rank stopped (SIGSTOP) until the next task: see suspend
        self.idle_since = time.monotonic()  # when its last task was collected (or it was handed out)
        self._in_flight = False  # a task was submitted and its outcome not yet collected
        self._lock = threading.Lock()  # suspend vs. submit: a pool is never stopped with a task

    # -- lifecycle ------------------------------------------------------------------------
    def start(self) -> Pool:
        ctx = context()
        store = driver_store()
        self.outdir = tempfile.mkdtemp(prefix=f"shardfuzz-{self.backend}-w{self.world_size}-")
        store_info = ("127.0.0.1", store.port, f"shardfuzz/{os.getpid()}/{uuid.uuid4().hex}/")
        common = (self.outdir, self.timeout_s, self.device, self.debug)
        for rank in range(self.world_size):
            parent, child = ctx.Pipe(duplex=True)
            alive_r, alive_w = ctx.Pipe(duplex=False)
            p = ctx.Process(
                target=worker_main,
                args=(rank, self.world_size, self.backend, store_info, child, alive_r, *common),
                name=f"shardfuzz-{self.backend}-w{self.world_size}-rank{rank}",
                daemon=True,
            )
            start_process(p)
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
                    msg = receive(c)
                    if isinstance(msg, Ready):
                        del waiting[r]
                        continue
                    detail = msg.traceback if isinstance(msg, StartFailed) else self._tail(r, "err", 0)
                    self.kill()
                    raise InfrastructureError(
                        f"rank {r} of pool backend={self.backend!r} world_size={self.world_size} "
                        f"failed to start:\n{detail}"
                    )
        return self

    @property
    def alive(self) -> bool:
        return self.started and all(p.is_alive() for p in self.procs)

    def kill(self) -> None:
        """Kill every rank now (SIGKILL, which ends a stopped process too) and reap them."""
        self.suspended = False
        for p in self.procs:
            if p.is_alive():
                with contextlib.suppress(Exception):
                    p.kill()
        for p in self.procs:
            p.join(timeout=5)
        for c in self.conns + self.alive_w:
            with contextlib.suppress(Exception):
                c.close()
        self.procs, self.conns, self.alive_w = [], [], []
        self.started = False
        if self.outdir:
            shutil.rmtree(self.outdir, ignore_errors=True)
            self.outdir = ""

    def stop(self) -> None:
        """Ask ranks to leave cleanly, then make sure they are gone."""
        with self._lock:
            self._resume()
            self.started = False  # never suspended again (kill reaps them)
        for c in self.conns:
            with contextlib.suppress(Exception):
                c.send(Stop())
        deadline = time.monotonic() + 2
        for p in self.procs:
            p.join(timeout=max(0, deadline - time.monotonic()))
        self.kill()

    def suspend(self, unused_s: float = 0.0) -> bool:
        """Stop every rank (SIGSTOP) until the next task, message or stop resumes them, if the pool
        has been unused for ``unused_s`` seconds; True when it did. An idle rank still costs CPU:
        each of its gloo groups has a loop thread that wakes every 10 ms (about 0.1% of a core
        each, 100+ of them in a ci suite). Only a pool with nothing in flight is stopped: no task
        uncollected, no rank still running the last one, no regroup unsettled (a rank stopped
        inside a collective could time out once resumed). Gloo pools only: NCCL's heartbeat
        monitor may abort a rank that was stopped for minutes, and no GPU run has tried it. Linux
        only: a stopped rank's watchdog thread cannot see its driver die, PR_SET_PDEATHSIG still
        kills it; ``SHARDFUZZ_SUSPEND_IDLE=0`` keeps idle ranks running (e.g. to attach a debugger)."""
        with self._lock:
            idle = not (self._in_flight or self.unanswered or self.regrouping is not None)
            unused = time.monotonic() - self.idle_since >= unused_s
            gloo = self.backend == "gloo"
            if self.suspended or not (idle and unused and gloo) or not self.started or not suspend_idle():
                return False
            self._signal_all(signal.SIGSTOP)
            self.suspended = True
            return True

    def resume(self) -> None:
        """Continue every rank of a suspended pool (SIGCONT); nothing otherwise."""
        with self._lock:
            self._resume()

    def _resume(self) -> None:
        if self.suspended:
            self._signal_all(signal.SIGCONT)
            self.suspended = False

    def touch(self) -> None:
        """Mark the pool as in use now (handed out): not suspended for another ``unused_s``."""
        with self._lock:
            self.idle_since = time.monotonic()

    def _signal_all(self, sig: int) -> None:
        for p in self.procs:
            if p.is_alive():  # a dead rank's pid may be another process's by now
                # a rank that died meanwhile: its pool's next collect or alive says so
                with contextlib.suppress(ProcessLookupError):
                    os.kill(p.pid, sig)

    # -- running --------------------------------------------------------------------------
    def send_all(self, msg: Any) -> None:
        """Send one message to every rank (a :class:`~shardfuzz.protocol.Warm`: import ahead)."""
        for c in self.conns:
            c.send(msg)

    def submit(self, task: Task) -> None:
        with self._lock:
            self._in_flight = True
            self._resume()
        self._offsets = [(self._size(r, "out"), self._size(r, "err")) for r in range(self.world_size)]
        self._t0 = time.perf_counter()
        for c in self.conns:
            c.send(task)

    def busy(self) -> bool:
        """Some rank has not answered yet (the driver's time until then is free)."""
        return not all(c.poll(0) for c in self.conns)

    def collect(self, window_s: float, cap_s: float | None = None, grace_s: float = 0.3) -> Outcome:
        """Wait for every rank. Returns soon after the first error or dead rank, or with a hang.

        A hang needs evidence (:class:`~shardfuzz.ranks.spawn.ProgressWatch`): no rank used CPU over
        the last ``window_s`` seconds, or the hard cap ``cap_s`` (default
        :func:`~shardfuzz.ranks.spawn.hard_cap`) passed while ranks kept computing. After the first
        failure it waits up to ``grace_s`` for the other ranks, so that the *cause* is reported (a
        rank that died, or raised on its own) rather than a peer's "connection closed" that
        followed from it: Hypothesis must see one bug as one failure kind. A peer still computing
        then gets up to :data:`RUNNABLE_GRACE_S` more to reach its next collective (the trace).
        """
        n = self.world_size
        cap = hard_cap(window_s) if cap_s is None else cap_s
        replies: list[Reply | UnsupportedReply | None] = [None] * n
        pending = set(range(n))
        errors: dict[int, ErrorReply] = {}
        dead: list[int] = []
        watch = self._watch(window_s, cap)
        grace_end = grace_cap = float("inf")
        verdict = None
        while pending:
            objs = {self.conns[r]: r for r in pending}
            objs.update({self._sentinel(r): r for r in pending})
            ready = wait(list(objs), timeout=max(0.0, min(watch.next_check, grace_end) - time.monotonic()))
            for obj in ready:
                r = objs[obj]
                if r not in pending:
                    continue
                msg = receive(self.conns[r])
                if msg is None:  # its pipe closed (a live rank never closes it) or it exited
                    # the exit code comes from the forkserver, which may report it late under load
                    # (a peer's "connection closed" first): a death is a death, never a hang
                    if not self._reap(r):
                        continue  # not gone after all (a rank server's late answer): still pending
                    dead.append(r)
                elif isinstance(msg, (Reply, UnsupportedReply)):
                    replies[r] = msg
                else:
                    errors[r] = msg
                pending.discard(r)
            now = time.monotonic()
            if (errors or dead) and pending:
                # a rank's own exception is the cause: peers are only stuck waiting for it (a
                # moment for a death at the same time); a "connection closed" may follow one
                cause = not dead and all(not (e.peer_closed or e.timed_out) for e in errors.values())
                grace_end = min(grace_end, now + (min(grace_s, OWN_ERROR_GRACE_S) if cause else grace_s))
                grace_cap = min(grace_cap, now + RUNNABLE_GRACE_S)
            if now >= grace_end:
                if now < grace_cap and any(self._on_its_way(r) for r in pending):
                    grace_end = now + 0.02  # a peer still on its way: see RUNNABLE_GRACE_S
                    continue
                verdict = "grace"
                break
            if pending and now >= watch.next_check:
                verdict = watch.check()
                if verdict:
                    break
        elapsed = time.perf_counter() - self._t0
        self.unanswered = set(pending)
        # which outcome the answers make is decided once, after the wait: the loop above runs at
        # every poll of every example and stays as it is
        outcome = self._outcome(replies, pending, errors, dead, watch, verdict, window_s, cap, elapsed)
        with self._lock:  # in flight until here: a hang's stacks are dumped from running ranks
            self.idle_since = time.monotonic()
            self._in_flight = False
        return outcome

    def _outcome(
        self,
        replies: list[Reply | UnsupportedReply | None],
        pending: set[int],
        errors: dict[int, ErrorReply],
        dead: list[int],
        watch: ProgressWatch,
        verdict: str | None,
        window_s: float,
        cap: float,
        elapsed: float,
    ) -> Outcome:
        """The one outcome of an example, by cause: a dead rank first (its peers' errors follow
        from it); then a rank's own error (the lowest rank's, an error before a timeout, and no
        timeout at the hard cap); then a hang (ranks that never answered, or timed out); then a
        peer's "connection closed" alone; else every rank answered."""
        n = self.world_size
        if dead:
            r = min(dead)
            codes = {d: self._exit_code(d) for d in sorted(dead)}
            return RankDied(r, codes[r], self._output(range(n), errors, r), elapsed, self.traces(), codes)
        late = elapsed >= cap - 1.0  # a gloo timeout at the cap is hang evidence, not the rank's error
        own = sorted(
            (m.timed_out, r) for r, m in errors.items() if not m.peer_closed and not (m.timed_out and late)
        )
        if own:
            r = own[0][1]
            return RankFailed(r, errors[r], self._output(range(n), errors, r), elapsed, self.traces())
        timed_out = {r: m.traceback for r, m in errors.items() if m.timed_out}
        if pending or timed_out:
            stacks = self.dump_stacks()
            return Hung(
                min(pending) if pending else min(timed_out),
                timed_out,
                stacks,
                self._output(range(n)),
                elapsed,
                evidence=verdict or "cap",
                window=window_s,
                cap=cap,
                finished=tuple(r for r in range(n) if replies[r] is not None),
                stuck=tuple(sorted(pending | set(timed_out))),
                busy=watch.busy,
                cpu=watch.used(),
                traces=self.traces(),
            )
        if errors:
            r = min(errors)
            return RankFailed(r, errors[r], self._output(range(n), errors, r), elapsed, self.traces())
        return Completed([rep for rep in replies if rep is not None], elapsed)

    def _output(
        self, ranks: Iterable[int], errors: dict | None = None, cause: int | None = None
    ) -> dict[int, str]:
        """The stdout/stderr each of ``ranks`` wrote during this example, and the last line of each
        peer's error (a peer of ``cause`` sees the connection close: say so, briefly)."""
        out = {}
        for r in ranks:
            text = self._tail(r, "out", self._offsets[r][0] if self._offsets else 0)
            text_err = self._tail(r, "err", self._offsets[r][1] if self._offsets else 0)
            peer = errors.get(r) if errors and r != cause else None
            last = (
                peer.traceback.strip().splitlines()[-1] if peer is not None and peer.traceback.strip() else ""
            )
            out[r] = "".join(
                f"--- rank {r} {name} ---\n{t.rstrip()}\n"
                for name, t in (("stdout", text), ("stderr", text_err), ("error", last))
                if t.strip()
            )
        return out

    def traces(self) -> dict[int, tuple[Collective, ...]]:
        """The collectives each rank entered in this example, from its trace file (written as it
        entered them, so a hung, aborted or dead rank's trace is there too)."""
        return {r: read_trace(self._path(r, "trace")) for r in range(self.world_size)}

    def dump_stacks(self, wait_s: float = 1.0) -> dict[int, str]:
        """Every live rank's Python stack (all threads), via faulthandler on SIGUSR1."""
        before = {r: self._size(r, "stack") for r in range(self.world_size)}
        for r in before:
            self._signal_stack(r)
        deadline = time.monotonic() + wait_s
        while time.monotonic() < deadline:
            if all(self._size(r, "stack") > before[r] or not self._rank_alive(r) for r in before):
                time.sleep(0.05)  # let the dump finish writing
                break
            time.sleep(0.01)
        return {r: self._tail(r, "stack", before[r]) or "(no stack: process not alive)" for r in before}

    # -- one rank's process and files (a remote pool reads them over its control channel) ----
    def _watch(self, window_s: float, cap: float) -> ProgressWatch:
        return ProgressWatch([p.pid for p in self.procs], window_s, cap)

    def _sentinel(self, r: int) -> Any:
        return self.procs[r].sentinel

    def _reap(self, r: int) -> bool:
        """Wait for rank ``r``'s exit once its sentinel fired; True: it is gone."""
        self.procs[r].join(timeout=EXIT_CODE_WAIT_S)
        return True

    def _exit_code(self, r: int) -> int | None:
        return self.procs[r].exitcode

    def _runnable(self, r: int) -> bool:
        return runnable(self.procs[r].pid)

    def _on_its_way(self, r: int) -> bool:
        """Rank ``r`` may still reach a collective of this example: it is computing, or its
        implementation has entered none yet (its trace, emptied when the implementation starts, is
        empty), so it is not stuck in one that the failed rank left. Before its implementation
        starts, a rank's trace still holds its last example's: only a runnable rank counts then."""
        return self._runnable(r) or self._size(r, "trace") == 0

    def _rank_alive(self, r: int) -> bool:
        return self.procs[r].is_alive()

    def _signal_stack(self, r: int) -> None:
        if self.procs[r].is_alive():
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.procs[r].pid, signal.SIGUSR1)

    def _path(self, r: int, name: str) -> str:
        return os.path.join(self.outdir, f"rank{r}.{name}")

    def _size(self, r: int, name: str) -> int:
        try:
            return os.path.getsize(self._path(r, name))
        except OSError:
            return 0

    def _tail(self, r: int, name: str, offset: int) -> str:
        return read_tail(self._path(r, name), offset)


def suspend_idle() -> bool:
    """Whether idle pools are suspended: on Linux (PR_SET_PDEATHSIG), unless SHARDFUZZ_SUSPEND_IDLE=0."""
    return sys.platform == "linux" and env_int("SHARDFUZZ_SUSPEND_IDLE", 1, 0) > 0


def read_tail(path: str, offset: int) -> str:
    """What a rank wrote to ``path`` from ``offset`` on, its head and tail when long ("" when none)."""
    try:
        with open(path, errors="replace") as f:
            f.seek(offset)
            text = f.read()
    except OSError:
        return ""
    if len(text) > OUTPUT_HEAD + OUTPUT_TAIL:
        cut = len(text) - OUTPUT_HEAD - OUTPUT_TAIL
        text = f"{text[:OUTPUT_HEAD]}\n[... {cut} characters cut ...]\n{text[-OUTPUT_TAIL:]}"
    return text


def receive(conn: Any) -> Any:
    """The next message on ``conn``, or None at EOF (or when there is none yet)."""
    try:
        return conn.recv() if conn.poll() else None
    except (EOFError, OSError):
        return None
