"""Each catch-all that must stay (``# noqa: BLE001`` with its reason) is reached here, without a
pool, and its promise checked. Three are reached elsewhere, where their outcome is checked:

* ``engine/input_bounds.py`` (a target's own error under fake tensors): tests/test_bad_inputs.py,
  ``test_a_size_the_target_cannot_take_is_the_targets_error`` and the missing-size tests;
* ``ranks/worker.py``'s failed regroup (the pool restarts): tests/test_reliability.py,
  ``test_a_rank_error_regroups_the_pool_in_place_and_later_examples_are_judged_afresh``;
* ``ranks/worker.py``'s ``answer`` for an ordinary exception: every rank-error test (and below
  for SystemExit).
"""

import collections
import subprocess
import sys
import textwrap
import threading
import types

import pytest

from shardfuzz.engine import settings as sf_settings
from shardfuzz.engine.hooks import example_choices, example_order
from shardfuzz.errors import InfrastructureError
from shardfuzz.protocol import ErrorReply
from shardfuzz.ranks import pool_cache, spawn, worker
from shardfuzz.ranks.trace import Tracer


def test_a_trace_that_cannot_describe_a_collective_drops_the_event_not_the_collective():
    tracer = Tracer()
    tracer.start()

    def make(_):
        raise ZeroDivisionError("a user type's __repr__, say")

    tracer.record(make)  # must not raise
    assert tracer.stop() == ()


def test_example_order_outside_a_hypothesis_test_is_none():
    assert example_order() is None


def test_example_choices_outside_a_hypothesis_test_is_none():
    assert example_choices() is None


def test_no_hypothesis_profile_loaded_reads_as_none(monkeypatch):
    from hypothesis import settings

    monkeypatch.setattr(settings, "_current_profile", None)
    assert sf_settings.current_profile_name() is None


def test_cpu_seconds_without_proc_asks_psutil_and_a_gone_process_is_none(monkeypatch):
    class Gone(Exception):
        pass

    def process(pid):
        raise Gone(pid)

    fake = types.SimpleNamespace(Error=Gone, Process=process)
    monkeypatch.setattr(spawn, "_psutil", fake)
    monkeypatch.setattr(spawn.os.path, "isdir", lambda _: False)  # no /proc (macOS)
    assert spawn.cpu_seconds(2**22 + 7) is None
    fake.Process = lambda pid: types.SimpleNamespace(
        cpu_times=lambda: types.SimpleNamespace(user=1.0, system=0.5)
    )
    assert spawn.cpu_seconds(2**22 + 7) == 1.5
    fake.Process = lambda pid: (_ for _ in ()).throw(NameError("a bug, not a gone process"))
    with pytest.raises(NameError):
        spawn.cpu_seconds(2**22 + 7)


def test_a_rank_answers_whatever_its_task_raised_system_exit_included(monkeypatch):
    def run_task(state, task):
        raise SystemExit(3)

    monkeypatch.setattr(worker, "run_task", run_task)
    reply = worker.answer(types.SimpleNamespace(leaks=[], restart=False), object())
    assert isinstance(reply, ErrorReply) and reply.exc_type == "SystemExit"


def test_a_failed_warm_up_is_left_for_the_task_to_report():
    def fail(_):
        raise ImportError("no such target")

    state = types.SimpleNamespace(target=fail, impl=fail)
    worker.warm(state, types.SimpleNamespace(target_ref="x", impl_ref="y"))  # must not raise


def test_a_setting_that_cannot_be_restored_restarts_the_pool():
    import torch

    from shardfuzz.ranks.task import RankState

    state = RankState(0, 1, torch.device("cpu"), 10.0)
    value = {"x": 1}

    def refuse(_):
        raise RuntimeError("cannot set number of interop threads after parallel work has started")

    state.settings = [("x", lambda: value["x"], refuse)]
    before = state.snapshot()
    value["x"] = 2
    state.clean_up(before, ("t", (1,)))
    assert state.restart and list(state.leaks) == ["rank 0 left x = 2"]


def test_an_answer_that_does_not_pickle_is_sent_as_an_error_and_the_rank_exits_cleanly(monkeypatch):
    # also reaches the catch-all around destroy_process_group: no group was ever made here
    sent = []

    class Conn:
        inbox = ["a task", worker.Stop()]

        def recv(self):
            return self.inbox.pop(0)

        def send(self, msg):
            if msg == "an answer":
                raise TypeError("cannot pickle 'generator' object")
            sent.append(msg)

    monkeypatch.setattr(worker, "answer", lambda state, task: "an answer")
    worker.serve_tasks(types.SimpleNamespace(), Conn(), lambda prefix: None, "gloo")
    assert [type(m) for m in sent] == [ErrorReply] and "could not send outputs back" in sent[0].traceback


def test_a_rank_that_cannot_start_tells_the_driver_why_even_a_system_exit_and_exits(tmp_path):
    # worker_main points the process's stdout and stderr at the rank's files and ends it with
    # os._exit, so it runs in a child forked by a fresh interpreter (as the forkserver forks a rank)
    code = textwrap.dedent(
        f"""
        import multiprocessing, os
        from shardfuzz.ranks import worker

        def cannot_start(*args):
            raise SystemExit(3)  # not an Exception: a narrower handler would let it end the rank silently

        worker.select_device = cannot_start
        parent, child = multiprocessing.Pipe()
        alive_r, alive_w = multiprocessing.Pipe(duplex=False)
        pid = os.fork()
        if pid == 0:
            try:
                store = ("127.0.0.1", 1, "p/")
                worker.worker_main(0, 1, "gloo", store, child, alive_r, {str(tmp_path)!r}, 5.0)
            finally:
                os._exit(99)  # worker_main returned or raised: it did not end the rank itself
        child.close()
        try:
            msg = parent.recv()
        except EOFError:
            msg = None
        print(type(msg).__name__)
        print(getattr(msg, "traceback", ""))
        print("exit", os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]))
        """
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.strip().splitlines()
    assert lines[0] == "StartFailed", out.stdout  # the driver hears why (Pool.start raises it)
    assert "cannot_start" in out.stdout and "SystemExit: 3" in out.stdout
    assert lines[-1] == "exit 1"  # and the rank ends


def test_a_spare_that_cannot_start_is_dropped_and_the_next_get_pool_reports_why(monkeypatch):
    killed = []

    class CannotStart:
        def __init__(self, backend, world_size, timeout_s, *, device="cpu", debug=False):
            self.world_size = world_size

        def start(self):
            raise InfrastructureError("rank 0 of pool backend='gloo' world_size=2 failed to start: no store")

        def kill(self):
            killed.append(self)

    monkeypatch.setattr(pool_cache, "Pool", CannotStart)
    monkeypatch.setattr(pool_cache, "_pools", collections.OrderedDict())
    monkeypatch.setattr(pool_cache, "_spares", {})
    monkeypatch.setattr(pool_cache, "_starting", {})
    monkeypatch.setattr(pool_cache, "_closing", False)
    lost = []  # what escaped the background thread
    monkeypatch.setattr(threading, "excepthook", lambda args: lost.append(args.exc_value))
    key = ("gloo", 2, "cpu", False)
    pool_cache.start_spare(key, 10.0)
    for thread in threading.enumerate():
        if thread.name == f"shardfuzz-spare-{key}":
            thread.join(10)
    assert lost == []
    assert len(killed) == 1  # whatever it had started is killed
    assert key not in pool_cache._spares and key not in pool_cache._starting  # a later spare may try again
    with pytest.raises(InfrastructureError, match="failed to start: no store"):
        pool_cache.get_pool("gloo", 2, 10.0)  # at once: nothing left to wait for


def test_an_error_beside_a_finding_in_hypothesis_group_is_said_not_dropped(monkeypatch):
    """Hypothesis groups what its final replays raised: a finding and, say, the target's oracle
    raising on another example. The group's other errors were dropped unsaid (found by review); the
    findings stay the result, and the report says the rest with its traceback."""
    import os

    import shardfuzz
    from shardfuzz.engine import search

    real = search.run_test

    def run_test(test):
        try:
            real(test)
        except shardfuzz.Finding as f:
            try:
                raise TypeError("an error of the engine's own")
            except TypeError as other:
                raise ExceptionGroup("Hypothesis found 2 distinct failures", [f, other]) from None  # noqa: F821

    monkeypatch.setattr(search, "run_test", run_test)
    toy = os.path.join(os.path.dirname(__file__), "data", "toy_target.py")
    result = shardfuzz.run(toy, "wrong_rank1", profile="shardfuzz-ci", database=None, max_examples=10)
    assert result.found and result.kind == "mismatch", result.report
    said = result.report.split("shardfuzz: the search also raised, on other examples (not findings):\n", 1)
    assert len(said) == 2 and "TypeError: an error of the engine's own" in said[1], result.report
    assert "in run_test" in said[1]  # its traceback
