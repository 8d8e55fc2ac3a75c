"""Die with the parent process, however it dies (Linux ``PR_SET_PDEATHSIG``): what the ranks, the
torchrun-started rank servers and the jobs of ``shardfuzz fuzz --jobs`` call first, so that none
outlives its driver. Its own module, without torch: the jobs' command line imports it before
torch, and :mod:`shardfuzz.ranks.fast_exit` must be imported by the forkserver's preload alone."""

from __future__ import annotations

import ctypes
import os
import signal
import sys

#: prctl(2)'s option: the signal this process gets when its parent dies
PR_SET_PDEATHSIG = 1


def set_pdeathsig() -> None:
    """Be killed (SIGKILL) when the parent process dies, however it dies (Linux only: macOS has no
    PDEATHSIG, and a rank's watchdog thread alone ends it there). A failed ``prctl`` raises: a rank
    or job that silently outlived its driver is the process left behind it was meant to prevent."""
    if sys.platform != "linux":
        return
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"prctl(PR_SET_PDEATHSIG, SIGKILL) failed: {os.strerror(err)}")
