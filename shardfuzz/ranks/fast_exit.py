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
  and, imported by that preload, registers an ``atexit`` handler that leaves the same way (in the
  forkserver's own pid only). Imported anywhere else it registers nothing.
"""

from __future__ import annotations

import atexit
import gc
import io
import os
import sys
import threading
from types import FrameType
from typing import NoReturn


def exit_without_teardown(code: int) -> NoReturn:
    """Leave the process with ``code`` as a normal exit would, without tearing the interpreter down:
    the steps of the interpreter's own finalization that matter, in its order."""
    # what finalization calls first: the threading module's exit callbacks (an idle executor's
    # workers are woken there: concurrent.futures), then a join of every non-daemon thread, again
    # until none is left (a thread may start another)
    threading._shutdown()  # type: ignore[attr-defined]
    atexit._run_exitfuncs()  # logging.shutdown, multiprocessing's finalizers, the user's handlers
    _flush_open_files()
    _flush_std_streams()
    os._exit(code)


def _flush_open_files() -> None:
    """Flush every buffered file still open, as their finalizers would at teardown (a file a
    target's code opened at module level and never closed keeps its last lines)."""
    kinds = (io.BufferedWriter, io.BufferedRandom, io.TextIOWrapper)
    for obj in gc.get_objects():
        if type(obj) in kinds:  # by type, not isinstance: some module objects warn when asked
            try:
                if not obj.closed:
                    obj.flush()
            except (OSError, ValueError):  # a file that cannot take its buffer: as its finalizer
                pass


def _flush_std_streams() -> None:
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):  # a reader that went away (`| head`), a closed stream: as at exit
            pass


def _imported_by_forkserver_preload() -> bool:
    """Whether this import is the preload of ``multiprocessing.forkserver.main`` itself: the first
    frame above the import machinery is that function (not a process it forked, whose stack
    still holds it further up)."""
    frame: FrameType | None = sys._getframe(2)  # above this module's own top-level code
    while frame is not None and frame.f_code.co_filename.startswith("<frozen importlib"):
        frame = frame.f_back
    return (
        frame is not None
        and frame.f_code.co_name == "main"
        and frame.f_globals.get("__name__") == "multiprocessing.forkserver"
    )


#: the forkserver's pid: a process it forks inherits the handler, which does nothing there
_FORKSERVER_PID = os.getpid()


def _forkserver_exit() -> None:
    if os.getpid() != _FORKSERVER_PID:
        return  # a forked child (a rank leaves with os._exit anyway): its own exit, untouched
    _flush_std_streams()
    # the forkserver leaves when its driver is gone; nothing reads its exit status
    # (multiprocessing's forkserver client never waits for it), so it is 0
    os._exit(0)


#: whether this process is shardfuzz's forkserver (or was forked by it): the forkserver leaves
#: through :func:`_forkserver_exit`
IN_FORKSERVER = _imported_by_forkserver_preload()
if IN_FORKSERVER:
    # registered last, so run first at exit: the handlers registered before it (multiprocessing's,
    # in a process that starts no Process objects) are skipped with the teardown
    atexit.register(_forkserver_exit)
