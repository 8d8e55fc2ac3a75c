"""Rank servers that torchrun started, used by the driver as its pools (``--ranks HOST:PORT``).

:class:`RemoteWorld` listens on the address the user names (loopback unless told otherwise),
takes only servers that prove the shared secret (:mod:`shardfuzz.ranks.secret`), waits for the
whole torchrun world (every rank on its two channels), tells it the backend, and waits for it to
join. A case of ``w`` ranks runs on :class:`RemotePool` ``w``: **the first ``w`` ranks of the
world** (torchrun numbers ranks node by node, so a case fills the first node first); the others
idle. Before a case's first task, every server makes its groups (new_group is collective over the
whole world), once per mesh and timeout.

A :class:`RemotePool` is a :class:`~shardfuzz.ranks.pool.Pool` whose ranks live elsewhere: the
same collect, hang evidence, grace and outcomes, with what a local pool reads from ``/proc`` and
files (CPU times, output, stacks, traces) asked over each server's control channel. A server that
dies closes its channels: a rank death. After a rank's own error (gloo) every server of the world
regroups in place (:meth:`RemoteWorld.start_regroup`, as a local pool does). After a death, a hang
or an NCCL error the world is rebuilt (:meth:`RemoteWorld.rebuild`): every server exits with 1,
torchrun (``--max-restarts``) starts a fresh world, and it connects again; a world that does not
come back in time is a clear error, never a hang.
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import queue
import socket
import sys
import threading
import time
from multiprocessing.connection import wait
from typing import Any

from shardfuzz.errors import InfrastructureError
from shardfuzz.limits import env_int
from shardfuzz.protocol import (
    Control,
    ErrorReply,
    Hello,
    MakeMesh,
    MeshMade,
    Ready,
    ServeConfig,
    StartFailed,
    Task,
)
from shardfuzz.ranks.pool import Pool, receive
from shardfuzz.ranks.regroup import send_regroup, settle
from shardfuzz.ranks.secret import HANDSHAKE_S, Refused, SealedConnection, accept
from shardfuzz.ranks.spawn import ProgressWatch

#: how long the driver waits for the whole torchrun world to connect (and to come back after a
#: rebuild): torchrun's own rendezvous and the servers' imports come first
DEFAULT_WAIT_S = 300
#: a control question is answered from a thread of the server at once; past this it is gone
CONTROL_S = 10.0
#: joining the world's group, and making a case's groups
JOIN_S = 120.0
#: how long a rebuild waits for each server sent away to be gone before closing its channels
EXIT_WAIT_S = 5.0
#: connections in their handshake at once; more are closed at once (a flood)
MAX_HANDSHAKES = 64


class ServerGone(InfrastructureError):
    """A rank server's channel closed outside an example (the driver rebuilds the world)."""


#: a wait for the rank servers longer than this says so, once
NOTICE_S = 2.0


@dataclasses.dataclass
class Server:
    hello: Hello
    task: SealedConnection
    control: SealedConnection
    lock: threading.Lock = dataclasses.field(default_factory=threading.Lock)
    closed: bool = False


def ranks_wait_s() -> float:
    """How long a driver waits for its rank servers (``$SHARDFUZZ_RANKS_WAIT``)."""
    return float(env_int("SHARDFUZZ_RANKS_WAIT", DEFAULT_WAIT_S, 1))


class RemoteWorld:
    """The driver's end of a torchrun world of rank servers (see the module)."""

    def __init__(
        self, bind: tuple[str, int], secret: bytes, backend: str, device: str, *, debug: bool = False,
        wait_s: float | None = None,
    ) -> None:  # fmt: skip
        self.secret, self.backend, self.device, self.debug = secret, backend, device, debug
        self._wait_s = wait_s
        self.bind = bind
        try:
            self.listener = socket.create_server(bind)
        except OSError as e:
            raise InfrastructureError(
                f"--ranks {bind[0]}:{bind[1]}: cannot listen there ({e.strerror})"
            ) from e
        self.address = self.listener.getsockname()[:2]
        self.arrivals: queue.Queue[tuple[Hello, SealedConnection]] = queue.Queue()
        self.refused: collections.deque[str] = collections.deque(maxlen=20)
        self._handshakes = threading.BoundedSemaphore(MAX_HANDSHAKES)
        self._seq = 0
        self.servers: list[Server] = []
        self.world_size = 0
        self.timeout_s = 0.0
        self.meshes: set[tuple] = set()
        self.pools: dict[int, RemotePool] = {}
        self.ran: set[str] = set()
        self._closing = False
        self.rebuilds = 0  # worlds torchrun started again at the driver's word (after a death, a hang)
        self.generation = 0  # of the world group, counted up by each regroup
        self.regrouping: RemotePool | None = None  # a regroup of the whole world, not yet settled
        threading.Thread(target=self._accept_loop, name="shardfuzz-ranks-accept", daemon=True).start()

    # -- connections ----------------------------------------------------------------------
    def _accept_loop(self) -> None:
        while not self._closing:
            try:
                sock, peer = self.listener.accept()
            except OSError:
                return  # closed
            if not self._handshakes.acquire(blocking=False):  # a flood: refused before any thread
                sock.close()
                continue
            threading.Thread(target=self._handshake, args=(sock, peer), daemon=True).start()

    def _handshake(self, sock: socket.socket, peer: Any) -> None:
        who = f"{peer[0]}:{peer[1]}"
        try:
            self._shake(sock, who)
        finally:
            self._handshakes.release()

    def _shake(self, sock: socket.socket, who: str) -> None:
        try:
            conn = accept(sock, self.secret, who)
            if not conn.poll(HANDSHAKE_S):
                raise Refused(f"{who} proved the secret but never said which rank it is")
            hello = conn.recv()
            if not isinstance(hello, Hello):
                raise Refused(f"{who} sent {type(hello).__name__}; expected Hello")
        except (Refused, OSError, EOFError) as e:
            with contextlib.suppress(OSError):
                sock.close()
            self.refused.append(str(e))
            print(f"shardfuzz: {e}", file=sys.stderr)
            return
        self.arrivals.put((hello, conn))

    @property
    def wait_s(self) -> float:
        """How long to wait for the world (``$SHARDFUZZ_RANKS_WAIT``, read at each wait; at most
        the ``wait_s`` the world was made with)."""
        return ranks_wait_s() if self._wait_s is None else min(ranks_wait_s(), self._wait_s)

    def start(self, timeout_s: float) -> RemoteWorld:
        """Wait for every rank server (both channels), send the configuration, wait until all
        joined the world's group."""
        self.timeout_s = timeout_s
        channels: dict[tuple[int, str], tuple[Hello, SealedConnection]] = {}
        wait_s = self.wait_s
        deadline = time.monotonic() + wait_s
        said = False  # a wait of minutes said nothing at all (a new user thought it hung)
        while not self.world_size or len(channels) < 2 * self.world_size:
            left = max(0.0, deadline - time.monotonic())
            try:
                hello, conn = self.arrivals.get(timeout=left if said else min(left, NOTICE_S))
            except queue.Empty:
                if not said and time.monotonic() < deadline:
                    said = True
                    where = f"{self.address[0]}:{self.address[1]}"
                    start = (
                        "torchrun restarts them after a rank failed"
                        if self.rebuilds
                        else f"start them with torchrun ... -m shardfuzz.ranks.serve --driver {where}"
                    )
                    print(
                        f"shardfuzz: waiting up to {wait_s:.0f} s for the rank servers to connect to "
                        f"{where} ({len(channels) // 2} so far; {start})",
                        file=sys.stderr,
                        flush=True,
                    )
                    continue
                raise InfrastructureError(self._missing(channels, wait_s)) from None
            if self.world_size and hello.world_size != self.world_size:
                raise InfrastructureError(
                    f"rank server {hello.rank} on {hello.host} is in a world of {hello.world_size}; the "
                    f"others are in one of {self.world_size} (two torchrun jobs on one driver?)"
                )
            self.world_size = hello.world_size
            old = channels.get((hello.rank, hello.channel))
            if old is not None:  # a server of the world before the last restart
                old[1].close()
            channels[(hello.rank, hello.channel)] = (hello, conn)
        self.servers = [
            Server(channels[(r, "task")][0], channels[(r, "task")][1], channels[(r, "control")][1])
            for r in range(self.world_size)
        ]
        config = ServeConfig(self.backend, self.device, timeout_s, self.debug)
        for s in self.servers:
            s.task.send(config)
        self._expect_all(lambda m: isinstance(m, Ready), JOIN_S, "join the torchrun world's group")
        # said once a world is up (and again after torchrun restarts it): the driver said nothing,
        # and the world's size was only in the failure files
        hosts = sorted({s.hello.host for s in self.servers})
        again = f" (torchrun's restart {self.rebuilds} of the world)" if self.rebuilds else ""
        print(
            f"shardfuzz: {self.world_size} rank servers joined from {', '.join(hosts)}{again}",
            file=sys.stderr,
            flush=True,
        )
        return self

    def _missing(self, channels: dict, wait_s: float) -> str:
        got = sorted({r for r, _ in channels})
        where = f"{self.address[0]}:{self.address[1]}"
        refused = f"; turned away: {'; '.join(list(self.refused)[-3:])}" if self.refused else ""
        # the world's size is known once a server has said it ("0 of ?" read as a broken message)
        connected = (
            f"{len(got)} of {self.world_size} rank servers connected to {where} within {wait_s:.0f} s (ranks {got})"
            if got and self.world_size
            else f"no rank server connected to {where} within {wait_s:.0f} s"
        )
        return (
            f"{connected}{refused}. Start them on every node with the same secret: "
            f"torchrun --nnodes N --nproc-per-node K ... -m shardfuzz.ranks.serve --driver {where}"
        )

    def _expect_all(self, ok: Any, timeout_s: float, what: str, ranks: range | None = None) -> None:
        ranks = range(self.world_size) if ranks is None else ranks
        deadline = time.monotonic() + timeout_s
        waiting = set(ranks)
        while waiting:
            conns: dict[Any, int] = {self.servers[r].task: r for r in waiting}
            ready = wait(list(conns), timeout=max(0.0, deadline - time.monotonic()))
            if not ready:
                raise InfrastructureError(
                    f"rank servers {sorted(waiting)} did not {what} within {timeout_s:.0f} s"
                )
            for c in ready:
                r = conns[c]
                msg = receive(self.servers[r].task)
                if msg is None:
                    self.servers[r].closed = True
                    raise ServerGone(f"rank server {r} ({self._who(r)}) is gone: its channel closed")
                if not ok(msg):
                    detail = msg.traceback if isinstance(msg, (StartFailed, ErrorReply)) else repr(msg)
                    raise InfrastructureError(f"rank server {r} could not {what}:\n{detail}")
                waiting.discard(r)

    def _who(self, r: int) -> str:
        h = self.servers[r].hello
        return f"pid {h.pid} on {h.host}, local rank {h.local_rank}"

    # -- cases ----------------------------------------------------------------------------
    def start_regroup(self, pool: RemotePool) -> bool:
        """After a rank's own exception (gloo), every server of the world leaves its groups and
        joins a fresh world group (:mod:`shardfuzz.ranks.regroup`), instead of a torchrun restart;
        settled before the next pool is handed out. False: the world is rebuilt instead."""
        self.generation += 1
        full = RemotePool(self, self.world_size)
        full.unanswered = set(pool.unanswered)
        if not send_regroup(full, self.generation, answered=not pool.unanswered):
            return False
        self.meshes = set()  # the servers dropped theirs with their groups
        self.regrouping = full
        return True

    def pool(self, world_size: int) -> RemotePool:
        if not self.alive:  # a server that stopped answering between examples
            # named, with its host: a new user's lost node was never said, only the waits after it
            gone = [r for r, s in enumerate(self.servers) if s.closed]
            who = "; ".join(f"rank {r}: {self._who(r)}" for r in gone) or "none closed"
            print(
                f"shardfuzz: rank servers stopped answering ({who}); rebuilding the torchrun world",
                file=sys.stderr,
            )
            self.rebuild()
        if self.regrouping is not None:
            full, self.regrouping = self.regrouping, None
            if not settle(full):
                print(
                    "shardfuzz: the rank servers could not regroup; rebuilding the torchrun world",
                    file=sys.stderr,
                )
                self.rebuild()
        if world_size > self.world_size:
            raise InfrastructureError(
                f"a case of {world_size} ranks on a torchrun world of {self.world_size}: draw world "
                f"sizes up to {self.world_size} (--world-sizes) or start more ranks"
            )
        if world_size not in self.pools:
            self.pools[world_size] = RemotePool(self, world_size)
        return self.pools[world_size]

    def make_mesh(self, world_size: int, shape: tuple[int, ...], timeout_s: float) -> None:
        """Every server makes the case's groups (once per mesh and timeout)."""
        key = (world_size, tuple(shape), timeout_s)
        if key in self.meshes:
            return
        for s in self.servers:
            s.task.send(MakeMesh(world_size, tuple(shape), timeout_s))
        self._expect_all(lambda m: isinstance(m, MeshMade), JOIN_S, f"make the groups of mesh {shape}")
        self.meshes.add(key)

    def ask(self, r: int, question: Control) -> Any:
        """A server's answer on its control channel (None when it is gone). A late answer to an
        earlier question is skipped by its number."""
        s = self.servers[r]
        if s.closed:
            return None
        with s.lock:
            self._seq += 1
            seq, deadline = self._seq, time.monotonic() + CONTROL_S
            try:
                s.control.send(dataclasses.replace(question, seq=seq))
                while s.control.poll(max(0.0, deadline - time.monotonic())):
                    got, value = s.control.recv()
                    if got == seq:
                        return value
            except (EOFError, OSError):
                pass
        s.closed = True  # no answer in time: gone, or stuck where Python cannot run (rebuilt next)
        return None

    def drained_gone(self, r: int) -> bool:
        """Whether server ``r``'s control channel, readable, is at its end (gone); late answers
        found there are dropped."""
        s = self.servers[r]
        with s.lock:
            try:
                while s.control.poll(0):
                    s.control.recv()
            except (EOFError, OSError):
                s.closed = True
        return s.closed

    @property
    def alive(self) -> bool:
        return bool(self.servers) and not any(s.closed for s in self.servers)

    def rebuild(self) -> None:
        """Send every server away (exit 1: torchrun restarts the world) and wait for the new one.
        The task channels close only once each server is gone (or after a moment): a server that
        saw its task channel close first would exit 0, which torchrun takes for the job's end."""
        for s in self.servers:
            with contextlib.suppress(Exception):
                s.control.send(Control("exit", offset=1))
        deadline = time.monotonic() + EXIT_WAIT_S
        for s in self.servers:
            with contextlib.suppress(Exception):
                while s.control.poll(max(0.0, deadline - time.monotonic())):
                    s.control.recv()  # late answers, then the end of the channel (EOFError)
            for c in (s.task, s.control):
                with contextlib.suppress(Exception):
                    c.close()
        while not self.arrivals.empty():  # servers of the old world that connected late
            with contextlib.suppress(Exception):
                self.arrivals.get_nowait()[1].close()
        self.servers, self.meshes, self.pools, self.ran, self.regrouping = [], set(), {}, set(), None
        self.rebuilds += 1
        world = self.world_size
        try:
            self.start(self.timeout_s)
        except InfrastructureError as e:
            raise InfrastructureError(
                f"the torchrun world of {world} rank servers did not come back after a rebuild (start "
                f"torchrun with --max-restarts so that it restarts them): {e}"
            ) from e

    def close(self) -> None:
        """Stop listening and close every channel: the servers exit with 0, and torchrun ends."""
        self._closing = True
        with contextlib.suppress(OSError):
            # shutdown first: a close alone leaves the port listening while the accept thread is
            # blocked in accept(), and the next world on this port failed "Address already in use"
            self.listener.shutdown(socket.SHUT_RDWR)
        with contextlib.suppress(OSError):
            self.listener.close()
        while not self.arrivals.empty():  # connected, never part of a world
            with contextlib.suppress(Exception):
                self.arrivals.get_nowait()[1].close()
        for s in self.servers:
            for c in (s.task, s.control):
                with contextlib.suppress(Exception):
                    c.close()
        self.servers = []


class RemotePool(Pool):
    """The first ``world_size`` ranks of a :class:`RemoteWorld`, as a pool."""

    remote = True

    def __init__(self, world: RemoteWorld, world_size: int) -> None:
        super().__init__(world.backend, world_size, world.timeout_s, device=world.device, debug=world.debug)
        self.world = world
        self.started = True

    @property
    def conns(self) -> list[Any]:
        """The task channels of the world's first ``world_size`` servers (those of today's world:
        a rebuild replaces them)."""
        return [s.task for s in self.world.servers[: self.world_size]]

    @conns.setter
    def conns(self, _value: Any) -> None:
        pass  # Pool.__init__ starts it empty: the world's servers are the ranks

    @property
    def ran(self) -> set[str]:
        return self.world.ran

    @ran.setter
    def ran(self, _value: Any) -> None:
        pass

    @property
    def alive(self) -> bool:
        return self.started and self.world.alive

    def start(self) -> RemotePool:
        return self

    def kill(self) -> None:
        self.started = False  # the servers belong to the world: RemoteWorld.rebuild or close

    def stop(self) -> None:
        self.started = False

    def submit(self, task: Task) -> None:
        try:
            self.world.make_mesh(task.case.world_size, tuple(task.case.mesh), task.timeout)
        except InfrastructureError as e:  # a server gone, or groups made on some servers only:
            # between examples, nobody's finding; the world is rebuilt, once
            print(f"shardfuzz: {e}; rebuilding the torchrun world", file=sys.stderr)
            self.world.rebuild()
            self.world.make_mesh(task.case.world_size, tuple(task.case.mesh), task.timeout)
        super().submit(task)

    def send_all(self, msg: Any) -> None:
        for c in self.conns:
            c.send(msg)

    def _watch(self, window_s: float, cap: float) -> ProgressWatch:
        return ProgressWatch(
            [],
            window_s,
            cap,
            read=lambda: [self.world.ask(r, Control("cpu")) for r in range(self.world_size)],
        )

    def _sentinel(self, r: int) -> Any:
        return self.world.servers[r].control  # readable only when the server is gone

    def _reap(self, r: int) -> bool:
        return self.world.drained_gone(r)

    def _exit_code(self, r: int) -> int | None:  # noqa: ARG002 (every rank's is on another machine)
        return None  # torchrun's log there has it

    def _runnable(self, r: int) -> bool:
        return bool(self.world.ask(r, Control("runnable")))

    def _on_its_way(self, r: int) -> bool:
        # the size of a server's trace is a round trip on every poll: only a runnable rank counts
        # here, as before
        return self._runnable(r)

    def _rank_alive(self, r: int) -> bool:
        return not self.world.servers[r].closed

    def _signal_stack(self, r: int) -> None:
        self.world.ask(r, Control("stack"))

    def _size(self, r: int, name: str) -> int:
        return int(self.world.ask(r, Control("size", f"rank{r}.{name}")) or 0)

    def _tail(self, r: int, name: str, offset: int) -> str:
        return str(self.world.ask(r, Control("tail", f"rank{r}.{name}", offset)) or "")

    def traces(self) -> dict:
        return {
            r: self.world.ask(r, Control("trace", f"rank{r}.trace")) or () for r in range(self.world_size)
        }
