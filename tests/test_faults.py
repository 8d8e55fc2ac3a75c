"""Nothing false under faults (issue 24): each fault is injected deterministically.

A forkserver killed mid-example, a death that recurs only sometimes, a death whose exit code the
forkserver reports late, an implementation that leaks an environment variable and a working
directory, and shardfuzz.spec.parallel's helpers fed transposed, sliced, offset and expanded inputs.
"""

import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from multiprocessing import forkserver

import pytest

import shardfuzz
from shardfuzz import Case, ExternalFault, Mismatch, RankError, RunConfig, Runner
from shardfuzz.ranks.spawn import context, start_process

DATA = os.path.join(os.path.dirname(__file__), "data")
TOY = os.path.join(DATA, "toy_target.py")
PARALLEL = os.path.join(DATA, "parallel_target.py")
linux = pytest.mark.skipif(sys.platform != "linux", reason="signals a forkserver, reads /proc")


def toy_case(world=2, **options):
    return Case(target="toy", world_size=world, mesh=(world,), sizes={"n": 3}, split=("n",), options=options)


# -- item 1: any rank death is confirmed on fresh ranks before it is a finding ----------------------
@linux
def test_a_killed_forkserver_is_an_external_fault_not_a_finding(tmp_path):
    """Killing the forkserver mid-example ends every rank with exit code 255 (not a signal): the
    case is rerun on fresh ranks (a new forkserver), passes, and is counted as an external fault."""
    runner = Runner(TOY, "kill_forkserver_once")
    with pytest.raises(ExternalFault, match=r"rank \d died \(exit code 255\) from outside the example"):
        runner.run_case(toy_case(marker=str(tmp_path / "killed")))
    assert runner.stats.external_faults == 1 and runner.stats.failures == 0
    assert "external faults set aside (rank killed from outside): 1" in runner.stats.summary()
    assert Runner(TOY, "reference").run_case(toy_case()) < 1  # the forkserver is back


@linux
def test_a_rank_starts_right_after_the_forkserver_was_killed():
    """A forkserver killed from outside closes its socket before ``os.waitpid`` shows it dead, and
    multiprocessing then refuses a start instead of launching a new forkserver (a plain
    ``Process.start()`` right after the kill failed 8 times in 8; in the suite this failed the test
    above once). :func:`start_process` waits the window out."""
    ctx = context()
    first = ctx.Process(target=time.sleep, args=(0,), daemon=True)
    start_process(first)
    first.join(60)
    killed = forkserver._forkserver._forkserver_pid  # multiprocessing's own record of it
    os.kill(killed, signal.SIGKILL)
    second = ctx.Process(target=time.sleep, args=(0,), daemon=True)
    start_process(second)  # at once: inside the window
    second.join(60)
    assert second.exitcode == 0 and forkserver._forkserver._forkserver_pid != killed


def test_a_death_that_recurs_only_sometimes_is_reported_as_flaky(tmp_path):
    runner = Runner(TOY, "dies_on_odd_runs")
    case = toy_case(counter=str(tmp_path / "runs"))
    with pytest.raises(ExternalFault, match=r"rank 1 died \(exit code 3\)"):
        runner.run_case(case)  # run 1 dies, its rerun (run 2) passes: set aside once
    with pytest.raises(RankError, match=r"(?s)rank 1 died \(exit code 3\).*dies only sometimes \(flaky\)"):
        runner.run_case(case)  # run 3 dies, run 4 passes: the same case again, so not set aside
    assert runner.stats.external_faults == 1 and runner.stats.failures == 1


def test_a_failure_refused_when_hypothesis_replays_it_is_reported_not_a_traceback(tmp_path):
    """A new user's campaign over a nondeterministic bf16 kernel ended in a raw exception group:
    Hypothesis' final replay of the failing case was rejected (``reject()`` in check), so its Flaky
    error held no finding. The failure is reported, with a note that it was not reproduced."""
    import shardfuzz
    from shardfuzz import bind

    impl = bind("fails_once_then_refused", counter=str(tmp_path / "n"), at=20)
    result = shardfuzz.run(TOY, impl, profile="shardfuzz-ci", database=None)
    assert result.found and result.kind == "mismatch" and result.flaky, result.report
    assert result.report.startswith("shardfuzz: this failure did not fail again when Hypothesis replayed it")
    assert result.stats.unsupported, result.stats.summary()  # the replay and everything after: refused


def test_a_rank_that_cannot_load_the_target_the_driver_loaded_is_a_setup_error_not_a_finding(tmp_path):
    """A new user's target file was missing on one node of a torchrun world: the run reported a
    rank-error finding, wrote its failure file and exited 1. The driver loaded the file, so the
    rank's environment differs: a setup error (exit 3) that names the rank, its host and the cause."""
    import shutil

    from shardfuzz.errors import InfrastructureError, RankSetupError

    shutil.copy(TOY, tmp_path / "gone_target.py")
    runner = Runner(str(tmp_path / "gone_target.py"), "reference")  # the driver loads it here
    (tmp_path / "gone_target.py").rename(tmp_path / "elsewhere.py")  # what the ranks will not find
    with pytest.raises(
        RankSetupError,
        match=r"(?s)rank 0 on host .* could not load what the driver loaded: "
        r"TargetError: .*gone_target.py' does not exist.*each node needs those files",
    ) as e:
        runner.run_case(toy_case())
    assert isinstance(e.value, InfrastructureError) and runner.stats.failures == 0


def test_a_rank_that_aborts_on_its_own_uncaught_cpp_exception_is_not_rerun(tmp_path):
    """The same death that recurs only sometimes, but one the rank causes itself: gloo's size check
    throws, uncaught, and libstdc++ writes so before it aborts. Nothing outside can cause that, so
    it is a finding at once, without the rerun on fresh ranks (which would pass here)."""
    runner = Runner(TOY, "aborts_on_odd_runs")
    counter = tmp_path / "runs"
    with pytest.raises(RankError, match=r"(?s)rank 1 died \(exit code -6\).*terminate called after throwing"):
        runner.run_case(toy_case(counter=str(counter)))
    assert counter.read_text() == "x", "the case ran again"
    assert runner.stats.external_faults == 0 and runner.stats.failures == 1


def test_a_survivor_that_aborts_after_a_peer_was_killed_from_outside_is_still_rerun(tmp_path):
    """A peer killed from outside can take a survivor down with it, and the lowest dead rank is
    the one reported: the death is the ranks' own only where every rank that died aborted on
    gloo's size check. Here rank 0 SIGKILLs rank 1, then writes that line and aborts: the case is
    rerun, passes, and is set aside."""
    runner = Runner(TOY, "peer_killed_then_aborts_once")
    case = toy_case(marker=str(tmp_path / "killed"), pidfile=str(tmp_path / "rank1.pid"))
    # rank 0 is the one reported where the driver saw both deaths (the usual order: a survivor
    # still computing gets a grace); rank 1 where rank 0's abort came after it
    with pytest.raises(
        ExternalFault, match=r"rank (0 was killed by signal 6|1 was killed by signal 9) from outside"
    ):
        runner.run_case(case)
    assert runner.stats.external_faults == 1 and runner.stats.failures == 0


def test_only_an_abort_on_gloos_size_check_in_every_dead_ranks_stderr_skips_the_rerun():
    from shardfuzz.engine.stats import Stats
    from shardfuzz.protocol import RankDied
    from shardfuzz.ranks.faults import SELF_INFLICTED, confirm_death

    class Reruns:  # the runner's part confirm_death uses: the rerun passes
        def __init__(self):
            self._confirming, self.deaths_set_aside, self.stats, self.calls = False, set(), Stats(), 0

        def _run_on_pool(self, case):
            self.calls += 1

    def reruns(output, dead):
        runner = Reruns()
        try:
            confirm_death(runner, toy_case(), RankDied(min(dead), dead[min(dead)], output, dead=dead))
        except ExternalFault:
            pass
        return runner.calls == 1

    aborted = f"--- rank 0 stderr ---\n{SELF_INFLICTED}\n  what():  [enforce fail at pair.cc:456]\n"
    assert not reruns({0: aborted}, {0: -6})
    assert reruns({0: aborted, 1: ""}, {0: -6, 1: -9})  # rank 1 killed from outside, no word
    assert reruns({0: aborted}, {0: 1})  # not an abort
    assert reruns({0: aborted.replace("stderr", "stdout")}, {0: -6})  # a copy the code printed
    assert reruns({0: aborted.replace("'gloo::EnforceNotMet'", "'c10::DistBackendError'")}, {0: -6})


# -- item 3: a death is a death, however late the driver learns its exit code -----------------------
@linux
def test_a_death_whose_exit_code_comes_late_is_a_death_not_a_hang():
    """The forkserver tells the driver a rank's exit code; stopped for 2 s (as a loaded machine
    may delay it), rank 0's "connection closed" arrives first. Before issue 24 this was a hang."""
    assert Runner(TOY, "reference").run_case(toy_case()) < 1  # a warm pool, and a forkserver
    server = forkserver._forkserver._forkserver_pid
    os.kill(server, signal.SIGSTOP)
    resume = threading.Timer(2.0, os.kill, (server, signal.SIGCONT))
    resume.start()
    try:
        with pytest.raises(RankError, match=r"rank 1 died \(exit code -9\)"):
            Runner(TOY, "sigkill_rank1", RunConfig(timeout=10)).run_case(toy_case())
    finally:
        resume.join()
        os.kill(server, signal.SIGCONT)


# -- item 2: the environment and the working directory are restored after every example -------------
def test_a_leaked_environment_variable_and_directory_are_restored_and_named():
    leaker = Runner(TOY, "leak_environment")
    assert leaker.run_case(toy_case()) < 1
    leaks = dict(leaker.stats.leaks)
    for rank in (0, 1):
        assert leaks[f"rank {rank} left os.environ['SHARDFUZZ_TOY_LEAKED'] = '1' (was unset)"] == 1
        assert any(k.startswith(f"rank {rank} left the working directory ") for k in leaks)
    assert "leaks (not findings): rank" in leaker.stats.summary()
    # the next example, of an implementation that reads them, starts clean: no false mismatch
    reader = Runner(TOY, "reads_environment")
    assert reader.run_case(toy_case()) < 1
    assert not reader.stats.leaks


def test_torchs_own_default_cache_dir_is_not_a_leak_but_another_value_is(monkeypatch):
    """torch's inductor writes its default TORCHINDUCTOR_CACHE_DIR into the environment when it first
    needs it (the README's `shardfuzz fuzz` summary named it as the driver's leak): kept, unnamed.
    Any other value, or another variable, is still a leak, restored and named."""
    from torch._inductor.runtime import cache_dir_utils

    from shardfuzz.ranks.faults import ProcessState

    monkeypatch.delenv("TORCHINDUCTOR_CACHE_DIR", raising=False)
    state = ProcessState("the driver")
    state.snapshot()
    torchs = cache_dir_utils.cache_dir()  # what torch does inside an oracle
    assert state.restore() == [] and os.environ["TORCHINDUCTOR_CACHE_DIR"] == torchs
    monkeypatch.delenv("TORCHINDUCTOR_CACHE_DIR")
    state.snapshot()
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = "/tmp/elsewhere"
    assert state.restore() == [
        "the driver left os.environ['TORCHINDUCTOR_CACHE_DIR'] = '/tmp/elsewhere' (was unset)"
    ]
    assert "TORCHINDUCTOR_CACHE_DIR" not in os.environ


def test_the_driver_environment_is_restored_too(monkeypatch):
    """The target's inputs and oracle run in the driver: what they leave is restored and named."""
    import shardfuzz.engine.runner as runner_module

    evaluate = runner_module.evaluate_oracle

    def leaky_oracle(target, case):
        os.environ["SHARDFUZZ_TOY_DRIVER_LEAK"] = "yes"
        return evaluate(target, case)

    monkeypatch.setattr(runner_module, "evaluate_oracle", leaky_oracle)
    monkeypatch.delenv("SHARDFUZZ_TOY_DRIVER_LEAK", raising=False)
    runner = Runner(TOY, "reference")
    assert runner.run_case(toy_case()) < 1
    assert "SHARDFUZZ_TOY_DRIVER_LEAK" not in os.environ
    assert (
        runner.stats.leaks["the driver left os.environ['SHARDFUZZ_TOY_DRIVER_LEAK'] = 'yes' (was unset)"] == 1
    )


# -- item 5: shardfuzz.spec.parallel's helpers are right for any strides ---------------------------------
def parallel_case(world, layouts, broadcast=False, s=3):
    return Case(
        target="parallel_helpers",
        world_size=world,
        mesh=(world,),
        sizes={"s": s},
        split=("s",),
        dtype="float64",
        options={"layouts": [broadcast, *layouts]},
    )


@pytest.mark.parametrize("layout", ["transposed", "sliced", "offset"])
def test_each_parallel_helper_sums_a_transposed_input_right(layout):
    """Rank 0 passes row-major memory, rank 1 the same values laid out otherwise."""
    case = parallel_case(2, ["rowmajor", layout, "rowmajor"])
    assert Runner(PARALLEL, "reference").run_case(case) < 1
    if layout == "transposed":  # the helpers' old copy (clone keeps strides) sums the wrong elements
        with pytest.raises(Mismatch, match="sum"):
            Runner(PARALLEL, "cloning").run_case(case)


def test_parallel_helpers_are_right_for_expanded_inputs():
    assert (
        Runner(PARALLEL, "reference").run_case(parallel_case(3, ["expanded", "transposed", "rowmajor"], True))
        < 1
    )


def test_parallel_helpers_property_any_strides_on_1_to_3_ranks():
    """Hypothesis draws the world size (1-3), each rank's layout and the sequence length."""
    result = shardfuzz.run(PARALLEL, "reference", max_examples=25, derandomize=True, database=None)
    assert not result.found, result.report
    assert result.stats.passed >= 20


# -- items 6 and 7: failure files beside other writers, and on a full disk --------------------------
WRITER = os.path.join(DATA, "failure_writer.py")


@pytest.fixture(scope="module")
def writers(tmp_path_factory):
    """Two and three processes that record 13 updates each of a finding of their own into one
    folder, all at once; and one whose files may not grow past 1000 bytes (a full disk). One
    Python process imports shardfuzz once and forks them all (the imports are the slow part)."""
    root = tmp_path_factory.mktemp("writers")
    args = [f"{root / 'two'}:2", f"{root / 'three'}:3", f"{root / 'full'}:1:1000"]
    out = subprocess.run([sys.executable, WRITER, *args], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    return root, dict(zip(("two", "three", "full"), map(json.loads, out.stdout.splitlines())))


@linux
@pytest.mark.parametrize("n", [2, 3])
def test_concurrent_campaigns_never_overwrite_each_others_failure_files(writers, n):
    root, scenarios = writers
    results = scenarios["two" if n == 2 else "three"]
    files = sorted(os.listdir(root / ("two" if n == 2 else "three")))
    assert files == sorted(
        ["toy-wrong_rank1-gloo-mismatch.json"]
        + [f"toy-wrong_rank1-gloo-mismatch-{k}.json" for k in range(2, n + 1)]
    )  # one file each, and no temporary file left
    for name, result in zip("ABC", results):
        assert not result.get("crash") and not result["errors"], result
        (path,) = result["written"]  # the file this writer's summary points at holds its own finding
        record = json.loads(open(path).read())
        assert record["report"] == f"bug of writer {name}, update 12" and record["updates"] == 12


def test_writers_of_one_process_keep_each_distinct_finding_and_update_the_same_one(tmp_path):
    """One serial pytest session: each test_for test records through its own writer, in one process.
    The second test's distinct finding took over the first's file (pytest-xdist kept both)."""
    from shardfuzz.engine.failures import FailureRecorder
    from shardfuzz.engine.filewriter import read_record

    first, second, again = (FailureRecorder(str(tmp_path)).writer for _ in range(3))
    stem = "t-i-gloo-mismatch"
    a = first.write(stem, ".json", {"signature": "4 of 6 outputs", "report": "fp32"})
    b = second.write(stem, ".json", {"signature": "2 of 6 outputs", "report": "bf16"})
    assert (os.path.basename(a), os.path.basename(b)) == (f"{stem}.json", f"{stem}-2.json")
    assert read_record(a)["report"] == "fp32"
    c = again.write(stem, ".json", {"signature": "4 of 6 outputs", "report": "fp32, again"})
    assert c == a and read_record(a)["updates"] == 1  # the same finding: its file, updated
    assert sorted(os.listdir(tmp_path)) == [f"{stem}-2.json", f"{stem}.json"]
    # a test whose first, larger example had another signature took the next name, then shrank to
    # the first test's finding: one file of it (two were left, a new user's DTensor audit)
    late = FailureRecorder(str(tmp_path)).writer
    d = late.write(stem, ".json", {"signature": "3 of 6 outputs", "report": "larger example"})
    assert os.path.basename(d) == f"{stem}-3.json"
    e = late.write(stem, ".json", {"signature": "2 of 6 outputs", "report": "shrunk"})
    assert e == b and read_record(b)["report"] == "shrunk" and not os.path.exists(d)
    assert late.write(stem, ".json", {"signature": "2 of 6 outputs", "report": "again"}) == b  # its own now
    assert sorted(os.listdir(tmp_path)) == [f"{stem}-2.json", f"{stem}.json"]


def _gone() -> int:
    """The pid of a process of this host that has exited: a failure file's writer that is gone."""
    done = subprocess.Popen(["true"])
    done.wait()
    return done.pid


def _dead_writer() -> str:
    """The ``writer`` of an earlier campaign's failure file (an earlier version's form: this host's
    name and a pid): a process that has exited, so a later run may take the file over."""
    import socket

    return f"{socket.gethostname()}:{_gone()}:abc"


def test_a_failure_file_names_no_machine_and_a_later_run_still_knows_its_writer_is_gone(tmp_path):
    """A failure file is shared with others: its ``writer`` names this host and its boot by hashes,
    not by its name (a new user found their host name in a file they were about to share). A later
    run on this host still tells that the writer is gone (no longer alive, or of an earlier boot:
    a reboot left a second file of one finding), and updates its file of the same finding in
    place; a writer of another host (another hash), or alive in this boot, keeps its file."""
    import socket

    from shardfuzz.engine.failures import FailureRecorder
    from shardfuzz.engine.filewriter import boot_id, host_id, read_record

    stem = "t-i-gloo-mismatch"
    run = FailureRecorder(str(tmp_path)).writer
    path = run.write(stem, ".json", {"signature": "2 of 6 outputs", "report": "run 1"})
    host, boot, pid, _ = read_record(path)["writer"].split(":")
    assert host == host_id() != socket.gethostname() and len(host) == 12 and pid == str(os.getpid())
    assert boot == boot_id()
    gone = _gone()
    alive = os.getppid()  # this boot, alive: its file is kept
    for writer, taken in (
        (f"{host_id()}:{boot_id()}:{gone}:abc", True),
        (f"{host_id()}:00000000:{alive}:abc", True),  # an earlier boot's pid means nothing now
        (f"{host_id()}:{boot_id()}:{alive}:abc", False),
        (f"{socket.gethostname()}:{alive}:abc", False),  # an earlier version's file, alive writer
        (f"{socket.gethostname()}:{gone}:abc", True),
        (f"0123456789ab:{boot_id()}:{gone}:abc", False),
    ):
        earlier = {"signature": "2 of 6 outputs", "report": "run 1", "writer": writer}
        (tmp_path / f"{stem}.json").write_text(json.dumps(earlier))
        later = FailureRecorder(str(tmp_path)).writer.write(
            stem, ".json", {"signature": "2 of 6 outputs", "report": "run 2"}
        )
        assert (later == path) is taken, (writer, later)
        assert read_record(path)["report"] == ("run 2" if taken else "run 1")
        for extra in tmp_path.glob(f"{stem}-*.json"):
            extra.unlink()


def test_a_later_run_updates_an_earlier_runs_file_of_its_finding_and_keeps_one_of_another(tmp_path):
    """An earlier run's writer is gone: its file of the same finding is updated in place, one of
    another finding is kept (a new user's later run wrote its cumprod finding over the cummax one)."""

    from shardfuzz.engine.failures import FailureRecorder
    from shardfuzz.engine.filewriter import read_record

    stem = "t-i-gloo-rank-error"
    earlier = {"signature": "cummax backward", "report": "run 1", "writer": _dead_writer()}
    (tmp_path / f"{stem}.json").write_text(json.dumps(earlier))
    later = FailureRecorder(str(tmp_path)).writer
    other = later.write(stem, ".json", {"signature": "cumprod backward", "report": "run 2"})
    assert os.path.basename(other) == f"{stem}-2.json"
    assert read_record(str(tmp_path / f"{stem}.json"))["report"] == "run 1"  # kept
    (tmp_path / f"{stem}.json").write_text(json.dumps(earlier))
    same = FailureRecorder(str(tmp_path)).writer.write(
        stem, ".json", {"signature": "cummax backward", "report": "run 3"}
    )
    assert os.path.basename(same) == f"{stem}.json" and read_record(same)["report"] == "run 3"
    assert sorted(os.listdir(tmp_path)) == [f"{stem}-2.json", f"{stem}.json"]


def test_a_run_that_took_over_an_earlier_file_and_shrank_to_another_finding_gives_it_back(tmp_path):
    """A run's first failing example had the signature of an earlier run's file, so the run took
    that file over; its shrink then reached another signature. The earlier finding was written over
    in place, silently. The file now gets it back, as it was, and the run goes on under the next
    name; coming back to the earlier finding, it takes that file over again (one file of a
    finding, never two: a new user's second campaign left two files of one finding)."""

    from shardfuzz.engine.failures import FailureRecorder
    from shardfuzz.engine.filewriter import read_record

    stem = "t-i-gloo-rank-error"
    first, second = str(tmp_path / f"{stem}.json"), str(tmp_path / f"{stem}-2.json")
    earlier = {"signature": "cummax backward", "report": "run 1", "writer": _dead_writer()}
    (tmp_path / f"{stem}.json").write_text(json.dumps(earlier))
    run = FailureRecorder(str(tmp_path)).writer
    assert run.write(stem, ".json", {"signature": "cummax backward", "report": "first example"}) == first
    assert read_record(first)["report"] == "first example"  # the same finding: its file, taken over
    drifted = run.write(stem, ".json", {"signature": "cumprod backward", "report": "shrunk"})
    assert drifted == second and read_record(second)["report"] == "shrunk"
    assert read_record(first) == earlier  # as it was: its writer too, so a later run of it updates it
    assert run.write(stem, ".json", {"signature": "cumprod backward", "report": "smaller"}) == second
    back = run.write(stem, ".json", {"signature": "cummax backward", "report": "shrunk back"})
    assert back == first and read_record(first)["report"] == "shrunk back"
    assert sorted(os.listdir(tmp_path)) == [f"{stem}.json"]
    # the recorder's rewrite (a finished shrink, a file held at the end of a run) does the same,
    # and the recorder follows the finding to its file
    for name in os.listdir(tmp_path):
        os.remove(tmp_path / name)
    (tmp_path / f"{stem}.json").write_text(json.dumps(earlier))
    recorder = FailureRecorder(str(tmp_path))
    run = recorder.writer
    assert run.write(stem, ".json", {"signature": "cummax backward", "report": "first example"}) == first
    assert run.rewrite(first, {"signature": "cumprod backward", "report": "finished"}) == second
    assert read_record(first) == earlier and read_record(second)["report"] == "finished"
    recorder.moved[first] = second
    assert recorder.where(first) == second
    # a shrink that reaches the finding of another earlier file moves there: the first one is
    # restored in place
    other = {"signature": "cumsum backward", "report": "run 0", "writer": _dead_writer()}
    for name in os.listdir(tmp_path):
        os.remove(tmp_path / name)
    (tmp_path / f"{stem}.json").write_text(json.dumps(earlier))
    (tmp_path / f"{stem}-2.json").write_text(json.dumps(other))
    run = FailureRecorder(str(tmp_path)).writer
    assert run.write(stem, ".json", {"signature": "cummax backward", "report": "first"}) == first
    moved = run.write(stem, ".json", {"signature": "cumsum backward", "report": "shrunk"})
    assert moved == second and read_record(moved)["report"] == "shrunk"
    assert read_record(first) == earlier
    assert sorted(os.listdir(tmp_path)) == [f"{stem}-2.json", f"{stem}.json"]


def test_a_repeat_whose_shrink_drifted_off_a_taken_file_removes_its_own_file_not_the_one_given_back(tmp_path):
    """A new user's second campaign: a finding found again took over the first campaign's file of
    it; finishing its shrink after the deadline drifted to another signature, so the file was given
    back and the writes went on under a new name; the drifted finding was then a repeat of another
    one, and dropping it removed the file given back (the first campaign's finding, lost) and left
    the new one (a duplicate)."""

    from shardfuzz.engine.failures import FailureRecorder
    from shardfuzz.engine.filewriter import boot_id, host_id, read_record

    stem = "t-i-gloo-mismatch"
    first, second, third = (str(tmp_path / f"{stem}{n}.json") for n in ("", "-2", "-3"))
    earlier = {"signature": "w2", "report": "campaign 1", "writer": _dead_writer()}
    # the b2 finding's file is held (here: by a live writer; in the campaign, by its run)
    other = {
        "signature": "b2",
        "report": "campaign 1",
        "writer": f"{host_id()}:{boot_id()}:{os.getppid()}:abc",
    }
    (tmp_path / f"{stem}.json").write_text(json.dumps(earlier))
    (tmp_path / f"{stem}-2.json").write_text(json.dumps(other))
    recorder = FailureRecorder(str(tmp_path))
    assert recorder.writer.write(stem, ".json", {"signature": "w2", "report": "found again"}) == first
    drifted = recorder.writer.rewrite(first, {"signature": "b2", "report": "finished shrink"})
    assert drifted == third and read_record(first) == earlier  # given back, as it was
    recorder.moved[first] = drifted  # as FailureRecorder.write records it
    recorder.discard(first)  # the drifted finding: a repeat of the b2 one
    assert read_record(first) == earlier and read_record(second) == other, sorted(os.listdir(tmp_path))
    assert not os.path.exists(third)  # the repeat's own file
    # a file that holds another writer's record is never removed, whatever path names it
    recorder.discard(second)
    assert read_record(second) == other
    # a repeat that did not drift, in a file it took over: the earlier run's finding gets it back
    recorder = FailureRecorder(str(tmp_path))
    assert recorder.writer.write(stem, ".json", {"signature": "w2", "report": "found again"}) == first
    recorder.discard(first)
    assert read_record(first) == earlier, sorted(os.listdir(tmp_path))


def test_a_later_runs_file_moved_onto_an_earlier_campaigns_file_of_its_finding_keeps_its_created(tmp_path):
    """A later run writes to a file of its own (``.run2.json``) and is moved to the key's name
    when it is settled: onto the earlier campaign's file of the same finding, whose ``created``
    (when the file was first written) was reset to the later run's."""

    from shardfuzz.engine.failures import FailureRecorder
    from shardfuzz.engine.filewriter import read_record

    stem = "t-i-gloo-mismatch"
    earlier = {
        "signature": "w2",
        "report": "campaign 1",
        "created": "2026-01-01T00:00:00+00:00",
        "writer": _dead_writer(),
    }
    (tmp_path / f"{stem}.json").write_text(json.dumps(earlier))
    writer = FailureRecorder(str(tmp_path)).writer
    run2 = writer.write(stem, ".run2.json", {"signature": "w2", "report": "campaign 2, run 2"})
    moved = writer.move(run2, stem, ".json")
    assert os.path.basename(moved) == f"{stem}.json", sorted(os.listdir(tmp_path))
    assert read_record(moved)["report"] == "campaign 2, run 2"
    assert read_record(moved)["created"] == earlier["created"]


def test_a_finding_on_file_past_a_gap_in_the_names_is_updated_not_written_twice(tmp_path):
    """The names of a key had a gap (a file removed: ``-2`` missing): the search for an earlier
    file of the same finding stopped there, and a new user's second campaign wrote ``-2`` beside
    the first campaign's ``-3`` of the same finding."""

    from shardfuzz.engine.failures import FailureRecorder
    from shardfuzz.engine.filewriter import boot_id, host_id, read_record

    stem = "t-i-gloo-mismatch"
    live = {"signature": "b2", "report": "held", "writer": f"{host_id()}:{boot_id()}:{os.getppid()}:abc"}
    earlier = {"signature": "w2", "report": "campaign 1", "writer": _dead_writer()}
    (tmp_path / f"{stem}.json").write_text(json.dumps(live))
    (tmp_path / f"{stem}-3.json").write_text(json.dumps(earlier))
    writer = FailureRecorder(str(tmp_path)).writer
    path = writer.write(stem, ".json", {"signature": "w2", "report": "campaign 2"})
    assert os.path.basename(path) == f"{stem}-3.json" and read_record(path)["report"] == "campaign 2"
    assert sorted(os.listdir(tmp_path)) == [f"{stem}-3.json", f"{stem}.json"]


@linux
def test_a_full_disk_leaves_no_partial_file_and_warns_once(writers):
    """RLIMIT_FSIZE of 1000 bytes: every write of a ~2.3 kB failure file fails part way."""
    root, scenarios = writers
    (result,) = scenarios["full"]
    err = result["stderr"]
    assert os.listdir(root / "full") == []  # no truncated temporary file
    path = str(root / "full" / "toy-wrong_rank1-gloo-mismatch.json")
    assert result["errors"] and result["written"] == []
    warnings = [line for line in err.splitlines() if "could not write the failure file" in line]
    assert len(warnings) == 1, err  # once, not once per update
    assert re.search(
        rf"{re.escape(repr(path))}: \[Errno 27\] File too large; \d+ bytes did not fit", warnings[0]
    )


# -- item 8: the CLI's summary shows the external faults and leaks it counted -----------------------
def test_the_cli_summary_shows_external_faults_and_leaks(tmp_path):
    from shardfuzz.frontends.testing import run_cli

    marker = os.environ["SHARDFUZZ_FAILURES_DIR"] + ".killed-once"  # rank 1 is killed until it exists
    if os.path.exists(marker):
        os.remove(marker)
    out = run_cli("fuzz", TOY, "--impl", "killed_once_and_leaky", "--max-examples", "8", "--world-sizes", "2")
    assert out.returncode == 0, out.stdout + out.stderr
    assert "external faults set aside (a rank died, and the case passed on fresh ranks): 1" in out.stdout
    assert re.search(
        r"leaks \(not findings; .*rank [01] left os.environ\['SHARDFUZZ_TOY_LEAKED'\] = '1'", out.stdout
    )


# -- item 4: benchmarks/stress.py runs each planted check as the suite does -------------------------
def test_stress_passes_each_planted_checks_exclude_like_the_suite(monkeypatch):
    """Without the declared ``exclude`` the stress check ran into the known failures and called
    the planted bug missed (three false "missed findings")."""
    import argparse
    import importlib.util

    spec = importlib.util.spec_from_file_location(
        "stress", os.path.join(DATA, "..", "..", "benchmarks", "stress.py")
    )
    stress = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(stress)
    checks = [c for c in stress.planted_checks(set()) if c[2].expect.exclude]
    assert checks  # planted hang/rank-error checks that declare known failures exist
    seen = {}

    def fake_run(target, impl, **kw):
        seen[f"{target}/{impl}"] = kw.get("exclude")
        return shardfuzz.engine.search.Result(target, impl, "gloo", found=False)

    monkeypatch.setattr(shardfuzz, "run", fake_run)
    only = [f"{t}/{i}" for t, i, _ in checks]
    args = argparse.Namespace(only=only, skip_planted=False, skip_references=True)
    stress.run_checks(args)
    assert seen == {f"{t}/{i}": rec.expect.exclude for t, i, rec in checks}


def test_a_gloo_abort_reports_the_aborting_ranks_first_lines_and_the_peers_closed_connection():
    """torch's context-parallel ring aborts on an uneven sequence (its expected failure): the
    aborting rank's stderr keeps its head (the 'terminate called after throwing' line comes before
    the noise) and the peer's error is shown too."""
    case = Case(
        target="ring_attention",
        world_size=2,
        mesh=(2,),
        sizes={"batch": 1, "seq": 3, "heads": 1, "head_dim": 1},
        split=("seq",),
        dtype="float32",
        options={"variant": "full", "logit_scale": 1.0, "lse_grad": False},
    )
    with pytest.raises(shardfuzz.Finding) as e:
        Runner("ring_attention", "torch_cp_ring").run_case(case)
    report = e.value.report
    assert e.value.kind == "rank-error", report
    assert "terminate called after throwing" in report and "EnforceNotMet" in report, report
    assert "Connection closed by peer" in report or "Connection reset" in report, report


def test_a_finding_of_another_target_file_of_the_same_name_gets_a_file_of_its_own(tmp_path):
    """A copy of a target in another folder (one name, two files) found the same bug: its run took
    the earlier run's file over, and the regression recorded from the first folder was lost (a new
    user's pytest audit). A finding is the same one only of the same target and implementation."""

    from shardfuzz.engine.failures import FailureRecorder
    from shardfuzz.engine.filewriter import boot_id, host_id, read_record

    gone = _gone()
    stem = "row_linear-bug-gloo-mismatch"
    first = {
        "signature": "1 of 4 outputs",
        "target": "row_linear",
        "target_ref": "/p/tests/row_linear.py::row_linear",
        "impl_ref": "/p/tests/row_linear.py::bug",
        "report": "run 1",
        "writer": f"{host_id()}:{boot_id()}:{gone}:abc",
    }
    (tmp_path / f"{stem}.json").write_text(json.dumps(first))
    copy = {
        **first,
        "target_ref": "/p/alt/row_linear.py::row_linear",
        "impl_ref": "/p/alt/row_linear.py::bug",
    }
    copy.pop("writer")
    path = FailureRecorder(str(tmp_path)).writer.write(stem, ".json", {**copy, "report": "run 2"})
    assert os.path.basename(path) == f"{stem}-2.json"
    assert read_record(str(tmp_path / f"{stem}.json"))["report"] == "run 1"  # kept
    # the same target file's later run still updates its own file
    same = FailureRecorder(str(tmp_path)).writer.write(stem, ".json", {**first, "report": "run 3"})
    assert os.path.basename(same) == f"{stem}.json" and read_record(same)["report"] == "run 3"
