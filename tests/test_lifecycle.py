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


def test_a_command_leaves_without_teardown_but_with_what_a_normal_exit_does(tmp_path):
    """exit_without_teardown (the `shardfuzz` command's exit): non-daemon threads finish, atexit
    handlers run, buffered output is flushed, the code is the process's exit status."""
    import subprocess

    done = tmp_path / "done"
    code = textwrap.dedent(
        f"""
        import atexit, sys, threading, time
        from shardfuzz.ranks.fast_exit import IN_FORKSERVER, exit_without_teardown
        assert not IN_FORKSERVER  # imported here, it registers nothing
        sys.stdout.write("buffered,")  # no newline: still in the buffer
        worker = threading.Thread(target=lambda: (time.sleep(0.5), open({str(done)!r}, "w").write("x")))
        worker.start()
        atexit.register(lambda: print(" atexit ran", flush=False))
        exit_without_teardown(3)
        """
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 3, out.stderr
    assert out.stdout == "buffered, atexit ran\n" and done.read_text() == "x", out


def test_only_the_forkserver_and_its_ranks_leave_without_teardown():
    """shardfuzz.ranks.fast_exit, on the forkserver's preload list, registers its exit there and
    only there: a process the forkserver forks carries it, the driver does not."""
    from shardfuzz.ranks import fast_exit
    from shardfuzz.ranks.spawn import context

    sys.path.insert(0, os.path.join(os.path.dirname(__file__), "data"))  # for the child too
    try:
        import forkserver_probe

        ctx = context()
        queue = ctx.Queue()
        child = ctx.Process(target=forkserver_probe.report, args=(queue,))
        child.start()
        try:
            assert queue.get(timeout=120) is True
        finally:
            child.join(60)
    finally:
        sys.path.remove(os.path.join(os.path.dirname(__file__), "data"))
    assert fast_exit.IN_FORKSERVER is False
