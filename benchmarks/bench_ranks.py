"""The cost of the socket hop: examples/s of tp_mlp's reference with local ranks and with rank
servers that torchrun started, on the very same cases, in one run, alternating.

It starts one torchrun job on this machine (``--nnodes 1 --nproc-per-node 4``, or two agents as
two nodes with ``--nodes 2``: ``--nproc-per-node 2`` each) serving a driver on the loopback, draws
``--examples`` cases of ``tp_mlp`` (world sizes 1-4, derandomized), warms both ways on them, then
runs them ``--rounds`` times each way in turn with :meth:`shardfuzz.Runner.run_case` (everything
shardfuzz does per example, without Hypothesis). Prints each round's examples/s and the ratio
remote / local of the medians, with the machine's load.

    python benchmarks/bench_ranks.py [--examples 100] [--rounds 2] [--nodes 1]
"""

from __future__ import annotations

import argparse
import os
import secrets
import signal
import socket
import statistics
import subprocess
import sys
import time

os.environ.setdefault("OMP_NUM_THREADS", "1")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--examples", type=int, default=100)
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--nodes", type=int, default=1, choices=(1, 2), help="torchrun agents, as nodes")
    args = p.parse_args(argv)
    os.environ["SHARDFUZZ_SECRET"] = secrets.token_hex(32)

    from shardfuzz import RunConfig, Runner
    from shardfuzz.errors import Finding, Unsupported
    from shardfuzz.ranks import pool_cache
    from shardfuzz.spec.sampling import draw_pool

    port, rdzv = _free_port(), _free_port()
    per_node = 4 // args.nodes
    cmd = [
        sys.executable, "-m", "torch.distributed.run", "--nnodes", str(args.nodes), "--nproc-per-node",
        str(per_node), "--rdzv-backend", "c10d", "--rdzv-endpoint", f"127.0.0.1:{rdzv}",
        "-m", "shardfuzz.ranks.serve", "--driver", f"127.0.0.1:{port}",
    ]  # fmt: skip
    agents = [
        subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
        for _ in range(args.nodes)
    ]
    try:
        local = Runner("tp_mlp", "reference", RunConfig())
        remote = Runner("tp_mlp", "reference", RunConfig(ranks=str(port)))
        cases = [c for c, _ in draw_pool(local.strategy(), 0, args.examples)]

        def run_all(runner: Runner) -> float:
            t0 = time.perf_counter()
            for case in cases:
                try:
                    runner.run_case(case)
                except (Unsupported, Finding):  # counted like any example: the rate is per case
                    pass
            return len(cases) / (time.perf_counter() - t0)

        run_all(local)  # warm: imports, pools and meshes of every world size, both ways
        run_all(remote)
        rates: dict[str, list[float]] = {"local": [], "remote": []}
        for _ in range(args.rounds):
            rates["local"].append(run_all(local))
            rates["remote"].append(run_all(remote))
        load = os.getloadavg()
        print(f"# bench_ranks: {len(cases)} tp_mlp cases, {args.rounds} rounds, {args.nodes} node(s) x {per_node} ranks, "
              f"loadavg {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}")  # fmt: skip
        for way, values in rates.items():
            print(f"{way:7s} ranks: " + "  ".join(f"{v:6.1f} ex/s" for v in values))
        ratio = statistics.median(rates["remote"]) / statistics.median(rates["local"])
        print(f"remote / local: {ratio:.2f}x the examples per second")
    finally:
        world = pool_cache.use_remote(None)
        if world is not None:
            world.close()
        for a in agents:
            try:
                a.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(a.pid, signal.SIGKILL)
    return 0


if __name__ == "__main__":
    sys.exit(main())
