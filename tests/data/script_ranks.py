"""Ranks of a script as torchrun starts them, without torchrun's agent (tests/conftest.py ScriptRanks).

``python script_ranks.py N SCRIPT ARG...`` imports torch once, then forks N ranks, each with the
environment torchrun gives a worker of ``torchrun --standalone --nproc-per-node=N`` (RANK,
LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT, GROUP_RANK, ROLE_RANK), runs
SCRIPT as ``__main__`` in each with ``sys.argv = [SCRIPT, ARG...]``, and stops the others with
SIGTERM once one fails, as torchrun's agent does. It exits 1 when any rank failed.

Why: a torchrun launch costs its agent's own interpreter and a fresh import of torch in every rank
(3.5 CPU-s for 2 ranks here); this costs one import (1.2 CPU-s). What the suite proves with it is
what a script does, not torchrun: a standalone script still runs under real torchrun in the ci
suite (the ``torch_scan_negative_dim`` reproducer), and the rank servers under torchrun's agent on
two nodes (tests/test_rank_servers.py). Nothing of shardfuzz, Hypothesis or pytest is imported
here: the scripts' check that they import none of them holds as under torchrun.

``python script_ranks.py --serve SOCKET`` imports torch once for a whole test session: it answers
each request on the Unix socket (a JSON line: ``n``, ``argv``, ``env``, ``cwd``, ``stdout``,
``stderr`` paths) by forking a launcher that does what the command above does, in that
environment and folder, with its output in those files; it replies the launcher's pid, then its
exit code. Each launch saves an interpreter and an import of torch (about 2 CPU-s).
"""

import ctypes
import json
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


def _die_with_parent() -> None:
    """Never left behind: killed with the process that started this one."""
    ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)


def launch(n: int, argv: list[str]) -> int:
    """Fork ``n`` ranks of ``argv`` and wait for them; 1 when any failed."""
    with socket.socket() as s:  # a free port on localhost, as --standalone picks one
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    ranks = []
    for rank in range(n):
        pid = os.fork()
        if pid == 0:
            _die_with_parent()  # a rank dies with its launcher (killed at a test's timeout)
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


def serve(path: str) -> None:
    """Answer launch requests on the Unix socket ``path``, one at a time, until killed. The
    request's environment is the launcher's and its ranks' ``os.environ``; what Python and torch
    read at start (``PYTHONPATH``, ``OMP_NUM_THREADS``) is this server's, read once."""
    _die_with_parent()
    with socket.socket(socket.AF_UNIX) as server:
        server.bind(path + ".new")
        server.listen()
        os.rename(path + ".new", path)  # there once it accepts: a client never meets a refusal
        while True:
            conn, _ = server.accept()
            try:
                _answer(server, conn)
            except OSError:  # the client gave up (its timeout killed the launcher): next request
                pass
            finally:
                conn.close()


def _answer(server: socket.socket, conn: socket.socket) -> None:
    """One request: fork its launcher, reply the launcher's pid, then its exit code."""
    stream = conn.makefile("rw")
    req = json.loads(stream.readline())
    pid = os.fork()
    if pid == 0:
        _launcher(req, server, conn)
    try:
        stream.write(f"{pid}\n")
        stream.flush()
    finally:
        _, status = os.waitpid(pid, 0)  # reaped whatever the client does
    stream.write(f"{os.waitstatus_to_exitcode(status)}\n")
    stream.flush()
    stream.close()


def _launcher(req: dict, *inherited: socket.socket) -> None:
    """The forked launcher of one request: its environment, folder and output files, then
    :func:`launch`; never returns into the server's loop."""
    code = 1
    try:
        _die_with_parent()
        for sock in inherited:  # the ranks hold no end of the server's sockets
            sock.close()
        os.environ.clear()
        os.environ.update(req["env"])
        os.chdir(req["cwd"])
        for fd, name in ((1, "stdout"), (2, "stderr")):
            out = os.open(req[name], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
            os.dup2(out, fd)
            os.close(out)
        code = launch(req["n"], req["argv"])
    except BaseException:  # noqa: BLE001 (a launcher that fails in any way says why and exits 1)
        traceback.print_exc()
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)


if __name__ == "__main__":
    if sys.argv[1] == "--serve":
        serve(sys.argv[2])
    else:
        sys.exit(launch(int(sys.argv[1]), sys.argv[2:]))
