"""The floor under every rank: what one gloo collective costs on this machine, by world size.

``--calls`` all-reduces of a 64-element float32 tensor on 1..4 plain ranks (``torch.distributed``
with gloo on the loopback, no shardfuzz), each world started fresh and timed after a barrier. It
prints the all-reduces per second of each world as a ratio to 2 ranks measured in the same run,
and where the ranks' CPU went by OS thread: the calling thread, gloo's worker threads
(``pt_gloo_runloop``) and gloo's TCP event loop (``gloo_tcp_loop``).

With more ranks than cores, gloo's event loop busy-polls: a message that arrives before its
receive is posted stays in the socket, epoll (level-triggered) reports it again at once, and the
loop spins until the rank's own thread posts the receive, on a core that thread is waiting for
(pytorch/gloo#246, open since 2019). On the 2-core dev machine [2026-12-06, load 1-2] 4 ranks ran
about 190 all-reduces a second against 725-1,760 on 2 ranks, and 70-80% of the ranks' CPU was in the
loops, on 2 ranks too (a rank has three busy threads for 2 cores). shardfuzz's 4-rank cases pay
it. Tried and not kept: nice 19 on the loop threads (2.5x the rate on an idle machine, a fifth of
it beside two busy loops: a starved loop); SCHED_IDLE (worse under load); a short EEVDF slice on
the loops or on the other threads (no gain); each rank pinned to one core (1.55x on this
benchmark's 4 ranks, but test_targets.py and test_verified.py took 3.7% less time in one pair of
runs and 7% more in the next, in the noise).

    python benchmarks/gloo_floor.py [--calls 2000] [--worlds 1,2,3,4]
"""

from __future__ import annotations

import argparse
import glob
import os
import socket
import sys
import time

os.environ.setdefault("OMP_NUM_THREADS", "1")

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from suite_cpu import read_stat  # benchmarks/: the script's own folder


def _thread_ticks() -> dict[str, int]:
    """This process's CPU ticks by OS thread name, from /proc (Linux)."""
    ticks: dict[str, int] = {}
    for task in glob.glob(f"/proc/{os.getpid()}/task/*"):
        st = read_stat(task + "/stat")
        if st is None:  # a thread that ended meanwhile
            continue
        name, fields = st
        kind = name if name.startswith(("gloo_tcp_loop", "pt_gloo_runloop")) else "the rank's own threads"
        ticks[kind] = ticks.get(kind, 0) + int(fields[11]) + int(fields[12])
    return ticks


def _rank(rank: int, world: int, port: int, calls: int, results: mp.Queue) -> None:
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    t = torch.ones(64)
    dist.barrier()
    before, start = _thread_ticks(), time.perf_counter()
    for _ in range(calls):
        dist.all_reduce(t)
    elapsed = time.perf_counter() - start
    after = _thread_ticks()
    results.put((elapsed, {k: v - before.get(k, 0) for k, v in after.items()}))
    dist.barrier()
    dist.destroy_process_group()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def measure(world: int, calls: int) -> tuple[float, dict[str, int]]:
    """All-reduces per second on ``world`` fresh ranks (the slowest rank's), and their CPU ticks by thread."""
    ctx = mp.get_context("spawn")
    results = ctx.Queue()
    port = _free_port()
    procs = [ctx.Process(target=_rank, args=(r, world, port, calls, results)) for r in range(world)]
    for p in procs:
        p.start()
    got = [results.get(timeout=600) for _ in procs]
    for p in procs:
        p.join(60)
    ticks: dict[str, int] = {}
    for _, by_thread in got:
        for k, v in by_thread.items():
            ticks[k] = ticks.get(k, 0) + v
    return calls / max(e for e, _ in got), ticks


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--calls", type=int, default=2000)
    p.add_argument("--worlds", default="1,2,3,4")
    args = p.parse_args(argv)
    worlds = [int(w) for w in args.worlds.split(",")]
    load = os.getloadavg()[0]
    print(
        f"gloo all_reduce of 64 floats, {args.calls} calls; os.cpu_count()={os.cpu_count()}, load {load:.2f}"
    )
    rates = {w: measure(w, args.calls) for w in worlds}
    base = rates.get(2, rates[worlds[0]])[0]
    print(f"{'ranks':>5} {'all_reduce/s':>13} {'vs 2 ranks':>11}   CPU by thread, summed over the ranks")
    for w, (rate, ticks) in rates.items():
        total = sum(ticks.values()) or 1
        shares = ", ".join(
            f"{k} {100 * v / total:.0f}%" for k, v in sorted(ticks.items(), key=lambda kv: -kv[1])
        )
        print(f"{w:>5} {rate:>13.0f} {rate / base:>10.2f}x   {shares}")
    print(f"load after: {os.getloadavg()[0]:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
