"""A verdict survives deadlines, Ctrl-C and SIGTERM, and ``--duration`` is a bound; ``--jobs``
children die with their parent. Every wait here has a deadline."""

import json
import os
import re
import signal
import sys
import time

import pytest

import shardfuzz
from shardfuzz.engine.hooks import StickyInterrupt, TimeUp
from shardfuzz.frontends.testing import run_cli

TOY = os.path.join(os.path.dirname(__file__), "data", "toy_target.py")

linux_only = pytest.mark.skipif(sys.platform != "linux", reason="reads /proc to find leftover processes")


def failing(line: str) -> bool:
    """A progress line that counts at least one failing example."""
    return line.lstrip().startswith("[") and re.search(r", [1-9]\d* failing", line) is not None


@pytest.mark.timing
def test_python_api_keeps_the_finding_when_the_deadline_cuts_shrinking_short(slack):
    # every case of hang_rank0 hangs (1.2-2 s each at a 1 s timeout, a fresh pool after each), and
    # after a first bug Hypothesis runs at least 10 examples: a 6 s deadline always falls before it
    # is done. The forkserver starts first, outside the deadline: on a loaded machine its start
    # (import torch and more) alone can take 3-5 s, and no hang was found at all in a 3 s deadline
    warm = shardfuzz.run(TOY, "reference", max_examples=2, profile="shardfuzz-ci", database=None)
    assert not warm.found, warm.report
    t0 = time.monotonic()
    res = shardfuzz.run(TOY, "hang_rank0", timeout=1, deadline=6, profile="shardfuzz-ci", database=None)
    assert res.found and res.kind == "hang" and res.shrink_cut_short and res.out_of_time, res
    assert not res.interrupted and res.case is not None and res.stats.failures >= 1
    assert "shrinking was cut short" in res.report and "Rerun this case" in res.report
    assert time.monotonic() - t0 < (6 + 15) * slack


@pytest.mark.timing
def test_duration_deadline_during_shrinking_exits_1_with_the_finding(tmp_path, slack):
    # in this process (run_cli): no signal or process exit is involved; the pools start first,
    # outside the deadline, as in the test above
    warm = shardfuzz.run(TOY, "reference", max_examples=2, profile="shardfuzz-ci", database=None)
    assert not warm.found, warm.report
    t0 = time.monotonic()
    out = run_cli(
        "fuzz", TOY, "--impl", "hang_rank0", "--timeout", "1", "--duration", "3s",
        "--failures-dir", str(tmp_path), "--finish-shrink", "0",  # the cut itself: tests/test_finish.py
    )  # fmt: skip
    assert out.returncode == 1, out.stdout + out.stderr
    assert "FOUND hang (shrinking cut short" in out.stdout
    assert "shrinking was cut short" in out.stdout and "Rerun this case: shardfuzz case" in out.stdout
    assert list(tmp_path.glob("toy-hang_rank0-gloo-hang.json"))
    assert time.monotonic() - t0 < (3 + 30) * slack


@linux_only
@pytest.mark.timing
def test_duration_ends_by_the_deadline_plus_the_grace_whatever_the_timeout(procs, start_cli, tmp_path, slack):
    # a 300 s example timeout, a 2 s duration and a 2 s grace: the hanging example is abandoned
    env = dict(os.environ, SHARDFUZZ_GRACE="2")
    run = start_cli(
        "fuzz", TOY, "--impl", "hang_rank0", "--timeout", "300", "--duration", "2s",
        "--progress-every", "0.5", "--failures-dir", str(tmp_path), env=env,
    )  # fmt: skip
    run.wait_line(lambda line: line.startswith("fuzzing"), 60)
    t0 = time.monotonic()  # the target's 2 s start about now (imports and start-up come before)
    run.wait_line(lambda line: line.lstrip().startswith("["), 60)
    everything = procs.descendants(run.pid)
    code, out, err = run.finish(60)
    took = time.monotonic() - t0
    assert code == 0, out + err  # nothing was found: the hang was never confirmed
    assert "an example still running after the deadline was abandoned" in out
    assert took < (2 + 2 + 15) * slack, took  # the duration, the grace, and stopping the ranks
    assert procs.wait_gone(everything) == []


@pytest.mark.parametrize("value", ["nan", "inf", "1e999", "0", "0s", "-5", "=-1m", "soon"])
def test_bad_duration_is_a_usage_error_naming_it(value):
    args = (
        ["fuzz", TOY, f"--duration{value}"] if value.startswith("=") else ["fuzz", TOY, "--duration", value]
    )
    out = run_cli(*args)
    assert out.returncode == 2, out.stdout + out.stderr
    assert "--duration" in out.stderr and "Traceback" not in out.stderr


def test_bad_grace_is_a_usage_error_naming_it():
    out = run_cli("fuzz", TOY, "--duration", "5s", env={"SHARDFUZZ_GRACE": "soon"})
    assert out.returncode == 2, out.stdout + out.stderr
    assert "SHARDFUZZ_GRACE='soon'" in out.stderr


@linux_only
def test_ctrl_c_after_a_finding_prints_it_and_exits_1(procs, start_cli, tmp_path):
    # SIGTERM turns into the same KeyboardInterrupt (frontends/jobs.py): tests/test_failures.py
    # sends it to a campaign before any finding
    run = start_cli(
        "fuzz", TOY, "--impl", "hang_rank0", "--timeout", "1", "--duration", "300s",
        "--progress-every", "0.5", "--failures-dir", str(tmp_path),
    )  # fmt: skip
    run.wait_line(failing, 90)  # found; Hypothesis is still running examples or shrinking
    everything = procs.descendants(run.pid)
    run.signal(signal.SIGINT)
    code, out, err = run.finish(60)
    assert code == 1, out + err
    assert "Rerun this case: shardfuzz case" in out and "(interrupted)" in out
    assert "FOUND hang (shrinking cut short" in out and "interrupted" in err
    # the finding's own lines and its failure file say so too (a new user's later run's finding,
    # cut by Ctrl-C, read as a distinct minimal one)
    assert "shrinking cut short (interrupted): the smallest case found so far" in out, out
    (path,) = tmp_path.glob("toy-hang_rank0-gloo-hang.json")
    assert "shrinking was cut short" in json.loads(path.read_text())["report"]
    assert procs.wait_gone(everything) == []


def test_jobs_start_while_they_fit_the_parallel_limit_and_the_rank_budget():
    from shardfuzz.frontends.jobs import _jobs_to_start

    assert _jobs_to_start([0, 1, 2], {}, [3, 2, 1], 4, 3) == [0, 2]  # a later, smaller job fits
    assert _jobs_to_start([0, 1, 2], {}, [1, 1, 1], 4, 2) == [0, 1]  # at most 2 at once
    assert _jobs_to_start([0, 1], {}, [8, 1], 4, 2) == [0]  # larger than the budget: alone
    assert _jobs_to_start([1], {0: None}, [8, 1], 4, 2) == []  # ... and nothing beside it
    assert _jobs_to_start([1, 2], {0: None}, [3, 2, 1], 4, 3) == [2]


def _start_jobs(start_cli, tmp_path):
    run = start_cli(
        "fuzz", TOY, "tp_mlp", "--jobs", "2", "--rank-budget", "4", "--world-sizes", "1,2",
        "--duration", "300s", "--progress-every", "0.5", "--failures-dir", str(tmp_path),
    )  # fmt: skip
    started = set()
    while started != {"1", "2"}:  # both children are fuzzing: their ranks are up
        line = run.wait_line(lambda ln: re.match(r"\[job (\d)\] \[", ln) is not None, 120)
        started.add(re.match(r"\[job (\d)\]", line).group(1))
    return run


@linux_only
@pytest.mark.slow  # --jobs runs with pytest -m slow (~12 s); single-process signal tests stay in ci
def test_sigterm_of_a_jobs_parent_stops_every_child_and_rank(procs, start_cli, tmp_path):
    run = _start_jobs(start_cli, tmp_path)
    everything = procs.descendants(run.pid)
    assert len(everything) >= 4  # two children, their forkservers and ranks
    run.signal(signal.SIGTERM)
    code, out, err = run.finish(90)
    assert code == 130, out + err  # nothing found: the references are right
    assert "interrupted" in err and "toy" in out.split("target ")[-1]
    assert procs.wait_gone(everything, 30) == []


@linux_only
@pytest.mark.slow  # --jobs runs with pytest -m slow (~11 s); tests/test_lifecycle.py: a SIGKILLed driver
def test_sigkill_of_a_jobs_parent_leaves_no_process(procs, start_cli, tmp_path):
    run = _start_jobs(start_cli, tmp_path)
    everything = procs.descendants(run.pid)
    assert len(everything) >= 4
    run.signal(signal.SIGKILL)
    run.finish(30)
    assert procs.wait_gone(everything, 30) == []


@pytest.mark.parametrize("stop", [TimeUp, KeyboardInterrupt], ids=["deadline", "ctrl-c"])
def test_stopped_in_the_middle_of_shrinking_keeps_the_smallest_case_so_far(stop):
    from hypothesis import Verbosity

    from shardfuzz.engine.settings import build_settings

    class StopWhileShrinking(shardfuzz.RunHooks):
        """Stops the run at the third finding: with one bug reported, Hypothesis shrinks right
        after the first, so the second and third are shrinking's tries."""

        def __init__(self):
            self.failing = []

        def on_finding(self, context, finding):
            self.failing.append(context.case)

        def before_example(self, runner, case):
            if len(self.failing) >= 3:
                raise stop()

    s = build_settings(
        "shardfuzz-ci", max_examples=200, report_multiple_bugs=False, verbosity=Verbosity.quiet
    )
    hook = StopWhileShrinking()
    res = shardfuzz.run(TOY, "wrong_rank1", settings=s, database=None, hooks=[hook])
    assert res.found and res.kind == "mismatch" and res.shrink_cut_short, res
    assert res.interrupted == (stop is KeyboardInterrupt) and res.out_of_time == (stop is TimeUp)
    assert res.case in hook.failing and len(hook.failing) == 3
    assert res.case.world_size == min(c.world_size for c in hook.failing)  # the smallest so far
    assert "shrinking was cut short" in res.report and "Rerun this case" in res.report


def test_a_campaign_started_with_sigint_ignored_keeps_its_finding_on_sigterm(procs, start_process, tmp_path):
    """``cmd &`` in a script, nohup, CI runners: SIGINT ignored, then SIGTERM after a finding. It
    exited 130 with "shardfuzz: interrupted" and no report: the SIGTERM's pending interrupt was
    raised again after the search."""
    ignore = (
        "import os, signal, sys; signal.signal(signal.SIGINT, signal.SIG_IGN); "
        "os.execv(sys.executable, [sys.executable, '-m', 'shardfuzz.frontends.cli', *sys.argv[1:]])"
    )
    run = start_process([
        sys.executable, "-c", ignore, "fuzz", "ring_allreduce", "--impl", "floor_chunks",
        "--duration", "120s", "--progress-every", "0.5", "--failures-dir", str(tmp_path),
    ])  # fmt: skip
    run.wait_line(failing, 90)
    everything = procs.descendants(run.pid)
    run.signal(signal.SIGTERM)
    code, out, err = run.finish(90)
    assert code == 1, out + err
    assert "FOUND mismatch" in out and "Rerun this case: shardfuzz case" in out, out + err
    # (Python may print "Exception ignored in: ... gc_callback": the SIGTERM's KeyboardInterrupt
    # raised inside a garbage-collector callback, which StickyInterrupt acts on later)
    assert "Unsatisfiable" not in err, err
    assert procs.wait_gone(everything) == []


def test_an_error_raised_while_an_interrupt_was_handled_counts_as_the_interrupt():
    """A SIGTERM's KeyboardInterrupt landed in Hypothesis' own bookkeeping (seen once in the ci
    suite: the campaign test above); Hypothesis' cleanup then raised "IndexError: pop from empty
    list", and the campaign ended as the fuzzer's own failure with its finding lost."""
    from shardfuzz.engine.search import _stopped_by

    def raised(inner: BaseException | None) -> BaseException:
        try:
            try:
                if inner is not None:
                    raise inner
            finally:
                raise IndexError("pop from empty list")
        except IndexError as e:
            return e

    assert _stopped_by(raised(KeyboardInterrupt())) == "interrupted"
    assert _stopped_by(raised(TimeUp())) == "deadline"
    assert _stopped_by(raised(None)) is None  # an error of its own stays one
    assert _stopped_by(raised(ValueError("x"))) is None


def test_a_sigterm_is_acted_on_once_where_sigint_is_ignored():
    """``cmd &`` in a script, nohup and some CI runners start shardfuzz with SIGINT ignored: the
    search then leaves SIGINT alone, and the interrupt a SIGTERM left pending (jobs.py) was never
    cleared, so the 1-rank try after the search raised it again and the campaign's report was lost
    ("shardfuzz: interrupted", exit 130, after a finding)."""
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        with StickyInterrupt.armed():
            StickyInterrupt.pending = True  # what the SIGTERM handler leaves beside its KeyboardInterrupt
        try:
            StickyInterrupt.check()  # acted on inside: not raised again
        except KeyboardInterrupt:
            pytest.fail("the interrupt the search acted on was raised again after it")
        assert signal.getsignal(signal.SIGINT) is signal.SIG_IGN  # still ignored: not ours to change
    finally:
        StickyInterrupt.pending = False
        signal.signal(signal.SIGINT, previous)


def test_a_job_hears_its_parents_sigint_where_it_inherited_sigint_ignored():
    """``--workers N`` stops its jobs with SIGINT. A parent started with SIGINT ignored (``cmd &``
    in a script, nohup) passed that on to its jobs, so a SIGTERM to it waited 30 s, killed them,
    and its summary had no rows (measured: exit 130 after 30.4 s, no row; 1.3-5.6 s and every row
    with it). A job takes SIGINT as Ctrl-C again as it starts (a plain process: no torch)."""
    import subprocess

    code = (
        "import os, signal, time; signal.signal(signal.SIGINT, signal.SIG_IGN)\n"
        "from shardfuzz.frontends.jobs import die_with_parent\n"
        "die_with_parent(os.getppid())\n"
        "try:\n"
        "    os.kill(os.getpid(), signal.SIGINT); time.sleep(10)  # ignored: prints nothing\n"
        "except KeyboardInterrupt:\n"
        "    print('interrupted')\n"
    )
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert res.stdout.strip() == "interrupted", res.stdout + res.stderr


def test_a_ctrl_c_swallowed_between_a_campaigns_runs_stops_it_as_interrupted(monkeypatch):
    """Python prints a KeyboardInterrupt raised inside a garbage-collector callback as "ignored" and
    drops it. Between a campaign's runs SIGINT had its default handler, so such a Ctrl-C was lost
    entirely: a new user's fleet worker went on to its next run and said "finished"."""
    import io

    from shardfuzz.engine.config import RunConfig
    from shardfuzz.frontends import campaign

    real, runs = campaign.search, []

    def search_then_a_swallowed_ctrl_c(runner, settings, **kwargs):  # runs of 5 examples
        result = real(runner, type(settings)(settings, max_examples=5), **kwargs)
        runs.append(result)
        if len(runs) == 1:
            try:  # what a gc callback does with the handler's KeyboardInterrupt: print it, drop it
                signal.getsignal(signal.SIGINT)(signal.SIGINT, None)
            except KeyboardInterrupt:
                pass
        return result

    monkeypatch.setattr(campaign, "search", search_then_a_swallowed_ctrl_c)
    t0 = time.perf_counter()
    out = campaign.fuzz_one(TOY, "reference", RunConfig(deadline=60), stream=io.StringIO())
    assert out.interrupted and len(runs) == 1, (out.interrupted, len(runs))
    assert time.perf_counter() - t0 < 45  # stopped, not fuzzed to its deadline
    assert not StickyInterrupt.pending and signal.getsignal(signal.SIGINT) is signal.default_int_handler


def test_an_interrupt_that_lands_while_a_finding_is_handled_keeps_the_finding(tmp_path):
    """A SIGTERM that landed while the runner's hooks wrote a finding's failure file, before the
    search had seen the finding: the campaign ended "interrupted" (exit 130) with its finding in a
    file and not in the report (once in clean-ci: the SIGINT-ignored campaign test above). The
    interrupt is raised here from a hook, as the signal handler raises it."""
    from shardfuzz import Mismatch

    class Interrupts(shardfuzz.RunHooks):
        def on_finding(self, context, finding):
            raise KeyboardInterrupt  # as the SIGTERM handler raises it, inside the hooks' loop

    res = shardfuzz.run(
        TOY, "wrong_rank1", profile="shardfuzz-ci", database=None, max_examples=10, world_sizes=(2,),
        hooks=[Interrupts()], failures_dir=str(tmp_path),
    )  # fmt: skip
    assert res.found and res.interrupted and res.shrink_cut_short, res
    assert isinstance(res.failures[0], Mismatch) and "the run was interrupted" in res.report, res.report
