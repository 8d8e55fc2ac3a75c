"""No rank outlives its driver: SIGKILL, Ctrl-C, normal exit."""

import os
import signal
import sys
import textwrap
import time

import pytest

TOY = os.path.join(os.path.dirname(__file__), "data", "toy_target.py")

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="reads /proc to find leftover processes")


def start_driver(start_process, body: str):
    """A driver process with a warm 3-rank pool; returns it and the ranks' pids."""
    code = textwrap.dedent(
        """
        import os, sys, time
        import shardfuzz
        from shardfuzz.ranks.pool_cache import get_pool
        pool = get_pool("gloo", 3, 30.0)
        print(" ".join(str(p.pid) for p in pool.procs), flush=True)
        """
    ) + textwrap.dedent(body)
    proc = start_process([sys.executable, "-c", code])
    line = proc.wait_line(lambda line: line.strip(), 120)
    return proc, [int(p) for p in line.split()]


def test_workers_die_when_the_driver_is_sigkilled(procs, start_process):
    proc, pids = start_driver(start_process, "time.sleep(120)")
    everything = procs.descendants(proc.pid)  # the forkserver and the ranks
    assert set(pids) <= set(everything) and all(procs.alive(p) for p in pids)
    proc.signal(signal.SIGKILL)
    proc.finish(30)
    assert procs.wait_gone(everything) == []


def test_workers_die_when_the_driver_is_interrupted_mid_example(procs, start_process):
    body = f"""
    import signal
    print("running", flush=True)
    shardfuzz.run({TOY!r}, "hang_rank0", max_examples=5, timeout=60, database=None)
    """
    proc, pids = start_driver(start_process, body)
    proc.wait_line(lambda line: line.strip() == "running", 60)
    time.sleep(1.5)
    everything = procs.descendants(proc.pid)
    proc.signal(signal.SIGINT)
    proc.finish(30)
    assert procs.wait_gone(pids + everything) == []


def test_workers_stop_when_the_driver_exits_normally(procs, start_process):
    proc, pids = start_driver(start_process, "pass")
    code, out, err = proc.finish(30)
    assert code == 0, out + err
    assert procs.wait_gone(pids) == []
