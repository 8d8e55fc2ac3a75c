"""Failure files, replay (CLI and pytest), standalone torchrun reproducers, campaigns."""

import json
import os
import re
import runpy
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time

import pytest
import torch

import shardfuzz
from shardfuzz import Case, Mismatch, Runner
from shardfuzz.engine import failures
from shardfuzz.engine.failures import FailureRecorder
from shardfuzz.frontends.testing import run_cli
from shardfuzz.ranks.trace import Collective

TOY = os.path.join(os.path.dirname(__file__), "data", "toy_target.py")
pytest_plugins = ["pytester"]


def torchrun(*args):
    # torch's launcher module of this interpreter: a ``torchrun`` first on PATH may belong to
    # another Python (a venv made with --system-site-packages finds the system one)
    return subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", *args],
        capture_output=True,
        text=True,
        timeout=180,
        env=dict(os.environ, OMP_NUM_THREADS="1"),
    )


def cli(*args, timeout=300, cwd=None):
    return run_cli(*args, cwd=cwd)  # in this process: no second import of torch


@pytest.fixture(scope="module")
def found(tmp_path_factory):
    """A shrunk failure of tp_mlp/missing_allreduce, written by a real run."""
    d = tmp_path_factory.mktemp("failures")
    res = shardfuzz.run(
        "tp_mlp",
        "missing_allreduce",
        profile="shardfuzz-ci",
        database=None,
        max_examples=30,
        failures_dir=str(d),
    )
    assert res.found
    (path,) = d.glob("*.json")
    return res, str(path)


def test_failure_file_holds_the_shrunk_case_and_everything_to_replay_it(found):
    res, path = found
    rec = json.loads(open(path).read())
    assert rec["format"] == "shardfuzz-failure" and rec["version"] == 1
    assert Case.from_dict(rec["case"]) == res.case  # updated while shrinking: ends at the minimal case
    assert rec["updates"] >= 1
    assert rec["target"] == "tp_mlp" and rec["impl_ref"] == "shardfuzz.targets.tp_mlp:reference"
    assert rec["impl_kwargs"] == {"bug": "missing_allreduce"}
    assert rec["backend"] == "gloo" and rec["device"] == "cpu" and rec["kind"] == "mismatch"
    assert rec["report"].startswith("shardfuzz: 1 of 6 outputs mismatch")
    assert len(rec["inputs_sha256"]) == 64 and len(rec["impl_source_sha256"]) == 64
    assert rec["tolerance"]["noise_factor"] == 4.0 and "Monte-Carlo" in rec["tolerance"]["policy"]
    assert "cuda_matmul_allow_tf32" in rec["numerics"]["driver"]
    assert "deterministic_algorithms" in rec["numerics"]["rank0"]
    assert set(rec["versions"]) >= {"torch", "shardfuzz", "hypothesis", "python"}
    # the collective trace: the f operator's backward all-reduce on every rank (the bug drops g's)
    trace = {int(r): [Collective.from_json(c) for c in t] for r, t in rec["trace"].items()}
    assert sorted(trace) == list(range(res.case.world_size))
    assert all([c.op for c in t] == ["all_reduce"] for t in trace.values()), trace
    assert "collectives: every rank entered the same sequence" in rec["report"]
    # every field written is one the schema checks and the reference documents (a new user found an
    # undocumented one naming their machine)
    from shardfuzz.engine.failure_schema import SCHEMA

    assert set(rec) <= set(SCHEMA), set(rec) - set(SCHEMA)
    assert socket.gethostname() not in rec["writer"].split(":"), rec["writer"]


def test_file_is_written_at_the_first_failure(tmp_path):
    # no Hypothesis here: a single failing example must already leave its file behind
    runner = Runner(TOY, "wrong_rank1", hooks=[FailureRecorder(str(tmp_path))])
    case = Case(target="toy", world_size=2, mesh=(2,), sizes={"n": 3}, split=("n",))
    with pytest.raises(Mismatch):
        runner.run_case(case)
    (path,) = tmp_path.glob("*.json")
    # the file lies in tmp_path, outside the project: trusted explicitly (docs/trust.md)
    assert failures.load(str(path), trust_refs=True)["case"] == case


def test_a_replay_runs_a_passing_case_again_and_says_an_intermittent_failure(tmp_path):
    """A new user's async DDP whose last bucket's handle was never waited on passed 1 replay in 6,
    and one passing replay read as the bug fixed: a pass is run again (3 runs in all)."""
    import random

    from shardfuzz.repro.replay import REPLAY_RUNS, replay_one
    from shardfuzz.spec.tolerance import OutputTolerance, Tolerance

    impl = os.path.join(os.path.dirname(__file__), "data", "toy_impls.py") + "::fails_every_other_run"
    seed = random.randrange(2**40)  # the runs are counted in a file named after it
    counter = os.path.join(tempfile.gettempdir(), f"shardfuzz-every-other-{seed}")
    try:
        runner = Runner(TOY, impl, hooks=[FailureRecorder(str(tmp_path))])
        case = Case(target="toy", world_size=2, mesh=(2,), sizes={"n": 3}, split=("n",), seed=seed)
        with pytest.raises(Mismatch):
            runner.run_case(case)  # run 1 fails: the file
        (path,) = tmp_path.glob("*.json")
        replayed = replay_one(failures.load(str(path), trust_refs=True))  # run 2 passes, run 3 fails
        assert replayed.failed and replayed.status == "still fails", replayed
        assert "it passed 1 run(s) first, then failed on run 2: intermittent" in replayed.note, replayed.note
        assert REPLAY_RUNS == 3
        # allowed to be off by one, it passes every run: said so
        loose = Tolerance(per_output={"total": OutputTolerance(atol=2.0)})
        passes = replay_one(failures.load(str(path), trust_refs=True), tolerance=loose)
        assert not passes.failed and passes.status == "now passes", passes
        assert "(passed 3 runs of 3)" in passes.note, passes.note
    finally:
        if os.path.exists(counter):
            os.remove(counter)


def test_replay_still_fails_now_passes_and_different_inputs(found, tmp_path):
    _, path = found
    out = cli("replay", path)
    assert out.returncode == 1, out.stdout + out.stderr
    assert "STILL FAILS (mismatch; was mismatch)" in out.stdout

    rec = json.loads(open(path).read())
    fixed = dict(rec, impl_kwargs={})
    (tmp_path / "fixed.json").write_text(json.dumps(fixed))
    out = cli("replay", str(tmp_path / "fixed.json"))
    # the reference ran, not missing_allreduce: no fix, and not exit 0 (a new user's edited file
    # read as "now passes" beside the note)
    assert out.returncode == 1, out.stdout
    assert "passes, but ran ANOTHER IMPLEMENTATION than the one the file names (not a fix)" in out.stdout
    assert "source or bound arguments changed" in out.stdout
    # what ran is said: the file's impl_ref, not the implementation the target calls by that name
    # (a new user's edited impl_ref read as "double_divide now passes")
    assert (
        "(what ran is the file's impl_ref shardfuzz.targets.tp_mlp:reference, not the target's "
        "implementation missing_allreduce, which is shardfuzz.targets.tp_mlp:reference(bug='missing_allreduce'))"
    ) in out.stdout, out.stdout

    moved = dict(rec, inputs_sha256="0" * 64)
    (tmp_path / "moved.json").write_text(json.dumps(moved))
    out = cli("replay", str(tmp_path / "moved.json"))
    assert out.returncode == 1 and "DIFFERENT INPUTS" in out.stdout

    out = cli("replay", str(tmp_path))  # a directory: every file in it
    assert (
        out.returncode == 1
        and ("2 replayed: 1 fail, 1 pass; 1 of the passes ran another implementation than the file names")
        in out.stdout
    ), out.stdout
    # the same implementation moved (its file elsewhere, the same function and arguments): a pass
    # is a pass
    from shardfuzz.protocol import ImplRef
    from shardfuzz.repro.replay import other_implementation
    from shardfuzz.spec.registry import get_target

    moved_impl = ImplRef("/elsewhere/targets/tp_mlp.py::reference", (("bug", "missing_allreduce"),))
    assert not other_implementation(
        {"impl": "missing_allreduce", "impl_spec": moved_impl}, get_target("tp_mlp")
    )
    edited = ImplRef("/elsewhere/targets/tp_mlp.py::reference", ())
    assert other_implementation({"impl": "missing_allreduce", "impl_spec": edited}, get_target("tp_mlp"))
    # an impl that is no implementation of the target (a file's): its label names the function
    # that ran, or the file was edited (a new user's "/tmp/evil.py::pwn" replayed the reference
    # under that name, "now passes")
    tp = get_target("tp_mlp")
    assert not other_implementation(
        {"impl": "/elsewhere/tp_mlp.py::reference(bug=1)", "impl_spec": moved_impl}, tp
    )
    assert other_implementation({"impl": "/tmp/evil.py::pwn", "impl_spec": moved_impl}, tp)
    # a label that is no reference says nothing of the function: a bound name, a bug renamed since
    assert not other_implementation({"impl": "reference(mean=True)", "impl_spec": moved_impl}, tp)
    assert not other_implementation({"impl": "old_name_of_the_bug", "impl_spec": moved_impl}, tp)

    # a case edited so that it passes (one rank: nothing to all-reduce), on the file's inputs or
    # other ones: exit 1, as regressions() fails it, never 0 (it says nothing of the failure)
    for name in ("fixed.json", "moved.json"):
        (tmp_path / name).unlink()
    one_rank = dict(rec["case"], world_size=1, mesh=[1])
    (tmp_path / "one_rank.json").write_text(json.dumps(dict(rec, case=one_rank)))
    wider = dict(one_rank, sizes=dict(one_rank["sizes"], hidden=one_rank["sizes"]["hidden"] + 1))
    (tmp_path / "wider.json").write_text(json.dumps(dict(rec, case=wider)))
    out = cli("replay", str(tmp_path))
    assert out.returncode == 1, out.stdout + out.stderr
    assert "one_rank.json: tp_mlp/missing_allreduce now passes" in out.stdout
    assert (
        "wider.json: tp_mlp/missing_allreduce ran on DIFFERENT INPUTS (input hash changed) and passes"
        in out.stdout
    )
    assert (
        "2 replayed: 0 fail, 2 pass; 2 of the passes ran other inputs or another case than the file recorded (not a fix)"
        in out.stdout
    )


def test_a_file_whose_label_names_another_function_than_its_impl_ref_says_what_ran(found, tmp_path):
    rec = json.loads(open(found[1]).read())
    (tmp_path / "label.json").write_text(json.dumps(dict(rec, impl="/tmp/evil.py::pwn")))
    out = cli("replay", str(tmp_path / "label.json"))
    assert out.returncode == 1, out.stdout + out.stderr
    assert (
        "(what ran is the file's impl_ref shardfuzz.targets.tp_mlp:reference(bug='missing_allreduce'), not its "
        "impl /tmp/evil.py::pwn, which names another function)"
    ) in out.stdout, out.stdout


def test_nccl_on_the_cpu_is_refused_by_the_schema_naming_both_fields(found, tmp_path):
    """Only an edited file has it: refused before anything runs, as every schema error (it was a
    RunConfig error naming neither file nor field, a traceback under regressions())."""
    rec = json.loads(open(found[1]).read())
    (tmp_path / "nccl.json").write_text(json.dumps(dict(rec, backend="nccl", device="cpu")))
    out = cli("replay", str(tmp_path / "nccl.json"))
    assert out.returncode == 2, out.stdout + out.stderr
    assert str(tmp_path / "nccl.json") in out.stderr
    assert (
        "field 'device' is 'cpu' with field 'backend' 'nccl'; nccl runs on device 'cuda' only" in out.stderr
    )


@pytest.mark.skipif(torch.cuda.device_count() >= 1, reason="a GPU here: gloo on cuda, or nccl, could start")
@pytest.mark.parametrize(
    "edit, error",
    [
        (dict(backend="nccl", device="cuda"), "backend='nccl' needs one CUDA device per rank: world_size=2"),
        # the file's device, not the backend's default one (it ran on the CPU)
        (dict(backend="gloo", device="cuda"), "device='cuda' but no CUDA device is visible"),
    ],
)
def test_the_torchrun_module_says_when_there_is_no_device_for_the_files_ranks(
    found, tmp_path, monkeypatch, capsys, edit, error
):
    """It divided by zero choosing a device (``rank % torch.cuda.device_count()``): now rank 0
    says why, before any process group, and every rank exits 3."""
    from shardfuzz.repro import torchrun as torchrun_module

    rec = json.loads(open(found[1]).read())
    (tmp_path / "gpu.json").write_text(json.dumps(dict(rec, **edit)))
    for name, value in {"WORLD_SIZE": "2", "RANK": "0", "LOCAL_RANK": "0"}.items():
        monkeypatch.setenv(name, value)
    assert torchrun_module.main([str(tmp_path / "gpu.json")]) == 3
    assert error in capsys.readouterr().err


def test_replay_says_which_file_it_runs_and_which_case_ran_when_case_repr_was_edited(found, tmp_path):
    """A new user's edited file: case_repr said batch 4, field 'case' (what runs) batch 2, and
    nothing said so; a replay that ran long printed nothing at all until it ended."""
    _, path = found
    rec = json.loads(open(path).read())
    edited = dict(rec, case_repr=rec["case_repr"].replace("seed=", "seed=99"))
    (tmp_path / "edited.json").write_text(json.dumps(edited))
    out = cli("replay", str(tmp_path / "edited.json"))
    assert out.returncode == 1, out.stdout + out.stderr
    assert "shardfuzz: replaying edited.json ..." in out.stderr
    assert f"(the file's case_repr reads {edited['case_repr']}: that is not the case that ran" in out.stdout
    assert "case_repr reads" not in cli("replay", path).stdout  # an unedited file says nothing
    # and so does a reproducer written from it (a new user's edit went by without a word there)
    out = cli("repro", str(tmp_path / "edited.json"), "-o", str(tmp_path / "repro.py"))
    assert out.returncode == 0, out.stdout + out.stderr
    assert (
        f"shardfuzz: the file's case_repr reads {edited['case_repr']}: that is not the case that the script runs"
        in out.stderr
    )
    assert "case_repr reads" not in cli("repro", path, "-o", str(tmp_path / "plain.py")).stderr


def test_replay_notes_a_change_in_a_helper_the_implementation_calls(tmp_path):
    """The docs' way of writing an implementation keeps its logic in a helper (``off_by_one``
    calls ``_toy_reference``): a fix there changes the file, not the function, and replay says so."""
    for name in ("toy_target.py", "toy_impls.py"):
        shutil.copy(os.path.join(os.path.dirname(TOY), name), tmp_path / name)
    impls = tmp_path / "toy_impls.py"
    runner = Runner(
        str(tmp_path / "toy_target.py"), f"{impls}::off_by_one", hooks=[FailureRecorder(str(tmp_path))]
    )
    with pytest.raises(Mismatch):
        runner.run_case(Case(target="toy", world_size=2, mesh=(2,), sizes={"n": 3}, split=("n",)))
    (path,) = tmp_path.glob("*.json")
    assert len(json.loads(path.read_text())["impl_file_sha256"]) == 64
    out = cli("replay", path, "--trust-refs")
    assert out.returncode == 1 and "changed since" not in out.stdout, out.stdout + out.stderr
    # an edit of the helper only (the modules this process and its ranks loaded stay as they were,
    # so the case still fails: the note is about the file)
    # the same lines (an edit that moves the function shows as a change of its own source)
    edited = impls.read_text().replace("off by ``x2_offset``.", "off by x2_offset (edited).", 1)
    assert edited != impls.read_text()
    impls.write_text(edited)
    out = cli("replay", path, "--trust-refs")
    assert out.returncode == 1 and "(the file that defines the implementation changed since)" in out.stdout, (
        out.stdout + out.stderr
    )
    assert "source or bound arguments changed" not in out.stdout  # the function itself did not
    # a C function has no file to hash: no field, so no note (never a crash of the replay)
    from shardfuzz.protocol import ImplRef

    assert failures.file_hash(ImplRef.from_parts("math:sqrt", {})) is None


@pytest.mark.slow  # a TORCH_DISTRIBUTED_DEBUG=DETAIL replay (~9 s)
def test_replay_with_collective_checking(found):
    out = cli("replay", found[1], "--debug-collectives")
    assert out.returncode == 1 and "STILL FAILS" in out.stdout


@pytest.mark.parametrize(
    "content, message",
    [
        ("not json", "not valid JSON"),
        ("[" * 100_000 + "]" * 100_000, "not valid JSON (maximum recursion depth"),  # a traceback, exit 1
        ('{"format": "something-else"}', "field 'format' is 'something-else'"),
        ('{"format": "shardfuzz-failure", "version": 99}', "format version 99 is newer"),
        ('{"format": "shardfuzz-failure", "version": 1}', "field 'target' is missing"),
    ],
)
def test_bad_failure_files_are_refused_naming_file_and_field(tmp_path, content, message):
    bad = tmp_path / "bad.json"
    bad.write_text(content)
    out = cli("replay", str(bad))
    assert out.returncode == 2, out.stdout + out.stderr
    assert str(bad) in out.stderr and message in out.stderr


def test_an_implementation_of_another_builtin_target_is_refused(found, tmp_path):
    """A tp_mlp record naming moe's reference ran moe's code on the tp_mlp case (KeyError on every
    rank) and reported it as tp_mlp's finding "of a different cause", exit 1."""
    rec = json.loads(open(found[1]).read())
    rec["impl_ref"] = "shardfuzz.targets.moe:reference"
    (tmp_path / "other.json").write_text(json.dumps(rec))
    out = cli("replay", str(tmp_path / "other.json"))
    assert out.returncode == 2, out.stdout + out.stderr
    assert (
        "field 'impl_ref': 'shardfuzz.targets.moe:reference' is code of another built-in target" in out.stderr
    )


def test_bad_case_field_is_named(found, tmp_path):
    rec = json.loads(open(found[1]).read())
    rec["case"]["mesh"] = [3]
    (tmp_path / "bad.json").write_text(json.dumps(rec))
    out = cli("replay", str(tmp_path / "bad.json"))
    assert out.returncode == 2 and "field 'case' is invalid: mesh=(3,) has 3 ranks" in out.stderr


def test_repro_script_runs_on_ranks_started_as_torchrun_starts_them(
    found, tmp_path, monkeypatch, capsys, script_ranks
):
    script = tmp_path / "repro.py"
    out = cli("repro", found[1], "-o", str(script))
    assert out.returncode == 0 and "torchrun --nproc-per-node=2" in out.stdout
    text = script.read_text()
    assert "hypothesis" not in text.lower().replace("does not use hypothesis", "")
    # on 2 ranks with torchrun's environment (tests/data/script_ranks.py, no agent: a script reads
    # only RANK, WORLD_SIZE, LOCAL_RANK and init_process_group's MASTER_*); a script under the real
    # agent: tests/test_standalone.py's torch_scan_negative_dim reproducer
    run = script_ranks.run(2, [script], dict(os.environ, OMP_NUM_THREADS="1"), tmp_path, timeout=180)
    assert run.returncode != 0
    assert "FAIL (mismatch)" in run.stdout and "output 'y'" in run.stdout
    # the wrong world size is refused before any process group: the script as torchrun would
    # start it with one process (a second torchrun costs ~5 CPU-s for this line)
    for name, value in {"WORLD_SIZE": "1", "RANK": "0", "LOCAL_RANK": "0"}.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setattr(sys, "argv", [str(script)])
    with pytest.raises(SystemExit) as exited:
        runpy.run_path(str(script), run_name="__main__")
    assert exited.value.code == 2
    assert "use torchrun --nproc-per-node=2" in capsys.readouterr().err


@pytest.mark.slow  # ~9 s; the real torchrun runs in the ci suite in tests/test_standalone.py and test_rank_servers.py
def test_torchrun_module_replays_a_passing_case(found, tmp_path):
    rec = json.loads(open(found[1]).read())
    (tmp_path / "fixed.json").write_text(json.dumps(dict(rec, impl="reference", impl_kwargs={})))
    run = torchrun("--nproc-per-node=2", "-m", "shardfuzz.repro.torchrun", str(tmp_path / "fixed.json"))
    assert run.returncode == 0, run.stdout + run.stderr
    assert "PASS: worst error/tolerance" in run.stdout


def test_failure_files_become_regression_tests_that_run_first(inprocess, found):
    pytester = inprocess
    _, path = found
    d = pytester.mkdir("failures")
    rec = json.loads(open(path).read())
    (d / "still_broken.json").write_text(json.dumps(rec))
    (d / "fixed.json").write_text(json.dumps(dict(rec, impl="reference", impl_kwargs={})))
    # a file the target's draws no longer admit (an option added since): its reason, no traceback
    (d / "stale.json").write_text(json.dumps(dict(rec, case=dict(rec["case"], options={"added_since": 1}))))
    pytester.makepyfile(
        test_a="def test_plain():\n    pass\n",
        # a planted bug's files replay only when asked (planted=True): tp_mlp/missing_allreduce is one
        test_b=f"import shardfuzz\ntest_regressions = shardfuzz.regressions({str(d)!r}, planted=True)\n",
    )
    # in this process: the order is pytest_collection_modifyitems' (under pytest-xdist it is not)
    result = pytester.runpytest_inprocess("-v", "-p", "no:cacheprovider", "--import-mode=importlib")
    result.assert_outcomes(passed=2, failed=2)
    lines = [ln for ln in result.outlines if "PASSED" in ln or "FAILED" in ln]
    assert "test_regressions[fixed]" in lines[0] and "test_regressions[stale]" in lines[1]
    assert "test_regressions[still_broken]" in lines[2] and "test_plain" in lines[3]
    result.stdout.fnmatch_lines(["*STILL FAILS (mismatch; was mismatch)*"])
    result.stdout.fnmatch_lines(["*stale.json cannot be replayed: *field 'case' is invalid*"])
    stale = result.stdout.str().split("_ test_regressions[stale] _", 1)[1].split("\n_", 1)[0]
    assert "Traceback" not in stale and "failure_load.py" not in stale, stale


def test_regressions_read_the_folder_that_shardfuzz_failures_dir_names(inprocess, found):
    """``regressions()`` without a folder replays ``--shardfuzz-failures-dir``'s files, over
    ``$SHARDFUZZ_FAILURES_DIR`` (it read only the variable: a new user's option was ignored)."""
    from shardfuzz.frontends import pytest_plugin

    pytester = inprocess
    _, path = found
    d = pytester.mkdir("named")
    rec = json.loads(open(path).read())
    (d / "fixed.json").write_text(json.dumps(dict(rec, impl="reference", impl_kwargs={})))
    assert os.environ["SHARDFUZZ_FAILURES_DIR"] != str(d)  # the suite's own folder: not this one
    pytester.makepyfile(test_c="import shardfuzz\ntest_regressions = shardfuzz.regressions(planted=True)\n")
    outer = pytest_plugin._SESSION["failures_dir"]
    result = pytester.runpytest_inprocess(
        "-v", "-p", "no:cacheprovider", "--import-mode=importlib", f"--shardfuzz-failures-dir={d}"
    )
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines(["*test_regressions?fixed? PASSED*"])
    assert pytest_plugin._SESSION["failures_dir"] == outer  # the inner session gave it back


@pytest.mark.slow  # ~9 s; tests/test_interrupts.py checks --duration deadlines in the ci suite
def test_campaign_with_duration_progress_and_summary(tmp_path):
    out = cli(
        "fuzz",
        TOY,
        "--duration",
        "4s",
        "--progress-every",
        "1",
        "--failures-dir",
        str(tmp_path),
        cwd=tmp_path,
    )
    assert out.returncode == 0, out.stdout + out.stderr
    progress = [ln for ln in out.stdout.splitlines() if ln.startswith("[")]
    assert len(progress) >= 2 and "examples (" in progress[-1] and "/s)" in progress[-1]
    assert "uneven" in progress[-1] and "world>=3" in progress[-1]
    assert "nothing found" in out.stdout and "toy" in out.stdout


def test_campaign_keeps_going_after_a_finding_and_keeps_one_file_per_distinct_finding(tmp_path, monkeypatch):
    # the campaign's deadline falls as its third run begins (two find-and-shrinks of this bug, ~0.2 s
    # each, on any machine: a fixed --duration spent seconds of CPU fuzzing past the second); the
    # --duration is only the bound if that never happens
    from shardfuzz.frontends import campaign

    deadlines: list = []

    class Recorded(campaign.Deadline):
        def __init__(self, at: float) -> None:
            super().__init__(at)
            deadlines.append(self)

    begin = FailureRecorder.begin_run

    def begin_run(self, run: int) -> None:
        begin(self, run)
        if run >= 3:
            deadlines[-1].at = time.perf_counter()

    monkeypatch.setattr(campaign, "Deadline", Recorded)
    monkeypatch.setattr(FailureRecorder, "begin_run", begin_run)
    out = cli("fuzz", TOY, "--impl", "wrong_rank1", "--duration", "120s", "--failures-dir", str(tmp_path))
    assert out.returncode == 1
    assert "FOUND mismatch" in out.stdout and "failure file:" in out.stdout
    row = re.search(r"^toy\s+wrong_rank1\s+(\d+)\s+[\d.]+\s+(\d+)\s+FOUND", out.stdout, re.M)
    assert row, out.stdout
    runs = int(row.group(2))
    assert runs == 3, out.stdout  # it went on after the first finding (the third run: cut at once)
    assert "found again" in out.stdout  # the same bug, not a second finding
    assert sorted(p.name for p in tmp_path.glob("*.json")) == ["toy-wrong_rank1-gloo-mismatch.json"]


@pytest.mark.skipif(sys.platform != "linux", reason="reads /proc to find leftover processes")
def test_sigterm_stops_cleanly_and_keeps_failures(tmp_path, procs, start_cli):
    """SIGTERM (a scheduler's stop) before any finding: exit 130, no later target, nothing left
    behind. SIGINT, and either signal after a finding, run the same KeyboardInterrupt path:
    tests/test_interrupts.py (Ctrl-C after a finding) and tests/test_plugin.py (under pytest)."""
    run = start_cli(
        "fuzz", TOY, "tp_mlp", "--duration", "120s", "--progress-every", "0.5",
        "--failures-dir", str(tmp_path),
    )  # fmt: skip
    run.wait_line(lambda line: line.startswith("fuzzing"), 60)
    run.wait_line(lambda line: line.startswith("["), 60)  # fuzzing is under way
    time.sleep(1.0)
    everything = procs.descendants(run.pid)
    assert everything  # the forkserver and ranks
    run.signal(signal.SIGTERM)
    code, out, err = run.finish(60)
    assert code == 130, out + err
    assert "(interrupted)" in out and "interrupted" in err
    assert "tp_mlp" not in out.split("target ")[-1]  # stopped before the second target
    assert procs.wait_gone(everything) == []


@pytest.mark.slow  # ~13 s; the ci suite runs jobs side by side through --workers 2 (tests/test_fleet.py)
def test_jobs_run_side_by_side_within_the_rank_budget(tmp_path):
    out = cli(
        "fuzz",
        TOY,
        "tp_mlp",
        "--jobs",
        "2",
        "--rank-budget",
        "4",
        "--world-sizes",
        "1,2",
        "--max-examples",
        "15",
        "--failures-dir",
        str(tmp_path),
    )
    assert out.returncode == 0, out.stdout + out.stderr
    assert "running 2 jobs, up to 2 at once within 4 ranks (each job uses up to 2)" in out.stdout
    assert "[job 1]" in out.stdout and "[job 2]" in out.stdout
    summary = out.stdout.split("target ")[-1]
    assert "toy" in summary and "tp_mlp" in summary


# -- failure files that work from anywhere ---------------------------------------------------------
DATA = os.path.dirname(TOY)
MOVABLE_CASE = Case(target="toy", world_size=2, mesh=(2,), sizes={"n": 3}, split=("n",))


def make_project(root):
    """A user's checkout: a target file and an implementation file under a pyproject.toml."""
    (root / "targets").mkdir(parents=True)
    (root / "impls").mkdir()
    (root / "pyproject.toml").write_text("[project]\nname = 'mine'\n")
    shutil.copy(TOY, root / "targets" / "toy.py")
    shutil.copy(os.path.join(DATA, "toy_impls.py"), root / "impls" / "mine.py")
    return root


def record_failure(project, failures_dir, monkeypatch):
    """A failure file made from inside ``project`` with relative paths (as a user types them)."""
    monkeypatch.chdir(project)
    runner = Runner("targets/toy.py", "impls/mine.py::off_by_one", hooks=[FailureRecorder(str(failures_dir))])
    with pytest.raises(Mismatch):
        runner.run_case(MOVABLE_CASE)
    (path,) = failures_dir.glob("*.json")
    return str(path)


def rerun_line(report):
    import shlex

    (line,) = [ln for ln in report.splitlines() if ln.startswith("Rerun this case: shardfuzz case ")]
    return shlex.split(line.removeprefix("Rerun this case: shardfuzz "))


@pytest.mark.slow  # 8 CLI and torchrun processes (~30 s); pytest -m slow runs it
def test_failure_file_of_a_file_target_works_from_another_folder(tmp_path, monkeypatch):
    project = make_project(tmp_path / "proj")
    path = record_failure(project, tmp_path / "failures", monkeypatch)
    rec = json.loads(open(path).read())
    target_file = str(project / "targets" / "toy.py")
    assert rec["target_ref"] == f"{target_file}::toy"
    assert rec["impl_ref"] == f"{project / 'impls' / 'mine.py'}::off_by_one"
    assert rec["files"] == {
        target_file: os.path.join("targets", "toy.py"),
        str(project / "impls" / "mine.py"): os.path.join("impls", "mine.py"),
    }
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()

    refused = cli("replay", path, cwd=elsewhere)  # the file and its code lie outside elsewhere's project
    assert refused.returncode == 2 and "--trust-refs" in refused.stderr, refused.stdout + refused.stderr
    out = cli("replay", path, "--trust-refs", cwd=elsewhere)
    assert out.returncode == 1 and "STILL FAILS (mismatch; was mismatch)" in out.stdout, (
        out.stdout + out.stderr
    )

    rerun = rerun_line(rec["report"])
    assert rerun[1] == f"{target_file}::toy"  # the full reference, wherever it is run from
    out = cli(*rerun, cwd=elsewhere)
    assert out.returncode == 1 and "FAIL (mismatch)" in out.stdout, out.stdout + out.stderr

    script = elsewhere / "repro.py"
    assert cli("repro", path, "-o", str(script), "--trust-refs", cwd=elsewhere).returncode == 0
    monkeypatch.chdir(elsewhere)
    run = torchrun("--nproc-per-node=2", str(script))
    assert run.returncode != 0 and "FAIL (mismatch)" in run.stdout, run.stdout + run.stderr


@pytest.mark.slow  # 6 CLI and torchrun processes (~37 s); pytest -m slow runs it
def test_failure_file_works_after_the_checkout_moved(tmp_path, monkeypatch):
    path = record_failure(make_project(tmp_path / "old"), tmp_path / "failures", monkeypatch)
    shutil.copytree(tmp_path / "old", tmp_path / "new")
    shutil.rmtree(tmp_path / "old")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)  # the test's own folder was the deleted checkout

    lost = cli("replay", path, cwd=elsewhere)
    assert lost.returncode == 2 and "Traceback" not in lost.stderr
    assert str(tmp_path / "old" / "targets" / "toy.py") in lost.stderr and "--search-path" in lost.stderr

    by_env = subprocess.run(
        [sys.executable, "-m", "shardfuzz.frontends.cli", "replay", path, "--trust-refs"],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=elsewhere,
        env=dict(os.environ, SHARDFUZZ_PATH=str(tmp_path / "new")),
    )
    assert by_env.returncode == 1 and "STILL FAILS" in by_env.stdout, by_env.stdout + by_env.stderr
    # the new checkout finds the files; a trusted folder holding the failure file and the code
    by_flag = cli("replay", path, "--search-path", tmp_path / "new", "--search-path", tmp_path, cwd=elsewhere)
    assert by_flag.returncode == 1 and "STILL FAILS" in by_flag.stdout, by_flag.stdout + by_flag.stderr
    inside = cli("replay", path, "--trust-refs", cwd=tmp_path / "new" / "impls")  # the current project root
    assert inside.returncode == 1 and "STILL FAILS" in inside.stdout, inside.stdout + inside.stderr

    script = elsewhere / "repro.py"
    repro = cli("repro", path, "-o", str(script), "--search-path", str(tmp_path / "new"), "--trust-refs")
    assert repro.returncode == 0, repro.stdout + repro.stderr
    monkeypatch.setenv("SHARDFUZZ_PATH", str(tmp_path / "new"))
    run = torchrun("--nproc-per-node=2", str(script))
    assert run.returncode != 0 and "FAIL (mismatch)" in run.stdout, run.stdout + run.stderr


def test_test_for_resolves_relative_files_next_to_the_test_file(inprocess, tmp_path):
    pytester = inprocess
    sub = pytester.mkdir("sub")
    shutil.copy(TOY, sub / "toy_target.py")
    (sub / "test_rel.py").write_text(
        "import shardfuzz\n"
        "test_toy = shardfuzz.test_for('toy_target.py', 'toy_target.py::wrong_rank1', world_sizes=(2,), max_examples=10)\n"
    )
    result = pytester.runpytest_inprocess(
        "-p", "no:cacheprovider", "--import-mode=importlib", f"--shardfuzz-failures-dir={tmp_path / 'f'}", "sub"
    )  # fmt: skip
    result.assert_outcomes(failed=1)  # found, so the files were found from the test file's folder
    result.stdout.fnmatch_lines(["*mismatch the oracle*"])
    assert str(sub / "toy_target.py") + "::toy" in "\n".join(result.outlines)  # rerun line: full path


def test_a_failure_now_set_aside_as_a_known_failure_is_said_not_run(found, monkeypatch):
    """A failure file whose case the target has since declared a known failure ended the replay
    (and a regressions() test) in shardfuzz's own Excluded exception, with the engine's frames (a
    new user's DTensor MLP)."""
    from shardfuzz.engine.runner import Runner
    from shardfuzz.spec.exclude import Excluded

    def set_aside(self, case):
        raise Excluded("torch DTensor view of a size-1 sharded dim", reason="size-1 view")

    _, path = found
    monkeypatch.setattr(Runner, "run_case", set_aside)
    out = cli("replay", path)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "NOT RUN: set aside as a known failure now (torch DTensor view" in out.stdout, out.stdout
    assert "1 replayed: 0 fail, 0 pass, 1 set aside (a known failure now, or refused)" in out.stdout, (
        out.stdout
    )
    assert "Traceback" not in out.stdout + out.stderr

    def refused(self, case):  # the implementation now refuses the case: it ran, and said so
        raise shardfuzz.Unsupported("no sizes the group does not divide", reason="uneven")

    monkeypatch.setattr(Runner, "run_case", refused)
    out = cli("replay", path)
    assert out.returncode == 0 and "REFUSED: refused as unsupported now (no sizes" in out.stdout, out.stdout


def test_a_long_implementation_path_keeps_its_name_in_the_file_name():
    """From a checkout at a long path, ``--impl /long/path/fleet_impls.py::parity_bugs`` was cut to
    its first 40 characters: ``toy-tmp_audit_readme_shardfuzz_tests_data_fl_d62e260a9c-gloo-...``
    named neither the file nor the implementation (two fleet tests' globs missed it)."""
    from shardfuzz.engine.failures import _slug

    long = "/tmp/audit_readme/shardfuzz/tests/data/fleet_impls.py::parity_bugs"
    slug = _slug(long)
    assert slug.endswith("fleet_impls.py_parity_bugs") and len(slug) <= 60, slug
    assert slug != _slug(long.replace("/tmp/", "/var/"))  # the hash of the whole keeps two apart
    assert _slug("tp_mlp") == "tp_mlp"


def test_a_case_repr_whose_tuple_option_the_file_keeps_as_a_list_is_not_called_edited():
    """A new user's tuple-valued options (bag lengths) are lists in the file's ``case`` (JSON), so
    every replay said "the file's case_repr reads ... that is not the case that ran"."""
    from shardfuzz.case import Case
    from shardfuzz.repro.replay import case_repr_note

    drawn = Case(target="toy", world_size=1, mesh=(1,), sizes={"n": 2}, options={"lens": (2, 1)})
    stored = Case.from_dict(json.loads(drawn.to_json_str()))  # as a failure file gives it back
    assert repr(drawn) != repr(stored)  # (2, 1) against [2, 1]
    assert case_repr_note({"case_repr": repr(drawn), "case": stored}) == ""
    edited = repr(drawn).replace("(2, 1)", "(3, 1)")
    assert "that is not the case that ran" in case_repr_note({"case_repr": edited, "case": stored})
