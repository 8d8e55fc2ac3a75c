"""Failure files are untrusted input (issue 26): no code injection into reproducers, the trust rule
for references, the whole-file schema, escaped output, bounded sizes, a loopback-only store."""

from __future__ import annotations

import json
import os
import runpy
import shutil
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from shardfuzz import Case, TargetError
from shardfuzz.errors import InvalidArgument, ShardfuzzWarning
from shardfuzz.frontends.testing import run_cli

REPO = Path(__file__).resolve().parent.parent
COMMITTED = REPO / "tests" / "data" / "failures"
OK = Case(
    target="tp_mlp",
    world_size=2,
    mesh=(2,),
    sizes={"batch": 1, "seq": 1, "d_model": 1, "hidden": 2, "d_out": 1},
    split=("hidden",),
)


def record(**changes):
    """A tp_mlp/missing_allreduce record as a run writes it."""
    rec = {
        "format": "shardfuzz-failure",
        "version": 1,
        "target": "tp_mlp",
        "target_ref": "tp_mlp",
        "impl": "missing_allreduce",
        "impl_ref": "shardfuzz.targets.tp_mlp:reference",
        "impl_kwargs": {"bug": "missing_allreduce"},
        "case": OK.to_dict(),
        "backend": "gloo",
        "device": "cpu",
        "kind": "mismatch",
        "report": "",
        "inputs_sha256": "0" * 64,
    }
    rec.update(changes)
    return rec


def write(path, rec):
    path.write_text(json.dumps(rec))
    return str(path)


def cli(*args, cwd=None):
    out = run_cli(*args, cwd=cwd)
    assert "Traceback" not in out.stdout + out.stderr, out.stdout + out.stderr
    return out


# -- 1. generated code never carries a field's text ----------------------------------------------
def payload(marker: Path) -> str:
    return f'x"""; __import__("pathlib").Path({str(marker)!r}).touch(); """'


INJECTED = {  # field -> the record with the payload there (one line: newlines are refused anyway)
    "target": lambda p: {"target": p},
    "impl": lambda p: {"impl": p},
    "kind": lambda p: {"kind": p},
    "impl_ref": lambda p: {"impl_ref": f"{p}:f"},
    "target_ref": lambda p: {"target_ref": p},
    "impl_kwargs": lambda p: {"impl_kwargs": {"bug": p}},
    "files": lambda p: {"files": {p: p}},
    "case": lambda p: {"case": dict(OK.to_dict(), options={"sequence_parallel": p})},
}


@pytest.mark.parametrize("standalone", [False, True], ids=["repro", "standalone"])
@pytest.mark.parametrize("field", sorted(INJECTED))
def test_an_injection_through_any_field_never_runs(tmp_path, field, standalone):
    marker = tmp_path / "INJECTED"
    path = write(tmp_path / "f.json", record(**INJECTED[field](payload(marker))))
    out_path = tmp_path / ("out" if standalone else "repro.py")
    out = cli("repro", path, "-o", out_path, *(["--standalone"] if standalone else []))
    scripts = sorted(out_path.glob("*.py")) if standalone else [out_path] if out_path.exists() else []
    assert out.returncode == 2 or scripts, out.stdout + out.stderr
    for script in scripts:  # written: its top level holds the field as data, never as a statement
        runpy.run_path(str(script), run_name="not_main")
    assert not marker.exists(), f"the {field} field ran code: {out.stdout + out.stderr}"
    if out.returncode == 2:
        assert f"field {field!r}" in out.stderr or field in ("target", "case"), out.stderr


def test_an_impl_name_with_quotes_is_written_as_data(tmp_path):
    """A field that passes the schema yet holds triple quotes: the script is written and its
    docstring is the text, not code (the check that failed before issue 26)."""
    marker = tmp_path / "INJECTED"
    path = write(tmp_path / "f.json", record(impl=payload(marker)))
    assert cli("repro", path, "-o", tmp_path / "repro.py").returncode == 0
    module = runpy.run_path(str(tmp_path / "repro.py"), run_name="not_main")
    assert not marker.exists()
    assert payload(marker) in module["__doc__"] and module["RECORD"]["impl"] == payload(marker)


# -- 2. the trust rule: what a file may import -----------------------------------------------------
def evil_module(folder: Path, marker: Path) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "evil.py"
    path.write_text(f"import pathlib\npathlib.Path({str(marker)!r}).touch()\ndef f(ctx):\n    return {{}}\n")
    return path


def test_a_reference_outside_the_project_is_refused_before_it_is_imported(tmp_path):
    marker = tmp_path / "IMPORTED"
    evil = evil_module(tmp_path / "elsewhere", marker)
    path = write(tmp_path / "f.json", record(impl="f", impl_ref=f"{evil}::f", impl_kwargs={}))
    out = cli("replay", path, cwd=REPO)
    assert out.returncode == 2 and not marker.exists(), out.stdout + out.stderr
    for piece in ("field 'impl_ref'", f"would import and run the file {str(evil)!r}", "--trust-refs"):
        assert piece in out.stderr, out.stderr
    # the explicit choice: it is imported (repro: no ranks to start)
    assert cli("repro", path, "-o", tmp_path / "r.py", "--trust-refs", cwd=REPO).returncode == 0
    assert marker.exists()


def test_a_link_in_the_project_to_code_outside_it_is_refused_naming_where_it_leads(tmp_path):
    """A link committed in the project that leads out of it: the refusal names both ends (it named
    only the path in the project, which read as inside it)."""
    marker = tmp_path / "IMPORTED"
    evil = evil_module(tmp_path / "elsewhere", marker)
    project = tmp_path / "project"
    (project / "vendored").mkdir(parents=True)
    (project / "pyproject.toml").write_text("")
    (project / "vendored" / "helpers.py").symlink_to(evil)
    linked = project / "vendored" / "helpers.py"
    path = write(project / "f.json", record(impl="f", impl_ref=f"{linked}::f", impl_kwargs={}))
    out = cli("replay", path, cwd=project)
    assert out.returncode == 2 and not marker.exists(), out.stdout + out.stderr
    assert f"would import and run the file {str(linked)!r}" in out.stderr, out.stderr
    assert f"that code is a link to {str(evil)!r}, outside the current project" in out.stderr, out.stderr


def test_an_installed_module_is_refused_before_it_is_imported(tmp_path, monkeypatch):
    """``target_ref: "this:s"`` imported ``this`` (its side effects ran) before anything was refused."""
    marker = tmp_path / "IMPORTED"
    evil_module(tmp_path / "site", marker)
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    path = write(tmp_path / "f.json", record(target_ref="evil:TARGET"))
    out = cli("replay", path, cwd=REPO)
    assert out.returncode == 2 and "evil" not in sys.modules and not marker.exists(), out.stderr
    assert (
        "field 'target_ref'" in out.stderr
        and "the module 'evil'" in out.stderr
        and "--trust-refs" in out.stderr
    )


def test_a_store_record_may_name_only_shardfuzz_code(tmp_path):
    from shardfuzz.engine.failures import prepare

    assert prepare(record(), None, check=False)["impl_spec"].ref == "shardfuzz.targets.tp_mlp:reference"
    evil = evil_module(tmp_path, tmp_path / "IMPORTED")
    with pytest.raises(InvalidArgument, match="a record from a store of findings"):
        prepare(record(impl_ref=f"{evil}::f"), None, check=False)


def test_trust_refs_never_lets_a_record_call_shardfuzz_code_that_is_no_implementation(tmp_path):
    """A new user's audit forged a fleet record of their own target whose implementation was
    shardfuzz.spec.registry:_file_targets with path= a file of its choice: the refusal named only
    the target's file, and replaying it with --trust-refs, the one way to replay a fleet finding of
    one's own target, imported that file. The refusal now names every argument --trust-refs would
    pass, and no flag lets a record call shardfuzz code that is no implementation of its target."""
    from shardfuzz.engine.failures import prepare

    marker = tmp_path / "IMPORTED"
    evil = evil_module(tmp_path / "elsewhere", marker)
    mine = tmp_path / "mine" / "my_mlp.py"
    mine.parent.mkdir()
    mine.write_text("import shardfuzz\nTARGET = shardfuzz.get_target('tp_mlp').derive('my_mlp')\n")
    rec = record(
        target="my_mlp",
        target_ref=f"{mine}::TARGET",
        impl="reference",
        impl_ref="shardfuzz.spec.registry:_file_targets",
        impl_kwargs={"path": str(evil)},
        case={**OK.to_dict(), "target": "my_mlp"},
    )
    with pytest.raises(InvalidArgument) as e:
        prepare(rec, None)  # from a store: its target's file is refused, and what it would be given is said
    said = str(e.value)
    assert "field 'target_ref'" in said and f"impl_kwargs = {{'path': {str(evil)!r}}}" in said, said
    assert "a record from a store names no folder to trust" in said, said
    with pytest.raises(
        InvalidArgument, match=r"is no implementation of target 'my_mlp'.*even with --trust-refs"
    ):
        prepare(rec, None, trust_refs=True)
    assert not marker.exists()


@pytest.mark.parametrize(
    "impl_ref, impl_kwargs",
    [
        # shardfuzz's own functions that take (ctx, **kwargs) and import what they are given: a
        # security review ran a file of its choice on every rank this way, from a file or a store
        ("shardfuzz.spec.registry:_file_targets", {"path": "PAYLOAD"}),
        ("shardfuzz._moved:alias", {"new": "PAYLOAD_MODULE", "run_main": True}),
    ],
)
def test_shardfuzz_code_that_is_no_implementation_of_the_target_is_never_called(
    tmp_path, impl_ref, impl_kwargs
):
    from shardfuzz.engine.failures import prepare

    marker = tmp_path / "IMPORTED"
    evil = evil_module(tmp_path, marker)
    kwargs = {k: {"PAYLOAD": str(evil), "PAYLOAD_MODULE": "evil"}.get(v, v) for k, v in impl_kwargs.items()}
    rec = record(impl_ref=impl_ref, impl_kwargs=kwargs)
    for source in (None, write(tmp_path / "f.json", rec)):  # a store's record, and a file
        for trust in (False, True):  # whatever --trust-refs says
            with pytest.raises(
                InvalidArgument,
                match=f"field 'impl_ref': '{impl_ref}' with impl_kwargs = .* is no implementation of",
            ):
                prepare(rec, source, trust_refs=trust)
    out = cli("replay", str(tmp_path / "f.json"))
    assert out.returncode == 2 and "--trust-refs" in out.stderr, out.stdout + out.stderr
    assert not marker.exists()
    # the target's own implementations still load, from a store too
    assert prepare(record(), None)["impl_spec"].ref == "shardfuzz.targets.tp_mlp:reference"


def test_repro_makes_its_folder_cuts_a_long_name_and_names_a_place_it_cannot_write(tmp_path):
    # a security review: -o missing/r.py and a 990-character implementation name were tracebacks
    path = write(tmp_path / "f.json", record())
    out = cli("repro", path, "-o", str(tmp_path / "new" / "r.py"))
    assert out.returncode == 0 and (tmp_path / "new" / "r.py").exists(), out.stdout + out.stderr
    (tmp_path / "a_file").write_text("")
    out = cli("repro", path, "-o", str(tmp_path / "a_file" / "r.py"))
    assert (
        out.returncode == 2 and f"-o {str(tmp_path / 'a_file' / 'r.py')!r}: cannot write there" in out.stderr
    )
    long = write(tmp_path / "long.json", record(impl="x" * 990))
    out = cli("repro", long, "--standalone", "-o", str(tmp_path / "st"))
    assert out.returncode == 0, out.stdout + out.stderr
    (script,) = (tmp_path / "st").glob("repro_*.py")
    assert len(script.name) <= 130, script.name
    # a new user's -o repro_mor.py with --standalone became a folder of that name: said, not made
    out = cli("repro", long, "--standalone", "-o", str(tmp_path / "repro_mor.py"))
    assert out.returncode == 2 and "with --standalone, -o names a folder" in out.stderr, out.stderr
    assert not (tmp_path / "repro_mor.py").exists()


@pytest.mark.slow  # a pytest subprocess replaying a toy target (~15 s under load); the CLI tests above
def test_regressions_of_committed_files_need_no_flag_and_a_moved_file_is_refused(tmp_path):
    """The committed file's absolute paths came from another machine (/home/dev/shardfuzz): they
    resolve relative to this project root. The same file outside the project is refused."""
    outside = tmp_path / "outside"
    outside.mkdir()
    for f in COMMITTED.glob("*.json"):
        shutil.copy(f, outside / f.name)
    test = tmp_path / "test_regs.py"
    test.write_text(
        textwrap.dedent(f"""
        import shardfuzz
        test_inside = shardfuzz.regressions({str(COMMITTED)!r})
        test_outside = shardfuzz.regressions({str(outside)!r})
        """)
    )
    out = subprocess.run(
        # -n 0: one process (the checkout's pyproject would start two xdist workers for one file)
        [sys.executable, "-m", "pytest", "-n", "0", "-q", "-p", "no:cacheprovider", "-rA", str(test)],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=REPO,
        env=dict(os.environ, OMP_NUM_THREADS="1"),
    )
    text = out.stdout + out.stderr
    assert "STILL FAILS (mismatch; was mismatch)" in text, text[-4000:]  # replayed: the bug is there
    inside = [ln for ln in text.splitlines() if "test_inside" in ln and "would import" in ln]
    assert not inside, text[-4000:]
    assert "would import and run the file" in text and "--trust-refs" in text, text[-4000:]
    assert "the failure file is outside the current project" in text, text[-4000:]


def test_the_committed_file_replays_in_the_project_and_is_refused_outside(tmp_path):
    (committed,) = COMMITTED.glob("*.json")
    rec = json.loads(committed.read_text())
    assert rec["target_ref"].startswith("/home/dev/shardfuzz/")  # an absolute path of another machine
    from shardfuzz.engine.failures import load

    cwd = os.getcwd()
    os.chdir(REPO)
    try:
        assert load(str(committed))["target_ref"] == str(REPO / "tests" / "data" / "toy_target.py") + "::toy"
        moved = shutil.copy(committed, tmp_path / committed.name)
        with pytest.raises(InvalidArgument, match=r"outside the current project.*--trust-refs"):
            load(str(moved))
    finally:
        os.chdir(cwd)


# -- 3. one schema for the whole file --------------------------------------------------------------
@pytest.mark.parametrize(
    ("changes", "named"),
    [
        ({"tolerance": "abc"}, "field 'tolerance' is 'abc'"),
        ({"tolerance": {"noise_factor": "x"}}, "field 'tolerance'"),
        ({"deterministic": "yes"}, "field 'deterministic' is 'yes'; must be true or false"),
        (
            {"impl_kwargs": {"bug": "no_such_bug"}},
            "bug='no_such_bug', which no implementation of target 'tp_mlp' binds; they bind bug= ",
        ),
        ({"impl_kwargs": {"bug": "missing_allreduce", "speed": 3}}, "field 'impl_kwargs'"),
        ({"version": 99}, "format version 99 is newer"),
        ({"version": "1"}, "field 'version' is '1'"),
        ({"inputs_sha256": "abc"}, "field 'inputs_sha256'"),
        ({"kind": "flaky"}, "field 'kind' is 'flaky'; allowed: mismatch"),
        # a security review: nested 900 deep, it passed as "a list" and stopped a replay after its
        # case ran (RecursionError)
        ({"site": [[[[[[[["grad_x"]]]]]]]]}, "field 'site' "),
        ({"site": [{"a": 1}]}, "field 'site' "),
        ({"case": dict(OK.to_dict(), target="moe")}, "field 'case' is for target 'moe'"),
        # the case within the bounds tp_mlp's strategy declares (shardfuzz.spec.bounds)
        (
            {"case": dict(OK.to_dict(), sizes=dict(OK.sizes, hidden=8))},
            "field 'case' is invalid: target 'tp_mlp' never draws this case: sizes['hidden']=8; split over a group "
            "of 2 rank(s) (mesh[-1]) it draws 2..7",
        ),
        (
            {"case": dict(OK.to_dict(), world_size=4, mesh=[1, 2, 2])},
            "field 'case' is invalid: target 'tp_mlp' never draws this case: mesh=(1, 2, 2) on world size 4; "
            "it draws",
        ),
    ],
)
def test_hand_edited_fields_are_named_before_anything_runs(tmp_path, changes, named):
    path = write(tmp_path / "f.json", record(**changes))
    out = cli("replay", path)
    assert out.returncode == 2 and named in out.stderr and repr(path) in out.stderr, out.stderr


def test_a_file_of_todays_format_without_version_loads_as_version_1(tmp_path):
    from shardfuzz.engine.failure_schema import load_failure_file, validate_failure_record

    old = record()
    del old["version"]
    rec = load_failure_file(write(tmp_path / "f.json", old))
    assert rec["version"] == 1 and rec["case"] == OK
    assert validate_failure_record(dict(record(), version=1))["version"] == 1


def test_a_tolerance_field_this_version_does_not_know_is_ignored(tmp_path):
    """Found by review: a tolerance field a newer shardfuzz writes (``flip_samples`` when it was
    new) refused the whole file in an older one, where the format says unknown fields are ignored."""
    from shardfuzz.engine.failure_schema import load_failure_file

    rec = record()
    rec["tolerance"] = dict(rec.get("tolerance") or {}, samples=3, from_a_newer_version=7)
    assert load_failure_file(write(tmp_path / "f.json", rec))["tolerance"]["samples"] == 3
    rec["tolerance"]["samples"] = 1  # a field it knows is still checked
    with pytest.raises(InvalidArgument, match="samples=1"):
        load_failure_file(write(tmp_path / "g.json", rec))


def test_an_oversized_file_is_refused_before_it_is_parsed(tmp_path, monkeypatch):
    import shardfuzz.engine.failure_schema as schema

    monkeypatch.setattr(schema, "MAX_FILE_BYTES", 100)
    with pytest.raises(InvalidArgument, match="larger than 100 bytes"):
        schema.load_failure_file(write(tmp_path / "f.json", record()))


# -- 4. untrusted strings are printed escaped ------------------------------------------------------
def test_terminal_escapes_in_fields_are_never_printed_raw(tmp_path):
    for field in ("kind", "impl"):
        path = write(tmp_path / "f\x1b[2J.json", record(**{field: "\x1b]0;owned\x07\x1b[2Jmismatch"}))
        out = cli("replay", path)
        assert "\x1b" not in out.stdout + out.stderr, (field, out.stdout + out.stderr)
        assert "\\x1b" in out.stdout + out.stderr, (field, out.stdout + out.stderr)


def test_a_case_whose_option_the_target_refuses_is_refused_escaped():
    """A dtensor_ops failure file whose ``op`` was changed (to code, or with a terminal escape)
    crashed replay with the target's Unsupported traceback, the escape printed raw."""
    from shardfuzz.spec.registry import get_target
    from shardfuzz.spec.sampling import simplest_case
    from shardfuzz.verdict.oracle import check_case

    target = get_target("dtensor_ops")
    case = simplest_case(target.strategy())[0]
    for op in ("__import__('os').system('true')", "aten.topk.default\x1b[2J"):
        bad = Case.from_dict(dict(case.to_dict(), options=dict(case.options, op=op)))
        with pytest.raises(TargetError, match="is not one target 'dtensor_ops' can run") as e:
            check_case(target, bad)
        assert "\x1b" not in str(e.value), str(e.value)


def test_a_tolerance_the_file_loosens_is_said_beside_its_verdict(tmp_path):
    """A file's per-output tolerance is the run's ``--tolerance``, and replay judges with it: one
    loosened by hand turned a real failure into "now passes" and said nothing of it."""
    loose = {"per_output": [["y", {"rtol": 1e9, "atol": 1e9}]]}
    out = cli("replay", write(tmp_path / "f.json", record(tolerance=loose)))
    assert (
        "(judged with the file's tolerance overrides: 'y' rtol=1000000000.0 atol=1000000000.0)" in out.stdout
    ), out.stdout + out.stderr
    out = cli("replay", write(tmp_path / "g.json", record()))
    assert "tolerance overrides" not in out.stdout, out.stdout
    # a tolerance given to the replay replaces the file's for that output: not the file's then
    from shardfuzz.frontends.pytest_plugin import _regression_outcome
    from shardfuzz.repro.replay import file_tolerance_note
    from shardfuzz.spec.tolerance import Tolerance

    two = {"per_output": [["y", {"rtol": 1e9, "atol": 1e9}], ["grad_x", {"rtol": 0.5, "atol": 0.0}]]}
    given = Tolerance().with_overrides({"y": (1e-6, 0.0)})
    assert file_tolerance_note(record(tolerance=two), given) == (
        " (judged with the file's tolerance overrides: 'grad_x' rtol=0.5 atol=0.0)"
    )
    # under pytest (regressions()), a pass judged with them is said in the warnings summary
    passed = type("R", (), {"failed": False, "not_judged": False, "status": "now passes"})()
    with pytest.warns(ShardfuzzWarning, match="f.json passes \\(judged with the file's tolerance overrides"):
        _regression_outcome(passed, "f.json", file_tolerance_note(record(tolerance=loose)))


# -- 5. the case is held to the target before its inputs are built -------------------------------
def bad(**sizes):
    """OK's case with other sizes."""
    return dict(OK.to_dict(), sizes=dict(OK.sizes, **sizes))


def test_a_case_outside_the_declared_bounds_is_refused_before_its_inputs_are_measured(tmp_path, monkeypatch):
    import shardfuzz.engine.failure_load as failure_load
    from shardfuzz.engine.failures import load, prepare

    def never(*_args):
        raise AssertionError("the inputs were measured or built")

    monkeypatch.setattr(failure_load, "check_input_size", never)
    monkeypatch.setattr(failure_load, "check_case", never)
    path = write(tmp_path / "f.json", record(case=bad(hidden=1)))
    with pytest.raises(InvalidArgument) as e:
        load(path)  # what replay, repro and regressions() call
    assert str(e.value) == (
        f"failure file {path!r}: field 'case' is invalid: target 'tp_mlp' never draws this case: sizes['hidden']=1; "
        "split over a group of 2 rank(s) (mesh[-1]) it draws 2..7 (Split(min_per_rank=1, max_per_rank=3, "
        "uneven=True, allow_empty=False, min_size=1))"
    )
    with pytest.raises(
        InvalidArgument, match=r"^failure record: field 'case' is invalid: .*sizes\['hidden'\]=1"
    ):
        prepare(record(case=bad(hidden=1)), None)  # a record of a store of findings


def test_a_folder_replays_its_other_files_beside_one_whose_case_its_target_no_longer_draws(tmp_path):
    """A new user narrowed a target's sizes (``Split(min_size=2)``); the folder's one older file was
    then out of bounds and refused the whole replay (exit 2, the other files never run). It is not
    run and said; the others replay. Alone, it is still the refusal it was (the test above)."""
    stale = write(tmp_path / "a.json", record(case=bad(hidden=1)))
    write(tmp_path / "b.json", record())
    out = cli("replay", str(tmp_path))
    assert out.returncode == 1, out.stdout + out.stderr  # b.json's missing_allreduce still fails
    assert (
        f"NOT RUN: failure file {stale!r}: field 'case' is invalid: target 'tp_mlp' never draws" in out.stdout
    )
    assert (
        "b.json: tp_mlp/missing_allreduce ran on DIFFERENT INPUTS (input hash changed) and fails"
        in out.stdout
    )
    assert "1 replayed: 1 fail, 0 pass; 1 not run (cases their targets no longer draw)" in out.stdout


def test_a_hand_edited_option_kind_refuses_the_replay_even_beside_a_size_out_of_bounds(tmp_path):
    """A wrong option kind is a hand edit, never stale: with a size out of bounds too, the bounds
    check ran first and the file was set aside as stale (NOT RUN, exit 0), a review found."""
    edited = dict(bad(hidden=1), options={"sequence_parallel": "yes"})
    write(tmp_path / "a.json", record(case=edited))
    write(tmp_path / "b.json", record())
    out = cli("replay", str(tmp_path))
    assert out.returncode == 2, out.stdout + out.stderr
    assert "options['sequence_parallel']='yes'" in out.stderr and "NOT RUN" not in out.stdout, out.stdout


def test_a_1_rank_case_with_the_sizes_of_a_larger_group_loads():
    """The campaign's 1-rank retry keeps the global sizes drawn for 2+ ranks (finish.try_one_rank)."""
    from shardfuzz.engine.failures import prepare

    one = dict(OK.to_dict(), world_size=1, mesh=[1], sizes=dict(OK.sizes, hidden=7))  # 3 * 2 + 1
    assert prepare(record(case=one), None)["case"].sizes["hidden"] == 7


def test_huge_sizes_are_refused_before_allocation(tmp_path, monkeypatch):
    big = bad(batch=10**6, seq=10**6, d_model=10**3)
    out = cli("replay", write(tmp_path / "f.json", record(case=big)))
    assert out.returncode == 2, out.stdout + out.stderr
    assert "sizes['batch']=1000000; it draws 1..3" in out.stderr, out.stderr  # tp_mlp declares its sizes
    out = cli("case", "tp_mlp", repr(Case.from_dict(big)))  # a hand-made case on the command line
    assert out.returncode == 2 and "refused before building them" in out.stderr, out.stderr
    # a target whose strategy declares no bounds: its inputs are measured before they are built
    from shardfuzz.engine.failures import load
    from shardfuzz.spec.target import Target

    monkeypatch.setattr(Target, "case_bounds", lambda self, world_sizes=None: None)
    with pytest.raises(InvalidArgument, match=r"batch=1000000.*refused before building them"):
        load(write(tmp_path / "f.json", record(case=big)))


def test_sizes_within_the_limit_are_measured_exactly():
    from shardfuzz.engine.input_bounds import measure_inputs
    from shardfuzz.spec.registry import get_target

    elements, nbytes = measure_inputs(get_target("tp_mlp"), OK)
    built = get_target("tp_mlp").inputs(OK)
    assert elements == sum(v.numel() for v in built.values())
    assert nbytes == sum(v.numel() * v.element_size() for v in built.values())


# -- 6. the rendezvous store listens on loopback only ----------------------------------------------
def listening_sockets(pid: int) -> list[str]:
    """The local addresses of the TCP sockets process ``pid`` listens on (/proc/net/tcp{,6})."""
    inodes = set()
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            link = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:
            continue
        if link.startswith("socket:["):
            inodes.add(link[len("socket:[") : -1])
    found = []
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            cols = line.split()
            if cols[3] == "0A" and cols[9] in inodes:  # 0A: LISTEN
                found.append(cols[1])
    return found


def test_the_driver_store_listens_on_loopback_only():
    from shardfuzz.ranks.spawn import driver_store

    store = driver_store()
    addresses = listening_sockets(os.getpid())
    port = f"{store.port:04X}"
    mine = [a for a in addresses if a.endswith(":" + port)]
    assert mine, (addresses, port)
    assert all(a == f"0100007F:{port}" for a in mine), mine  # 127.0.0.1, never 0.0.0.0 or ::


def descendants(pid: int) -> list[int]:
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                stat = Path(f"/proc/{entry}/stat").read_text()
            except OSError:
                continue
            ppid = int(stat.rpartition(")")[2].split()[1])
            children.setdefault(ppid, []).append(int(entry))
    out, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            out.append(child)
            todo.append(child)
    return out


LOOPBACK = ("0100007F:", "00000000000000000000000001000000:")  # 127.0.0.1 and ::1 in /proc/net


@pytest.mark.slow  # a real campaign process and its ranks (~15 s under load); the test above is the ci one
def test_a_running_campaign_listens_on_loopback_only(tmp_path):
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "shardfuzz.frontends.cli",
            "fuzz",
            "tp_mlp",
            "--duration",
            "120",
            "--failures-dir",
            tmp_path,
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        env=dict(os.environ, OMP_NUM_THREADS="1"),
        start_new_session=True,  # its ranks and forkserver share its process group: one kill ends all
    )
    try:
        seen: dict[int, list[str]] = {}
        deadline = time.monotonic() + 180
        while time.monotonic() < deadline and not (seen.get(proc.pid) and len(seen) >= 3):
            for pid in [proc.pid, *descendants(proc.pid)]:
                try:
                    if found := listening_sockets(pid):
                        seen[pid] = found
                except OSError:  # a rank that just exited
                    continue
            time.sleep(0.5)
        assert seen.get(proc.pid), f"the driver never listened: {seen}"
        assert len(seen) >= 3, f"the ranks never listened: {seen}"  # the driver and 2+ gloo ranks
        wide = {pid: a for pid, addrs in seen.items() for a in addrs if not a.startswith(LOOPBACK)}
        assert not wide, f"listening beyond loopback: {wide}"
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)
