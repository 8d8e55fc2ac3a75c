"""A rank process's life: start, join the pool's process group, serve tasks, leave.

A worker is a forkserver child (torch preloaded). It joins the pool's process group once, then
serves :class:`~shardfuzz.protocol.Task` messages until told to stop or until its driver goes
away, answering each with one :class:`~shardfuzz.protocol.Reply`,
:class:`~shardfuzz.protocol.UnsupportedReply` or :class:`~shardfuzz.protocol.ErrorReply`. After a
rank error, a :class:`~shardfuzz.protocol.Regroup` makes it leave its groups and join a fresh world
group, so that the process (and its imports) serve the next example.
"""

from __future__ import annotations

import contextlib
import datetime
import faulthandler
import gc
import os
import signal
import sys
import threading
import traceback
import weakref
from collections.abc import Callable
from multiprocessing import forkserver
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed.distributed_c10d as c10d

from shardfuzz.errors import Unsupported
from shardfuzz.protocol import (
    ErrorReply,
    MakeMesh,
    MeshMade,
    RankAnswer,
    Ready,
    Regroup,
    Regrouped,
    StartFailed,
    Stop,
    Task,
    UnsupportedReply,
    Warm,
)
from shardfuzz.ranks.parent_death import set_pdeathsig
from shardfuzz.ranks.task import RankState, run_task, select_device
from shardfuzz.ranks.trace import install

STORE_TIMEOUT_S = 600.0
TIMEOUT_MARKERS = ("Timed out", "timed out", "Timeout")
#: a collective failed because a *peer* went away: a consequence, not the cause
PEER_MARKERS = (
    "Connection closed by peer",
    "Connection reset by peer",
    "Broken pipe",
    "ECONNRESET",
    "SIGABRT",
)


def error_reply(exc: BaseException) -> ErrorReply:
    """The :class:`ErrorReply` for the exception being handled."""
    tb = traceback.format_exc()
    last = tb.strip().splitlines()[-1] if tb.strip() else ""
    return ErrorReply(
        tb,
        type(exc).__name__,
        timed_out=any(m in last for m in TIMEOUT_MARKERS),
        peer_closed=any(m in last for m in PEER_MARKERS),
    )


def answer(state: RankState, task: Task) -> RankAnswer:
    """Run a task and turn whatever happens into one answer (never raises)."""
    try:
        return run_task(state, task)
    except Unsupported as e:
        return UnsupportedReply(e.reason, state.leaks, state.restart, str(e) if str(e) != e.reason else "")
    except BaseException as e:  # noqa: BLE001 (a rank reports everything, SystemExit and KeyboardInterrupt from user code included: the driver decides)
        reply = error_reply(e)
        sys.stderr.flush()
        return reply


def warm(state: RankState, msg: Warm) -> None:
    """Import what the next task will need (a spare pool, while the driver shrinks a failure). An
    error is left for that task to report."""
    try:
        state.target(msg.target_ref)
        state.impl(msg.impl_ref)
    except BaseException:  # noqa: BLE001 (only a warm-up: the task that needs the import reports its error)
        pass


def make_mesh(state: RankState, msg: MakeMesh) -> MeshMade | ErrorReply:
    """Make the case's world group and mesh groups with every other rank of the world."""
    try:
        state.world_group(msg.world_size, msg.timeout_s)
        state.mesh(msg.shape, msg.timeout_s)
        return MeshMade(msg.world_size, msg.shape)
    except BaseException as e:  # noqa: BLE001 (the driver waits for an answer from every rank: a failure is one, and it rebuilds the world)
        return error_reply(e)


def release_forkserver() -> None:
    """Close this rank's copy of its forkserver's alive pipe (multiprocessing hands one to every
    child, and the forkserver exits only once every copy is closed): the forkserver then exits as
    soon as its driver does, and PR_SET_PDEATHSIG kills each rank it started. A suspended rank
    (SIGSTOP: :meth:`shardfuzz.ranks.pool.Pool.suspend`) needs that: its watchdog thread cannot
    run. A rank's own code that starts processes through a forkserver starts a new one, as every
    child of a forkserver does (the copy was never used to reach this one)."""
    fd = getattr(forkserver._forkserver, "_forkserver_alive_fd", None)
    if fd is not None:
        with contextlib.suppress(OSError):
            os.close(fd)
        forkserver._forkserver._forkserver_alive_fd = None  # type: ignore[attr-defined]


def _watchdog(alive_conn: Any) -> None:
    """Exit as soon as the driver's end of ``alive_conn`` closes (driver died or killed us)."""
    try:
        alive_conn.recv()
    except (EOFError, OSError):
        pass
    os._exit(3)


def leave(state: RankState) -> None:
    """Destroy every process group of this rank, and drop the meshes built on them."""
    state.meshes.clear()
    state.worlds.clear()
    state.warm.clear()  # new groups may initialise lazily again
    groups = getattr(getattr(c10d, "_world", None), "pg_map", None) or {}
    left = [weakref.ref(g) for g in groups]
    state.old_groups += left
    if dist.is_initialized():
        dist.destroy_process_group()
    # a gloo group closes its sockets (failing its peers' collectives) only once freed; a reference
    # cycle (a traceback, a DeviceMesh) may still hold one: a full collection (~0.1 s) frees it
    if any(g() is not None for g in left):
        gc.collect()


#: groups of failed examples a rank may still hold (referenced after every rank answered) before
#: the pool is replaced: each keeps its sockets until freed
KEPT_GROUPS = 8


def regroup(state: RankState, msg: Regroup, join: Callable[[str], None]) -> Regrouped | ErrorReply:
    """Leave the old groups and join the world group of generation ``msg.generation``."""
    try:
        if state.restart:
            raise RuntimeError("the failed example left state behind that only fresh ranks undo")
        leave(state)
        state.old_groups = [g for g in state.old_groups if g() is not None]
        if state.old_groups and not (msg.answered and len(state.old_groups) <= KEPT_GROUPS):
            # still open (cached by the implementation, or from torch's C++ side after DTensor
            # code): a peer blocked on it would never return. When every rank had answered, none
            # is blocked, and a few such groups may stay until they are freed
            raise RuntimeError("a process group of the failed example is still referenced")
        join(f"regroup{msg.generation}/")
        return Regrouped(msg.generation)
    except BaseException as e:  # noqa: BLE001 (the driver waits for an answer: a failed regroup is one, and the pool restarts)
        return error_reply(e)


def _join(
    rank: int, world_size: int, backend: str, store_info: tuple, timeout_s: float, debug: bool
) -> Callable[[str], None]:
    """Join the pool's world group; returns how to join again under a store prefix (a regroup)."""
    host, port, prefix = store_info
    # the store waits as long as the groups (the hard cap), never less than STORE_TIMEOUT_S
    wait_s = datetime.timedelta(seconds=max(timeout_s, STORE_TIMEOUT_S))
    store = dist.PrefixStore(prefix, dist.TCPStore(host, port, is_master=False, timeout=wait_s))
    return join_world(store, rank, world_size, backend, timeout_s, debug)


def join_world(
    store: Any, rank: int, world_size: int, backend: str, timeout_s: float, debug: bool
) -> Callable[[str], None]:
    """Set this rank's threads and debug level, join the world group on ``store``, and return how
    to join again under a store prefix (a regroup): a local rank's and a rank server's alike."""
    # torch is loaded already (the forkserver preloads it): the thread count is set on it, and the
    # variable is what this rank's own subprocesses inherit
    os.environ["OMP_NUM_THREADS"] = os.environ.get("SHARDFUZZ_WORKER_THREADS", "1")
    torch.set_num_threads(int(os.environ["OMP_NUM_THREADS"]))
    if debug:  # collective checking (TORCH_DISTRIBUTED_DEBUG=DETAIL): slow, for replays only
        os.environ["TORCH_DISTRIBUTED_DEBUG"] = "DETAIL"
        dist.set_debug_level(dist.DebugLevel.DETAIL)

    def join(generation: str) -> None:
        dist.init_process_group(
            backend,
            store=dist.PrefixStore(generation, store) if generation else store,
            rank=rank,
            world_size=world_size,
            timeout=datetime.timedelta(seconds=timeout_s),
        )

    join("")
    return join


def serve_tasks(
    state: RankState,
    conn: Any,
    join: Callable[[str], None],
    backend: str,
    exit_now: Callable[[int], Any] = os._exit,
) -> None:
    """Answer the driver's messages until it sends Stop; ``exit_now(0)`` when it is gone (a rank
    server's also removes its folder of output and trace: :func:`shardfuzz.ranks.serve.leave`)."""
    while True:
        try:
            msg = conn.recv()
        except (EOFError, OSError):
            exit_now(0)
        if isinstance(msg, Stop):
            break
        if isinstance(msg, Warm):
            warm(state, msg)
            continue
        if isinstance(msg, Regroup):
            conn.send(regroup(state, msg, join))
            continue
        if isinstance(msg, MakeMesh):  # only rank servers get one (shardfuzz.ranks.serve)
            conn.send(make_mesh(state, msg))
            continue
        reply = answer(state, msg)
        try:
            conn.send(reply)
        except Exception as e:  # noqa: BLE001 (an output that does not pickle raises whatever its __reduce__ raises)
            conn.send(ErrorReply(f"could not send outputs back: {e!r}", type(e).__name__))
        if isinstance(reply, ErrorReply) and backend == "gloo":  # NCCL: see recover.regroup
            # after the reply, so the driver hears this rank's own error before its peers'
            # "connection closed": their collectives fail now, not at the gloo timeout
            with contextlib.suppress(Exception):
                leave(state)

    try:
        dist.destroy_process_group()
    except Exception:  # noqa: BLE001 (the rank exits next; a group a dead peer broke raises what its backend raises)
        pass


def freeze_imports() -> None:
    """Put every object this rank holds so far (its imports: torch, Hypothesis, ~240,000 objects,
    alive as long as the rank) out of the garbage collector's sight, so that a full collection
    (:func:`leave`, after every failed example) takes microseconds instead of ~0.15 s. Call it
    before joining: the groups and meshes made later stay collectable, as :func:`leave` needs."""
    gc.freeze()


def capture_output(outdir: str, rank: int) -> None:
    """This rank's stdout and stderr into ``rank<r>.out``/``.err`` in ``outdir``, which the driver
    attaches to reports, and every thread's stack into ``rank<r>.stack`` on SIGUSR1."""
    for fd, name in ((1, "out"), (2, "err")):
        f = os.open(os.path.join(outdir, f"rank{rank}.{name}"), os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        os.dup2(f, fd)
        os.close(f)
    sys.stdout = open(1, "w", buffering=1, closefd=False)
    sys.stderr = open(2, "w", buffering=1, closefd=False)
    stack_file = open(os.path.join(outdir, f"rank{rank}.stack"), "w")
    faulthandler.enable(file=sys.stderr, all_threads=True)
    faulthandler.register(signal.SIGUSR1, file=stack_file, all_threads=True, chain=False)


def worker_main(
    rank: int,
    world_size: int,
    backend: str,
    store_info: tuple,
    conn: Any,
    alive_conn: Any,
    outdir: str,
    timeout_s: float,
    device: str = "cpu",
    debug: bool = False,
) -> None:
    """Entry point of a worker process."""
    freeze_imports()
    try:
        set_pdeathsig()
    except OSError:  # a rank that would outlive a killed driver does not start; the driver hears why
        conn.send(StartFailed(traceback.format_exc()))
        os._exit(1)
    release_forkserver()
    if os.getppid() == 1:  # the forkserver (our parent) died before PDEATHSIG was armed
        os._exit(3)
    threading.Thread(target=_watchdog, args=(alive_conn,), daemon=True).start()
    capture_output(outdir, rank)
    try:
        device_obj = select_device(backend, device, rank)  # before joining: nccl binds the device
        join = _join(rank, world_size, backend, store_info, timeout_s, debug)
        install(os.path.join(outdir, f"rank{rank}.trace"))  # before any target is imported
        state = RankState(rank, world_size, device_obj, timeout_s)
    except BaseException:  # noqa: BLE001 (a rank that cannot start says why to the driver, whatever it was, then exits)
        conn.send(StartFailed(traceback.format_exc()))
        os._exit(1)
    conn.send(Ready(os.getpid()))
    serve_tasks(state, conn, join, backend)
    os._exit(0)
