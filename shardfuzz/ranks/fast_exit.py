"""Exits that skip the interpreter's teardown of a process that has torch loaded.

Tearing down an interpreter with torch imported (its modules, then torch's C++ objects) takes
1.2-1.7 s on a 2-core machine, after all the work is done: every ``shardfuzz`` command paid it,
and so did the forkserver (torch preloaded) when its driver went away, holding the command's
output pipe open meanwhile. Nothing in that teardown is needed: the ranks already leave with
``os._exit`` (:mod:`shardfuzz.ranks.worker`).

* :func:`exit_without_teardown`: what the interpreter does at exit that matters (wait for
  non-daemon threads, run the ``atexit`` handlers, flush stdout and stderr), then ``os._exit``.
  The command line's entry point (:func:`shardfuzz.frontends.cli.entry`) leaves through it.
* In the forkserver only: this module is on its preload list (:func:`shardfuzz.ranks.spawn.context`)
  and, imported from the forkserver's own ``main``, registers an ``atexit`` handler that leaves
  the same way. Imported anywhere else it registers nothing.
"""

from __future__ import annotations

import atexit
import os
import sys
import threading
from types import FrameType
from typing import NoReturn


def exit_without_teardown(code: int) -> NoReturn:
    """Leave the process with ``code`` as a normal exit would, without tearing the interpreter down."""
    main = threading.main_thread()
    for thread in threading.enumerate():
        if thread is not main and not thread.daemon and thread is not threading.current_thread():
            thread.join()  # as the interpreter's shutdown does: their work is not cut short
    atexit._run_exitfuncs()  # logging.shutdown, multiprocessing's finalizers, the user's handlers
    _flush_std_streams()
    os._exit(code)


def _flush_std_streams() -> None:
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):  # a reader that went away (`| head`), a closed stream: as at exit
            pass


def _imported_by_forkserver_main() -> bool:
    """Whether this import runs inside ``multiprocessing.forkserver.main`` (its preload)."""
    frame: FrameType | None = sys._getframe(1)
    while frame is not None:
        if frame.f_code.co_name == "main" and frame.f_globals.get("__name__") == "multiprocessing.forkserver":
            return True
        frame = frame.f_back
    return False


def _forkserver_exit() -> None:
    _flush_std_streams()
    os._exit(0)  # the forkserver leaves when its driver is gone; its children are its own ranks


#: whether this process (the forkserver, and the ranks it forks) leaves through :func:`_forkserver_exit`
IN_FORKSERVER = _imported_by_forkserver_main()
if IN_FORKSERVER:
    # registered last, so run first at exit: the handlers registered before it (multiprocessing's,
    # in a process that starts no Process objects) are skipped with the teardown
    atexit.register(_forkserver_exit)
