"""The driver's pools: one warm :class:`~shardfuzz.ranks.pool.Pool` per (backend, world size, device,
debug), least recently used ones stopped beyond a rank budget, idle ones suspended, and *spares*.

A pool unused for :data:`SUSPEND_AFTER_S` is suspended (:meth:`~shardfuzz.ranks.pool.Pool.suspend`:
its idle ranks' gloo loop threads poll every 10 ms) by a background thread, and continued when it
is handed out again.

A failure that is not a rank's own exception (a death, a hang) kills its pool, and Hypothesis then
shrinks that failure with many more failing examples in a row: starting fresh ranks, and importing
the target in them, on the critical path of each made failing runs 30-100x slower than passing
ones. So a pool discarded after a failure is replaced in the background by a spare of the same
kind, which also imports the target and implementation the failing example used
(:class:`~shardfuzz.protocol.Warm`); the next :func:`get_pool` takes it (waiting for it if it is
still starting). After a rank's own exception the pool is kept and regrouped instead
(:mod:`shardfuzz.ranks.regroup`): :func:`get_pool` waits for the regroup to settle before handing it out.
"""

from __future__ import annotations

import atexit
import collections
import contextlib
import threading
import time

from shardfuzz.errors import InfrastructureError
from shardfuzz.limits import env_int
from shardfuzz.protocol import Task, Warm
from shardfuzz.ranks.pool import Pool, suspend_idle
from shardfuzz.ranks.regroup import settle
from shardfuzz.ranks.remote import RemotePool, RemoteWorld

_lock = threading.Lock()
_pools: collections.OrderedDict[tuple, Pool] = collections.OrderedDict()
#: ready spares, and the spares being started (an event set when the start is over)
_spares: dict[tuple, Pool] = {}
_starting: dict[tuple, threading.Event] = {}
_closing = False
#: a spare that is still starting is waited for at most this long (a fresh start is no faster)
SPARE_WAIT_S = 60.0
#: a pool unused this long is suspended. Not at once: a stop and a continue wake every thread of
#: every rank, which costs more than a second of the loop threads' polling; suspended as soon as
#: another pool was taken, a search over world sizes 1-4 that changes pool every example
#: (benchmarks/bench_tp.py) ran 12% slower (38.9 vs 44.2 examples/s)
SUSPEND_AFTER_S = 1.0
_suspender: threading.Thread | None = None


#: the world of rank servers that torchrun started (``--ranks``), kept for the driver process
_remote: RemoteWorld | None = None


def use_remote(world: RemoteWorld | None) -> RemoteWorld | None:
    """Keep ``world`` as the driver's world of rank servers (None: none); returns the one it
    replaces (whose caller closes it)."""
    global _remote
    old, _remote = _remote, world
    return old


def remote_world() -> RemoteWorld | None:
    return _remote


def connect_rank_servers(
    bind: tuple[str, int],
    secret: bytes,
    backend: str,
    device: str,
    debug: bool,
    timeout_s: float,
    wait_s: float | None = None,
) -> RemoteWorld:
    """The world of rank servers listening at ``bind`` (waited for once per driver process, for at
    most ``wait_s`` seconds beside ``$SHARDFUZZ_RANKS_WAIT``), and every pool taken from it from now on."""
    with _lock:
        world = _remote
    if world is not None and world.bind == bind:
        return world
    if world is not None:
        world.close()
    world = RemoteWorld(bind, secret, backend, device, debug=debug, wait_s=wait_s)
    try:
        world.start(timeout_s)
    except BaseException:  # the port and what connected are let go, whatever stopped the start
        world.close()
        raise
    use_remote(world)
    return world


def max_pool_ranks() -> int:
    return env_int("SHARDFUZZ_MAX_POOL_RANKS", 12, 1)


def get_pool(
    backend: str,
    world_size: int,
    timeout_s: float,
    *,
    device: str = "cpu",
    debug: bool = False,
    world: RemoteWorld | None = None,
) -> Pool:
    """A warm pool for (backend, world size), started if needed (a spare is used when there is one).
    Idle pools beyond ``SHARDFUZZ_MAX_POOL_RANKS`` ranks in all (default 12) are stopped, least
    recently used first. With ``world`` (rank servers), its first ``world_size`` ranks."""
    if world is not None:
        if (backend, device, debug) != (world.backend, world.device, world.debug):
            raise InfrastructureError(
                f"backend={backend!r} device={device!r} on rank servers joined with "
                f"backend={world.backend!r} device={world.device!r}"
            )
        return world.pool(world_size)
    key = (backend, world_size, device, debug)
    starting = _starting.get(key)
    if starting is not None and key not in _pools:
        starting.wait(SPARE_WAIT_S)
    with _lock:
        pool = _pools.pop(key, None)
        if pool is not None:
            pool.touch()  # in use from now on: not suspended while a regroup settles
        if pool is not None and not (pool.alive and settle(pool)):  # settle: a regroup's answers
            pool.kill()
            pool = None
        if pool is None:
            spare = _spares.pop(key, None)
            if spare is not None and spare.alive:
                pool = spare
            elif spare is not None:
                spare.kill()
        if pool is None:
            pool = Pool(backend, world_size, timeout_s, device=device, debug=debug).start()
        _pools[key] = pool
        while len(_pools) > 1 and sum(p.world_size for p in _pools.values()) > max_pool_ranks():
            _, old = _pools.popitem(last=False)
            old.stop()
        pool.touch()  # handed out: in use from now on (its task resumes it)
        _start_suspender()
        return pool


def _start_suspender() -> None:
    """Start the thread that suspends idle pools, once per process (with ``_lock`` held)."""
    global _suspender
    if _suspender is None and suspend_idle():
        _suspender = threading.Thread(target=_suspend_idle_pools, name="shardfuzz-suspender", daemon=True)
        _suspender.start()


def _suspend_idle_pools() -> None:
    """Suspend every pool unused for :data:`SUSPEND_AFTER_S`, checking twice as often (spares are
    left running: they import their target meanwhile)."""
    while True:
        time.sleep(SUSPEND_AFTER_S / 2)
        with _lock:
            pools = [] if _closing else list(_pools.values())
        for pool in pools:
            # refuses a pool used within SUSPEND_AFTER_S, one with a task in flight, one stopped
            pool.suspend(SUSPEND_AFTER_S)


def discard_pool(pool: Pool, *, spare_for: Task | None = None) -> None:
    """Kill a pool after a failure; the next :func:`get_pool` starts a fresh one. With
    ``spare_for`` (the task that failed), a spare is started in the background and imports that
    task's target and implementation. A pool of rank servers rebuilds their whole world."""
    if isinstance(pool, RemotePool):
        pool.world.rebuild()
        return
    with _lock:
        for k, v in list(_pools.items()):
            if v is pool:
                del _pools[k]
    key = (pool.backend, pool.world_size, pool.device, pool.debug)
    timeout_s = pool.timeout_s
    pool.kill()
    if spare_for is not None and env_int("SHARDFUZZ_SPARE_POOLS", 1, 0):
        start_spare(key, timeout_s, Warm(spare_for.target_ref, spare_for.impl.ref))


def start_spare(key: tuple, timeout_s: float, warm: Warm | None = None) -> None:
    """Start a spare pool for ``key`` in a background thread, unless one exists or is starting."""
    with _lock:
        spare_ranks = sum(p.world_size for p in _spares.values())
        if _closing or key in _spares or key in _starting or spare_ranks + key[1] > max_pool_ranks():
            return
        done = _starting[key] = threading.Event()

    def start() -> None:
        backend, world_size, device, debug = key
        pool: Pool | None = Pool(backend, world_size, timeout_s, device=device, debug=debug)
        try:
            assert pool is not None
            pool.start()
            if warm is not None:
                pool.send_all(warm)
        except Exception:  # noqa: BLE001 (a background thread: what it raised would be lost; the next get_pool starts one itself and reports it)
            with contextlib.suppress(Exception):
                pool.kill()  # type: ignore[union-attr]
            pool = None
        with _lock:
            del _starting[key]
            if pool is not None and (_closing or key in _spares):
                pool.kill()
            elif pool is not None:
                _spares[key] = pool
        done.set()

    threading.Thread(target=start, name=f"shardfuzz-spare-{key}", daemon=True).start()


def shutdown() -> None:
    """Stop every pool and spare (registered with atexit); a spare still starting is killed when
    its start ends."""
    global _closing
    with _lock:
        _closing = True
        pools = list(_pools.values()) + list(_spares.values())
        _pools.clear()
        _spares.clear()
        starting = list(_starting.values())
    for p in pools:
        p.stop()
    world = use_remote(None)
    if world is not None:  # its servers exit, and torchrun ends
        world.close()
    for event in starting:
        event.wait(5)
    with _lock:
        _closing = False


atexit.register(shutdown)
