"""Starting rank processes: the forkserver with torch preloaded, the driver's rendezvous store,
and no re-import of the driver's ``__main__``.

* Workers are forkserver children of a server that has torch preloaded, so a (re)start costs
  tens of milliseconds, not the ~2 s of ``import torch`` (plain fork is unsafe after the driver used
  OpenMP, and a child of a process holding a process group cannot init its own).
* The driver owns the rendezvous: one ``TCPStore`` on port 0 per driver process, a fresh key
  prefix per pool start. No fixed or probed port, so ``pytest -n 2`` cannot race.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

_ctx: Any = None
_store: Any = None


def context() -> Any:
    global _ctx
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


def driver_store() -> Any:
    global _store
    if _store is None:
        import datetime

        import torch.distributed as dist

        _store = dist.TCPStore(
            "127.0.0.1", 0, is_master=True, wait_for_workers=False, timeout=datetime.timedelta(seconds=60)
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
