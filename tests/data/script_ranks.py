"""Ranks of a script as torchrun starts them, for tests/test_standalone.py, without torchrun's agent.

``python script_ranks.py N SCRIPT ARG...`` imports torch once, then forks N ranks, each with the
environment torchrun gives a worker of ``torchrun --standalone --nproc-per-node=N`` (RANK,
LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT, GROUP_RANK, ROLE_RANK), runs
SCRIPT as ``__main__`` in each with ``sys.argv = [SCRIPT, ARG...]``, and stops the others with
SIGTERM once one fails, as torchrun's agent does. It exits 1 when any rank failed.

Why: a torchrun launch costs its agent's own interpreter and a fresh import of torch in every rank
(3.5 CPU-s for 2 ranks here); this costs one import (1.2 CPU-s). What the suite proves with it is
what a script does, not torchrun: a standalone script and a ``shardfuzz repro`` script still run
under real torchrun in the ci suite (the ``torch_scan_negative_dim`` reproducer and
tests/test_failures.py::test_repro_script_runs_under_torchrun). Nothing of shardfuzz, Hypothesis
or pytest is imported here: the scripts' check that they import none of them holds as under torchrun.
"""

import ctypes
import os
import runpy
import signal
import socket
import sys
import time
import traceback

import torch  # imported once, before the forks: the point of this launcher
import torch.distributed
import torch.distributed.tensor  # noqa: F401 (the DTensor scripts' import, also once)

PR_SET_PDEATHSIG = 1  # linux/prctl.h

#: how long the other ranks get after SIGTERM before SIGKILL (torchrun's agent waits 30 s)
GRACE = 30.0


def rank_main(rank: int, n: int, port: int, argv: list[str]) -> int:
    os.environ.update(
        RANK=str(rank), LOCAL_RANK=str(rank), GROUP_RANK="0", ROLE_RANK=str(rank),
        WORLD_SIZE=str(n), LOCAL_WORLD_SIZE=str(n), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port),
    )  # fmt: skip
    sys.argv = list(argv)
    try:
        runpy.run_path(argv[0], run_name="__main__")
    except SystemExit as e:
        return e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
    except BaseException:  # noqa: BLE001 (as Python's own top level: any exception is the rank's failure, printed)
        traceback.print_exc()
        return 1
    return 0


def main() -> int:
    n, argv = int(sys.argv[1]), sys.argv[2:]
    with socket.socket() as s:  # a free port on localhost, as --standalone picks one
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    ranks = []
    for rank in range(n):
        pid = os.fork()
        if pid == 0:
            # a rank dies with this launcher (killed at a test's timeout): never left behind
            ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
            code = rank_main(rank, n, port, argv)
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(code)
        ranks.append(pid)
    codes: dict[int, int] = {}
    deadline = None
    while len(codes) < n:
        pid, status = os.waitpid(-1, os.WNOHANG if deadline else 0)
        if pid == 0:  # the others, stopped: killed once the grace is over
            if time.monotonic() > deadline:
                for other in set(ranks) - set(codes):
                    os.kill(other, signal.SIGKILL)
                deadline = float("inf")
            time.sleep(0.05)
            continue
        codes[pid] = os.waitstatus_to_exitcode(status)
        if codes[pid] != 0 and deadline is None:  # the first failure stops the rest
            for other in set(ranks) - set(codes):
                os.kill(other, signal.SIGTERM)
            deadline = time.monotonic() + GRACE
    print(f"script_ranks: exit codes {[codes[p] for p in ranks]}", file=sys.stderr)
    return 1 if any(codes.values()) else 0


if __name__ == "__main__":
    sys.exit(main())
