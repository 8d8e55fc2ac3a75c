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


def test_every_rank_dies_when_the_driver_is_sigkilled_busy_suspended_or_holding_the_gil(
    procs, start_process, tmp_path
):
    """One driver, SIGKILLed with ranks in each state a rank can be in (one driver for the three
    properties: each driver start costs an interpreter, torch and a forkserver):

    * ranks 1 and 2 of the world-3 pool wait in the example for rank 0, neither stopped nor stuck;
    * rank 0 of it is stuck in C code that holds the GIL (a regex that backtracks for ever), so its
      watchdog thread cannot run: no rank keeps the forkserver's alive pipe open, so the forkserver
      exits with its driver and PR_SET_PDEATHSIG kills the rank;
    * the world-2 pool is idle and suspended (SIGSTOP): a stopped rank's watchdog cannot see its
      driver die either, and PR_SET_PDEATHSIG kills it too."""
    marker = tmp_path / "rank0.busy"
    body = f"""
    os.environ["SHARDFUZZ_SUSPEND_IDLE"] = "1"  # whatever the suite was started with
    idle = get_pool("gloo", 2, 30.0)  # unused from now on: suspended within a second or two
    print(" ".join(str(p.pid) for p in idle.procs), flush=True)
    from shardfuzz import Case, Runner
    case = Case(
        target="toy", world_size=3, mesh=(3,), sizes={{"n": 3}}, split=("n",), options={{"marker": {str(marker)!r}}}
    )
    Runner({TOY!r}, "gil_held_rank0").run_case(case)
    """
    proc, busy = start_driver(start_process, body)
    suspended = [int(p) for p in proc.wait_line(lambda line: line.strip(), 120).split()]
    deadline = time.monotonic() + 60
    while not marker.exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert marker.exists(), "rank 0 never started the example"
    assert procs.wait_states(suspended, "T") == ["T"] * 2
    everything = procs.descendants(proc.pid)  # the forkserver and the ranks
    assert set(busy + suspended) <= set(everything) and all(procs.alive(p) for p in busy + suspended)
    proc.signal(signal.SIGKILL)
    proc.finish(30)
    assert procs.wait_gone(busy + suspended + everything) == []


def test_workers_die_when_the_driver_is_interrupted_mid_example_and_stop_at_its_normal_exit(
    procs, start_process
):
    """Ctrl-C mid-example, then the driver's script goes on (a pool taken after it) and ends
    normally (exit 0): the ranks running the example, the warm pools and the one taken after the
    interrupt are all gone (one driver for both properties: each start costs an interpreter, torch
    and a forkserver)."""
    body = f"""
    print("running", flush=True)
    try:
        shardfuzz.run({TOY!r}, "hang_rank0", max_examples=5, timeout=60, database=None)
    except KeyboardInterrupt:
        pass
    after = get_pool("gloo", 2, 30.0)
    print("after", " ".join(str(p.pid) for p in after.procs), flush=True)
    """
    proc, pids = start_driver(start_process, body)
    proc.wait_line(lambda line: line.strip() == "running", 60)
    time.sleep(1.5)
    everything = procs.descendants(proc.pid)
    proc.signal(signal.SIGINT)
    after = [int(p) for p in proc.wait_line(lambda line: line.startswith("after "), 60).split()[1:]]
    assert after and all(procs.alive(p) for p in after)
    code, out, err = proc.finish(30)
    assert code == 0, out + err
    assert procs.wait_gone(pids + everything + after) == []


def test_a_command_leaves_without_teardown_but_with_what_a_normal_exit_does(tmp_path):
    """exit_without_teardown (the `shardfuzz` command's exit): non-daemon threads finish (and the
    threads they start), an idle executor's workers are let go, atexit handlers run, buffered
    output and a file left open are flushed, the code is the process's exit status."""
    import subprocess

    done, log = tmp_path / "done", tmp_path / "log"
    code = textwrap.dedent(
        f"""
        import atexit, sys, threading, time
        from concurrent.futures import ThreadPoolExecutor
        from shardfuzz.ranks.fast_exit import IN_FORKSERVER, exit_without_teardown
        assert not IN_FORKSERVER  # imported here, it registers nothing
        sys.stdout.write("buffered,")  # no newline: still in the buffer
        LOG = open({str(log)!r}, "w")  # never closed: a normal exit's teardown flushes it
        LOG.write("kept")
        GONE = open({str(tmp_path / "gone")!r}, "w")  # its descriptor closed under it: cannot flush
        GONE.write("lost")
        import os; os.close(GONE.fileno())
        def later():
            time.sleep(0.3)
            threading.Thread(target=lambda: (time.sleep(0.3), open({str(done)!r}, "w").write("x"))).start()
        threading.Thread(target=later).start()
        pool = ThreadPoolExecutor(2)  # idle workers, never shut down
        assert pool.submit(lambda: 42).result() == 42
        atexit.register(lambda: print(" atexit ran", flush=False))
        exit_without_teardown(3)
        """
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 3, out.stderr
    assert out.stdout == "buffered, atexit ran\n" and done.read_text() == "x", out
    assert log.read_text() == "kept"


def test_only_the_forkserver_and_its_ranks_leave_without_teardown():
    """shardfuzz.ranks.fast_exit, on the forkserver's preload list, registers its exit there and
    only there (a process the forkserver forks inherits it, and it does nothing in another pid):
    the driver does not, and neither does a child of another program's forkserver."""
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
    # the children of another program's forkserver (multiprocessing's own, no such preload) do not
    import subprocess

    code = textwrap.dedent(
        """
        import multiprocessing, sys
        import forkserver_probe
        if __name__ == "__main__":
            ctx = multiprocessing.get_context("forkserver")
            queue = ctx.Queue()
            child = ctx.Process(target=forkserver_probe.report_after_import, args=(queue,))
            child.start()
            print(queue.get(timeout=120))
            child.join(60)
        """
    )
    script = os.path.join(os.path.dirname(__file__), "data", "forkserver_probe.py")
    env = {**os.environ, "PYTHONPATH": os.path.dirname(script)}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=180, env=env)
    assert out.stdout.strip() == "False", out.stdout + out.stderr


def test_a_reader_that_leaves_the_pipe_ends_the_command_quietly():
    """`shardfuzz list | head -1`: the command's BrokenPipeError is a quiet exit 1, no traceback."""
    import subprocess

    command = [sys.executable, "-m", "shardfuzz.frontends.cli", "list"]  # as start_cli runs it
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    proc.stdout.close()  # the reader is gone before the command (importing torch) prints a line
    err = proc.stderr.read().decode()
    assert proc.wait(timeout=60) == 1 and "Traceback" not in err, err


@pytest.mark.skipif(sys.platform != "linux", reason="PR_SET_PDEATHSIG is Linux's")
def test_set_pdeathsig_arms_sigkill_in_the_calling_process_and_raises_when_prctl_refuses(monkeypatch):
    """What ranks, rank servers and jobs call to die with their parent: armed in the process that
    calls it (read back with PR_GET_PDEATHSIG in a forked child, so this test's own process keeps
    its setting), and a refusal is an error, never a process that silently outlives its driver."""
    import ctypes
    import errno

    from shardfuzz.ranks import parent_death

    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: arm it, read it back, report the signal through the pipe
        os.close(read)
        parent_death.set_pdeathsig()
        got = ctypes.c_int(0)
        ctypes.CDLL(None, use_errno=True).prctl(2, ctypes.byref(got))  # PR_GET_PDEATHSIG
        os.write(write, str(got.value).encode())
        os._exit(0)
    os.close(write)
    reported = os.read(read, 16).decode()
    os.close(read)
    assert os.waitpid(pid, 0)[1] == 0
    assert reported == str(int(signal.SIGKILL))

    class Refusing:
        def prctl(self, *args):
            ctypes.set_errno(errno.EINVAL)
            return -1

    monkeypatch.setattr(parent_death.ctypes, "CDLL", lambda *a, **k: Refusing())
    with pytest.raises(OSError, match=r"prctl\(PR_SET_PDEATHSIG, SIGKILL\) failed: Invalid argument"):
        parent_death.set_pdeathsig()


@pytest.mark.skipif(sys.platform != "linux", reason="PR_SET_PDEATHSIG is Linux's")
def test_a_rank_that_cannot_arm_its_parent_death_tells_the_driver_why_and_exits(tmp_path):
    """A refused prctl in a rank is a StartFailed with its traceback on the rank's pipe (what the
    driver reports), then exit 1: never a traceback lost on the forkserver's stderr."""
    import multiprocessing

    from shardfuzz.protocol import StartFailed
    from shardfuzz.ranks import worker

    driver_end, rank_end = multiprocessing.Pipe()
    pid = os.fork()
    if pid == 0:  # the rank: whatever happens, it never returns into this test's process
        code = 2
        try:

            def refused() -> None:
                raise OSError("prctl(PR_SET_PDEATHSIG, SIGKILL) failed: Invalid argument")

            worker.set_pdeathsig = refused
            worker.worker_main(0, 1, "gloo", (), rank_end, None, str(tmp_path), 5.0)
        finally:
            os._exit(code)
    rank_end.close()  # the rank's copy is the pipe's last writer: its exit ends the wait
    assert driver_end.poll(30), "the rank neither spoke nor exited"
    try:
        said = driver_end.recv()
    except EOFError:
        pytest.fail("the rank exited without telling the driver why")
    assert isinstance(said, StartFailed) and "prctl(PR_SET_PDEATHSIG, SIGKILL) failed" in said.traceback
    assert os.waitpid(pid, 0)[1] >> 8 == 1
