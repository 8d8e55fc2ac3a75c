"""Throughput of 1, 2 and 3 local fleet workers sharing one Redis, against the same workers with a
local directory database.

Starts a ``redis-server`` of its own (Debian's package) on a free port, then for each worker count
runs that many ``shardfuzz fuzz TARGET --duration D`` processes at once, first with a local
database, then with ``--database redis://...``, and prints examples/s in total and per worker
(each worker's examples over its whole run, pool start included), with the load average beside
each row. On a 2-core machine the total does not scale with workers; the figure that matters is
each worker's rate with Redis against the same worker with a local database. Run:

    python benchmarks/fleet.py [--target examples/mean_target.py] [--duration 15s] [--workers 1,2,3]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time

os.environ.setdefault("OMP_NUM_THREADS", "1")
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_redis(directory: str) -> tuple[subprocess.Popen, str]:
    if shutil.which("redis-server") is None:
        sys.exit("benchmarks/fleet.py needs redis-server: apt-get install redis-server")
    port = _free_port()
    proc = subprocess.Popen(
        ["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--dir", directory],
        stdout=subprocess.DEVNULL,
    )
    for _ in range(300):
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
            return proc, f"redis://127.0.0.1:{port}/0"
        except OSError:
            time.sleep(0.05)
    proc.kill()
    sys.exit("redis-server did not start")


def run_workers(n: int, target: str, duration: str, database: str, work: str) -> list[dict]:
    procs, summaries = [], []
    for i in range(n):
        d = os.path.join(work, f"{os.path.basename(database.rstrip('/'))}-{n}-{i}")
        os.makedirs(d, exist_ok=True)
        summaries.append(os.path.join(d, "summary.json"))
        cmd = [sys.executable, "-m", "shardfuzz.frontends.cli", "fuzz", target, "--duration", duration]
        cmd += ["--database", database, "--failures-dir", d, "--summary-json", summaries[-1]]
        cmd += ["--progress-every", "600"]
        procs.append(subprocess.Popen(cmd, stdout=subprocess.DEVNULL, cwd=ROOT))
    try:
        for p in procs:
            p.wait()
    finally:
        for p in procs:
            if p.poll() is None:
                p.terminate()
                p.wait()
    rows = []
    for path in summaries:
        with open(path) as f:
            rows += json.load(f)
    return rows


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--target", default=os.path.join(ROOT, "examples", "mean_target.py"))
    p.add_argument("--duration", default="15s")
    p.add_argument("--workers", default="1,2,3")
    args = p.parse_args(argv)
    counts = [int(x) for x in args.workers.split(",")]
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # stop Redis and the workers on the way out
    with tempfile.TemporaryDirectory(prefix="shardfuzz-fleet-bench-") as work:
        server, url = start_redis(work)
        try:
            print(f"{'workers':>7} {'database':<8} {'total ex/s':>10} {'per worker ex/s':<24} load (1 min)")
            for n in counts:
                for name, database in (("local", os.path.join(work, "local-db")), ("redis", url)):
                    rows = run_workers(n, args.target, args.duration, database, work)
                    rates = [r["examples"] / r["seconds"] for r in rows if r["seconds"]]
                    per = ", ".join(f"{x:.1f}" for x in rates)
                    load = os.getloadavg()[0]
                    print(f"{n:>7} {name:<8} {sum(rates):>10.1f} {per:<24} {load:.2f}", flush=True)
        finally:
            server.kill()
            server.wait()
    return 0


if __name__ == "__main__":
    sys.exit(main())
