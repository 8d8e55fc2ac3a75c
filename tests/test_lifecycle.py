"""No rank outlives its driver: SIGKILL, Ctrl-C, normal exit."""

import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

TOY = os.path.join(os.path.dirname(__file__), "data", "toy_target.py")

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="reads /proc to find leftover processes")


def start_driver(body: str) -> tuple[subprocess.Popen, list[int]]:
    code = textwrap.dedent(
        """
        import os, sys, time
        import shardfuzz
        from shardfuzz.pool import get_pool
        pool = get_pool("gloo", 3, 30.0)
        print(" ".join(str(p.pid) for p in pool.procs), flush=True)
        """
    ) + textwrap.dedent(body)
    proc = subprocess.Popen(
        [sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    line = proc.stdout.readline()
    assert line.strip(), proc.stderr.read()
    return proc, [int(p) for p in line.split()]


def test_workers_die_when_the_driver_is_sigkilled(procs):
    proc, pids = start_driver("time.sleep(120)")
    everything = procs.descendants(proc.pid)  # the forkserver and the ranks
    assert set(pids) <= set(everything) and all(procs.alive(p) for p in pids)
    proc.kill()
    proc.wait()
    assert procs.wait_gone(everything) == []


def test_workers_die_when_the_driver_is_interrupted_mid_example(procs):
    body = f"""
    import signal
    print("running", flush=True)
    shardfuzz.run({TOY!r}, "hang_rank0", max_examples=5, timeout=60, database=None)
    """
    proc, pids = start_driver(body)
    assert proc.stdout.readline().strip() == "running"
    time.sleep(1.5)
    everything = procs.descendants(proc.pid)
    proc.send_signal(signal.SIGINT)
    proc.wait(timeout=30)
    assert procs.wait_gone(pids + everything) == []


def test_workers_stop_when_the_driver_exits_normally(procs):
    proc, pids = start_driver("pass")
    proc.wait(timeout=30)
    assert proc.returncode == 0
    assert procs.wait_gone(pids) == []
