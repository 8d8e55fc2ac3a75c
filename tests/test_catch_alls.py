"""Each catch-all that must stay (``# noqa: BLE001`` with its reason) is reached here, in process
and without ranks, where that is cheap; the rest are reached by the rank tests named in the
report of issue 22 (a rank's exception, a regroup, a leak that cannot be restored)."""

import types

import pytest

from shardfuzz.engine import settings as sf_settings
from shardfuzz.engine.hooks import example_order
from shardfuzz.protocol import ErrorReply
from shardfuzz.ranks import spawn, worker
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
    worker._serve(types.SimpleNamespace(), Conn(), lambda prefix: None, "gloo")
    assert [type(m) for m in sent] == [ErrorReply] and "could not send outputs back" in sent[0].traceback
