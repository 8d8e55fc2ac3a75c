"""A rank server: one rank of a torchrun world, serving a shardfuzz driver's tasks.

Start one per rank, on every node, as PyTorch jobs already start::

    torchrun --nnodes 2 --nproc-per-node 8 --rdzv-backend c10d --rdzv-endpoint HOST:29400 \\
        --max-restarts 100 -m shardfuzz.ranks.serve --driver DRIVER_HOST:PORT

Each process connects to the driver (``shardfuzz fuzz TARGET --ranks DRIVER_HOST:PORT``) on two
channels, proving the shared secret both ways (:mod:`shardfuzz.ranks.secret`), waits for the
driver's :class:`~shardfuzz.protocol.ServeConfig`, joins torchrun's world with that backend, and
then serves tasks exactly as a local rank does (:func:`shardfuzz.ranks.worker.serve_tasks`: the same
task code, trace, leak checks and answers). A case of ``w`` ranks runs on the first ``w`` ranks of
the world; every rank makes each case's groups (:class:`~shardfuzz.protocol.MakeMesh`).

The server listens on nothing: it connects out. Its control channel answers the driver's
questions a local pool answers from ``/proc`` and files (CPU time, output, stacks, the trace)
from a thread, so it works while the main thread is blocked in a collective. When the driver goes
away (either channel closes) the server exits with 0, so torchrun ends the job and nothing is left;
when the driver rebuilds the world (after a rank died or hung) every server exits with 1, and
torchrun's ``--max-restarts`` starts a fresh world that connects again.
"""

from __future__ import annotations

import argparse
import datetime
import os
import shutil
import signal
import socket
import sys
import tempfile
import threading
import time
import traceback
from typing import Any, NoReturn

import torch.distributed as dist

from shardfuzz.errors import InfrastructureError, InvalidArgument
from shardfuzz.protocol import Control, Hello, Ready, ServeConfig, StartFailed
from shardfuzz.ranks.parent_death import set_pdeathsig
from shardfuzz.ranks.pool import read_tail
from shardfuzz.ranks.secret import Refused, connect, load_secret
from shardfuzz.ranks.spawn import cpu_seconds, runnable
from shardfuzz.ranks.task import RankState, select_device
from shardfuzz.ranks.trace import install, read_trace
from shardfuzz.ranks.worker import (
    STORE_TIMEOUT_S,
    capture_output,
    freeze_imports,
    join_world,
    serve_tasks,
)

#: exit code of a server the driver sent away to rebuild the world (torchrun restarts it)
REBUILD_EXIT = 1
USAGE_EXIT = 2
TORCHRUN_VARS = ("RANK", "WORLD_SIZE", "LOCAL_RANK")


def parse_address(text: str, name: str = "--driver") -> tuple[str, int]:
    """``HOST:PORT`` (``[v6]:PORT`` too) as a socket address; InvalidArgument otherwise."""
    host, sep, port = text.rpartition(":")
    host = host.strip("[]")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise InvalidArgument(f"{name}={text!r}; expected HOST:PORT, e.g. 10.0.0.5:29600")
    return host, int(port)


def _answer(msg: Control, outdir: str) -> Any:
    path = os.path.join(outdir, msg.name)
    if msg.what == "cpu":
        return cpu_seconds(os.getpid())
    if msg.what == "runnable":
        return runnable(os.getpid())
    if msg.what == "size":
        return os.path.getsize(path) if os.path.exists(path) else 0
    if msg.what == "tail":
        return read_tail(path, msg.offset)
    if msg.what == "stack":  # faulthandler's handler writes every thread's stack to the stack file
        os.kill(os.getpid(), signal.SIGUSR1)
        return None
    if msg.what == "trace":
        return read_trace(path)
    if msg.what == "exit":
        sys.stderr.flush()
        leave(msg.offset, outdir)
    raise ValueError(f"unknown control question {msg.what!r}")


def _control_loop(conn: Any, outdir: str) -> None:
    """Answer the driver's questions about this process until it goes away."""
    while True:
        try:
            msg = conn.recv()
        except (EOFError, OSError):
            leave(0, outdir)  # the driver is gone: leave, so that torchrun ends the job
        try:
            conn.send(reply(msg, outdir))
        except (EOFError, OSError):
            leave(0, outdir)


def leave(code: int, outdir: str) -> NoReturn:
    """Exit with ``code`` now, without Python's teardown (a thread may be inside a collective),
    first removing this server's folder of output, stacks and trace: only the driver reads it, and
    the driver is gone or sent this server away (each torchrun campaign left one per rank in /tmp)."""
    shutil.rmtree(outdir, ignore_errors=True)
    os._exit(code)


def reply(msg: Control, outdir: str) -> tuple[int, Any]:
    """The answer to one question, numbered as it was: None for one this process cannot answer."""
    try:
        return msg.seq, _answer(msg, outdir)
    except Exception as e:  # noqa: BLE001 (a question this process cannot answer, whatever the reason, is answered with None: the control thread must live on)
        print(f"shardfuzz.ranks.serve: could not answer {msg!r}: {e!r}", file=sys.stderr)
        return msg.seq, None


def _join_torchrun(rank: int, world_size: int, backend: str, timeout_s: float, debug: bool) -> Any:
    """Join torchrun's world group on its store; returns how to join again under a prefix (a
    regroup), as a local rank does (:func:`shardfuzz.ranks.worker.join_world`)."""
    if backend == "nccl":  # a collective stuck past the group's timeout (the driver's hard cap)
        # tears the process down (torch's watchdog), even if the driver's word never comes
        os.environ.setdefault("TORCH_NCCL_ASYNC_ERROR_HANDLING", "3")
    wait = datetime.timedelta(seconds=max(timeout_s, STORE_TIMEOUT_S))
    store, _, _ = next(dist.rendezvous("env://", timeout=wait))  # torchrun's (MASTER_ADDR/PORT)
    # this restart of the world gets keys of its own on the agents' store
    base = dist.PrefixStore(f"shardfuzz/{os.environ.get('TORCHELASTIC_RESTART_COUNT', '0')}/", store)
    return join_world(base, rank, world_size, backend, timeout_s, debug)


def _connect_both(address: tuple[str, int], secret: bytes, hello: dict, wait_s: float) -> tuple[Any, Any]:
    """The task and control channels, retried until ``wait_s`` (the driver may start later)."""
    deadline = time.monotonic() + wait_s
    while True:
        try:
            conns = []
            for channel in ("task", "control"):
                conn = connect(address, secret, max(1.0, deadline - time.monotonic()))
                conn.send(Hello(channel, **hello))
                conns.append(conn)
            return conns[0], conns[1]
        except Refused:
            raise
        except OSError as e:  # not listening yet, or gone: try again until the wait is over
            if time.monotonic() >= deadline:
                raise InfrastructureError(
                    f"no shardfuzz driver answered at {address[0]}:{address[1]} within {wait_s:.0f} s "
                    f"({e}); start it with --ranks {address[0]}:{address[1]}"
                ) from e
            time.sleep(0.5)


def serve(address: tuple[str, int], secret: bytes, wait_s: float) -> None:
    """Connect, join, serve; never returns (the process exits)."""
    freeze_imports()
    set_pdeathsig()  # its torchrun agent killed: this rank goes too, and the driver sees a death

    rank, world_size, local_rank = (int(os.environ[v]) for v in TORCHRUN_VARS)
    hello = dict(
        rank=rank, world_size=world_size, local_rank=local_rank, host=socket.gethostname(), pid=os.getpid()
    )
    task_conn, control_conn = _connect_both(address, secret, hello, wait_s)
    try:
        config = task_conn.recv()
    except (EOFError, OSError):
        os._exit(0)  # the driver left before the world was complete
    if not isinstance(config, ServeConfig):
        raise InfrastructureError(f"the driver sent {type(config).__name__} first; expected ServeConfig")
    outdir = tempfile.mkdtemp(prefix=f"shardfuzz-serve-rank{rank}-")
    capture_output(outdir, rank)  # read by the driver over the control channel
    threading.Thread(target=_control_loop, args=(control_conn, outdir), daemon=True).start()
    try:
        device = select_device(config.backend, config.device, local_rank)
        join = _join_torchrun(rank, world_size, config.backend, config.timeout_s, config.debug)
        install(os.path.join(outdir, f"rank{rank}.trace"))
        state = RankState(rank, world_size, device, config.timeout_s)
    except BaseException:  # noqa: BLE001 (a server that cannot join says why to the driver, whatever it was, then exits)
        task_conn.send(StartFailed(traceback.format_exc()))
        leave(1, outdir)
    task_conn.send(Ready(os.getpid()))
    serve_tasks(state, task_conn, join, config.backend, exit_now=lambda code: leave(code, outdir))
    leave(0, outdir)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m shardfuzz.ranks.serve",
        description="One rank of a torchrun world serving a shardfuzz driver (start it with torchrun).",
    )
    parser.add_argument(
        "--driver", required=True, metavar="HOST:PORT", help="where the driver listens (--ranks)"
    )
    parser.add_argument(
        "--secret-file",
        default=None,
        help="a file only you can read holding the secret (default: $SHARDFUZZ_SECRET)",
    )
    parser.add_argument(
        "--wait", type=float, default=300.0, metavar="SECONDS", help="how long to retry reaching the driver"
    )
    args = parser.parse_args(argv)
    missing = [v for v in TORCHRUN_VARS if v not in os.environ]
    try:
        if missing:
            raise InvalidArgument(
                f"{', '.join(missing)} not set: start the server with torchrun "
                f"(torchrun --nproc-per-node N -m shardfuzz.ranks.serve --driver HOST:PORT)"
            )
        address = parse_address(args.driver)
        secret = load_secret(args.secret_file)
        serve(address, secret, args.wait)
    except (InvalidArgument, InfrastructureError) as e:
        print(f"shardfuzz.ranks.serve (rank {os.environ.get('RANK', '?')}): {e}", file=sys.stderr)
        return USAGE_EXIT
    return 0


if __name__ == "__main__":
    sys.exit(main())
