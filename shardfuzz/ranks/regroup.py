"""Keep a pool's processes after a rank error: rebuild only their process group.

A rank that raises leaves its peers blocked in a collective, and its group in an unknown state; a
fresh pool for the next example costs each rank a process start and its imports, which on a busy
machine made a campaign that crashes on every other example run at a quarter of the passing rate.
After a :class:`~shardfuzz.protocol.RankFailed`, the pool was already judged (the report is the
raising rank's, as before), so :func:`regroup` sends every rank a
:class:`~shardfuzz.protocol.Regroup`: the ranks that answered destroy their groups, which fails
the collectives of the peers still blocked on them (gloo: "connection closed by peer"); those
answer the task, then regroup too, and every rank joins a fresh world group under a new store
prefix, while the driver goes on (:func:`settle` waits for them before the pool's next task).
Anything else (a rank that does not answer in time, dies, or cannot regroup; a hang; a death)
keeps the old path: the pool is discarded.
"""

from __future__ import annotations

import time
from multiprocessing.connection import wait

from shardfuzz.limits import env_int
from shardfuzz.protocol import ErrorReply, Outcome, RankFailed, Regroup, Regrouped, Reply, UnsupportedReply
from shardfuzz.ranks.pool import Pool, receive

#: how long the ranks still running the task have to answer it once their peers left the group
#: (a blocked collective fails within milliseconds; a rank still computing is not waited for), and
#: how long all have to rejoin; past either the pool is discarded
ANSWER_TIMEOUT_S = 1.0
REGROUP_TIMEOUT_S = 5.0


def regroup(pool: Pool, outcome: Outcome) -> bool:
    """After a rank's own exception, start rebuilding the pool's process group; True when the pool
    is kept (False: discard it). The ranks regroup while the driver reports the finding and draws
    the next example; :func:`settle` (in :func:`~shardfuzz.ranks.pool_cache.get_pool`) waits for their
    answers before the pool's next task. ``SHARDFUZZ_REGROUP=0`` always discards."""
    if not isinstance(outcome, RankFailed) or not pool.alive or not env_int("SHARDFUZZ_REGROUP", 1, 0):
        return False
    if pool.backend != "gloo":  # a blocked NCCL kernel is not failed by a peer's destroy
        return False
    world = getattr(pool, "world", None)  # rank servers (ranks.remote): every rank of their world regroups
    if world is not None:
        return bool(world.start_regroup(pool))
    return send_regroup(pool, pool.generation + 1, answered=not pool.unanswered)


def send_regroup(pool: Pool, generation: int, answered: bool) -> bool:
    """Send every rank of ``pool`` a :class:`Regroup` of ``generation``, to be settled later
    (:func:`settle`); False when a rank's channel is gone."""
    pool.generation = generation
    pool.regrouping = time.monotonic()  # before the messages go: never suspended until settled
    try:
        for c in pool.conns:
            c.send(Regroup(generation, answered=answered))
    except OSError:
        return False
    return True


def settle(pool: Pool, timeout_s: float = REGROUP_TIMEOUT_S) -> bool:
    """Wait for the answers to a :func:`regroup` (at once when there was none); True when every
    rank rejoined in time (False: discard the pool)."""
    if pool.regrouping is None:
        return True
    start, pool.regrouping = pool.regrouping, None
    answering = set(pool.unanswered)  # these answer the task first
    pool.unanswered = set()
    waiting = set(range(pool.world_size))
    while waiting:
        objs = {pool.conns[r]: r for r in waiting}
        objs.update({pool._sentinel(r): r for r in waiting})
        deadline = start + (min(timeout_s, ANSWER_TIMEOUT_S) if answering else timeout_s)
        ready = wait(list(objs), timeout=max(0.0, deadline - time.monotonic()))
        if not ready:
            return False
        for obj in ready:
            r = objs[obj]
            if r not in waiting:
                continue
            got = receive(pool.conns[r])
            if got is None:
                if not pool._rank_alive(r) or obj is pool._sentinel(r):
                    return False
            elif r in answering and isinstance(got, (Reply, UnsupportedReply, ErrorReply)):
                answering.discard(r)
                if getattr(got, "restart", False):
                    return False  # the task left state behind that only fresh ranks undo
            elif isinstance(got, Regrouped) and got.generation == pool.generation:
                waiting.discard(r)
            else:
                return False  # the regroup failed on this rank
    return True
