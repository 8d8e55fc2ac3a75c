"""Processes that write failure files at the same time, for tests/test_faults.py.

``python failure_writer.py DIR:N[:FSIZE]...`` imports once; for each argument it forks N writers
(``A``, ``B``, ...) into the folder DIR, lets them go at once, and prints one JSON line per
argument: each writer's ``written`` files and ``errors``, and what it printed on stderr. Each writer records 13 updates of a finding of its own (as Hypothesis does
while shrinking one failure) of ``toy``/``wrong_rank1``/``mismatch``; its report names the writer.
With FSIZE no file may grow past FSIZE bytes (RLIMIT_FSIZE: a disk that fills up).
"""

import io
import json
import os
import resource
import signal
import sys
import traceback

import shardfuzz.engine.runner
from shardfuzz import Case, Mismatch, Runner
from shardfuzz.engine.failures import FailureRecorder

shardfuzz.engine.runner.start_forkserver = lambda: None  # records only: no rank runs here


def write(directory, name, runner):
    recorder = FailureRecorder(directory)
    for update in range(13):
        case = Case(target="toy", world_size=2, mesh=(2,), sizes={"n": 3}, split=("n",), seed=update)
        finding = Mismatch(f"bug of writer {name}, update {update}", case=case)
        recorder.on_finding(runner.finding_context(case, finding), finding)
    return {"written": list(recorder.written), "errors": recorder.errors}


def scenario(runner, directory, n, fsize=None):
    go_r, go_w = os.pipe()
    # every writer lives until all have written: a writer that is gone (and reaped) is an earlier
    # run to the others, whose file they may take over, and then the scenario is not concurrent
    done_r, done_w = os.pipe()
    children = []
    for name in "ABC"[:n]:
        out_r, out_w = os.pipe()
        pid = os.fork()
        if pid == 0:  # a writer: wait for the others, write, report
            os.close(go_w)
            if fsize is not None:
                signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the limit: EFBIG
                resource.setrlimit(resource.RLIMIT_FSIZE, (fsize, resource.RLIM_INFINITY))
            os.read(go_r, 1)
            sys.stderr = io.StringIO()
            try:
                result = write(directory, name, runner)
            except BaseException:  # noqa: BLE001 (a forked writer hands whatever stopped it to the parent)
                result = {"crash": traceback.format_exc()}
            result["stderr"] = sys.stderr.getvalue()
            os.write(out_w, json.dumps(result).encode())
            os.close(out_w)
            os.read(done_r, 1)
            os._exit(0)
        os.close(out_w)
        children.append((pid, out_r))
    os.write(go_w, b"x" * n)  # all at once
    results = []
    for _pid, out_r in children:
        with os.fdopen(out_r, "rb") as f:
            results.append(json.loads(f.read()))
    os.write(done_w, b"x" * n)
    for pid, _ in children:
        os.waitpid(pid, 0)
    for fd in (go_r, go_w, done_r, done_w):
        os.close(fd)
    return results


def main():
    runner = Runner(os.path.join(os.path.dirname(__file__), "toy_target.py"), "wrong_rank1")
    runner.numerics = {}  # what a record reads, filled before the forks
    for arg in sys.argv[1:]:
        directory, n, *fsize = arg.split(":")
        print(json.dumps(scenario(runner, directory, int(n), *map(int, fsize))), flush=True)


main()
