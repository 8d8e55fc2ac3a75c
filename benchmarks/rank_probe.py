"""Rank-side timers for ``bench_tp.py --breakdown``: imported into each rank of a warm pool by a
:class:`~shardfuzz.protocol.Warm` message (the rank imports a target's module ahead of a task; this
module is not a target, so the import is all that happens), it wraps the stages of
:func:`shardfuzz.ranks.task.run_task` with ``perf_counter`` and keeps the totals in a JSON file per rank
(``probe-<pid>.json`` in the pool's output folder, next to the rank's trace file), rewritten
after every example.
"""

from __future__ import annotations

import collections
import functools
import json
import os
import time

import shardfuzz.protocol as protocol
import shardfuzz.ranks.task as rank
import shardfuzz.ranks.trace as collectives

TOTALS: collections.Counter = collections.Counter()
#: the pool's output folder: where this rank's trace file is (the worker opened it at its start)
OUT = os.path.join(
    os.path.dirname(os.readlink(f"/proc/self/fd/{collectives.TRACER.fd}")), f"probe-{os.getpid()}.json"
)


def timed(stage, fn):
    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        t0 = time.perf_counter()
        try:
            return fn(*args, **kwargs)
        finally:
            TOTALS[stage] += time.perf_counter() - t0

    return wrapper


if not getattr(rank, "_probed", False):
    rank._probed = True
    rank.RankState.snapshot = timed("state reset and leak checks", rank.RankState.snapshot)
    rank.RankState.clean_up = timed("state reset and leak checks", rank.RankState.clean_up)
    # the collective trace: each record (its metadata and the trace file's line)
    collectives.TRACER.record = timed("trace", collectives.TRACER.record)
    rank.encode = timed("encode outputs", protocol.encode)
    inner_run = rank._run

    def _run(*args, **kwargs):  # whatever the engine's _run takes (rank servers added the world group)
        TOTALS["examples"] += 1
        t0 = time.perf_counter()
        try:
            return inner_run(*args, **kwargs)
        finally:
            TOTALS["inputs + implementation (incl. trace, encode)"] += time.perf_counter() - t0

    rank._run = _run
    inner_task = rank.run_task

    def run_task(state, task):
        t0 = time.perf_counter()
        try:
            return inner_task(state, task)
        finally:
            TOTALS["run_task"] += time.perf_counter() - t0
            with open(OUT, "w") as f:
                json.dump(dict(TOTALS), f)

    rank.run_task = run_task
    import shardfuzz.ranks.worker as worker

    worker.run_task = run_task
