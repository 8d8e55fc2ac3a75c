"""Every bad input is a named error: the message names the argument (or the file and field), its
value and what is allowed; exit 2 (usage) or 3 (the tool failed); no traceback from shardfuzz's
internals; no finding lost. One test per row of the bad-input study (``BAD-INPUTS.md`` of the
issue), most through the CLI, plus inputs of the same kinds that were not on the list."""

import dataclasses
import json
import os
import re

import pytest

import shardfuzz
from shardfuzz import Case, InvalidArgument, Runner, TargetError
from shardfuzz.case import PROFILE_PARAMS, edge_problem, pin_options
from shardfuzz.engine.config import check_world_size, env_int, max_world_size
from shardfuzz.engine.covering import pool_for
from shardfuzz.engine.failures import FailureRecorder, check_failures_dir
from shardfuzz.errors import TargetCodeError
from shardfuzz.frontends.testing import run_cli
from shardfuzz.spec import sampling
from shardfuzz.spec.bounds import bounds_of
from shardfuzz.spec.registry import get_target
from shardfuzz.verdict.oracle import check_case

pytest_plugins = ["pytester"]

DATA = os.path.join(os.path.dirname(__file__), "data")
ORACLE_RAISES = os.path.join(DATA, "oracle_raises.py")
MISTAKES = os.path.join(DATA, "spec_mistakes.py")
OK = (
    "Case(target='tp_mlp', world_size=2, mesh=(2,), sizes={'batch': 1, 'seq': 1, 'd_model': 1, "
    "'hidden': 2, 'd_out': 1}, split=('hidden',), dtype='float32', profile='normal', seed=0, options={})"
)


def cli(*args, env=None, cwd=None, timeout=240):
    out = run_cli(*args, env=env, cwd=cwd)  # in this process: an uncaught error fails the test too
    assert "Traceback" not in out.stdout + out.stderr, out.stdout + out.stderr
    return out


def refused(out, code, *named):
    text = out.stdout + out.stderr
    assert out.returncode == code, text
    for piece in named:
        assert piece in text, f"{piece!r} not in:\n{text}"


def failure_record(tmp_path, name, **changes):
    """A failure file of tp_mlp/missing_allreduce as a real run writes it, with ``changes``."""
    case = Case.parse(OK).to_dict()
    case.update(changes.pop("case", {}))
    rec = {
        "format": "shardfuzz-failure",
        "version": 1,
        "target": "tp_mlp",
        "target_ref": "tp_mlp",
        "impl": "missing_allreduce",
        "impl_ref": "shardfuzz.targets.tp_mlp:reference",
        "impl_kwargs": {"bug": "missing_allreduce"},
        "case": case,
        "backend": "gloo",
        "device": "cpu",
        "kind": "mismatch",
        "report": "shardfuzz: 1 of 6 outputs mismatch the oracle",
        "inputs_sha256": "0" * 64,
        **changes,
    }
    path = tmp_path / name
    path.write_text(json.dumps(rec))
    return str(path)


# -- --failures-dir: checked before fuzzing -------------------------------------------------------
def test_unwritable_failures_dir_is_refused_before_fuzzing():
    out = cli(
        "fuzz",
        "tp_mlp",
        "--impl",
        "missing_allreduce",
        "--max-examples",
        "30",
        "--failures-dir",
        "/proc/shardfuzz-nope",
    )
    refused(out, 2, "--failures-dir", "/proc/shardfuzz-nope", "writable")
    assert "fuzzing tp_mlp" not in out.stdout  # refused up front: no finding to lose


def test_failures_dir_that_is_a_file_is_refused(tmp_path):
    (tmp_path / "impls.py").write_text("")
    out = cli(
        "fuzz",
        "tp_mlp",
        "--impl",
        "missing_allreduce",
        "--max-examples",
        "30",
        "--failures-dir",
        str(tmp_path / "impls.py"),
    )
    refused(out, 2, "--failures-dir", "impls.py", "a file is in the way")


def test_check_failures_dir_creates_and_probes(tmp_path):
    assert check_failures_dir(str(tmp_path / "a" / "b")) == str(tmp_path / "a" / "b")
    assert os.listdir(tmp_path / "a" / "b") == []  # the probe file is gone
    with pytest.raises(InvalidArgument, match="SHARDFUZZ_FAILURES_DIR"):
        check_failures_dir("/proc/nope", "$SHARDFUZZ_FAILURES_DIR")


def test_a_failure_file_that_cannot_be_written_does_not_lose_the_finding(tmp_path, capsys):
    rec = FailureRecorder(str(tmp_path / "f"))
    rec.directory = "/proc/shardfuzz-gone"  # the directory vanished after the check
    runner = Runner(os.path.join(DATA, "toy_target.py"), "wrong_rank1", hooks=[rec])
    with pytest.raises(shardfuzz.Mismatch):
        runner.run_case(Case(target="toy", world_size=2, mesh=(2,), sizes={"n": 3}, split=("n",)))
    assert rec.errors and "could not write the failure file" in capsys.readouterr().err


# -- None outputs --------------------------------------------------------------------------------
def test_none_for_a_tensor_output_is_a_finding_naming_output_and_rank():
    """A gradient left None (an expert that got no tokens) was a usage error, exit 2, with no case,
    no shrink and no failure file: a new user's MoE bug (NeMo Automodel#2995) could not be shown."""
    out = cli("case", "tp_mlp", "--impl", os.path.join(DATA, "bad_returns.py") + "::ret_none_grad", OK)
    refused(out, 1, "layout", "output 'grad_b2': rank 0 returned None, expected a tensor", "not a zero one")


def test_gradients_a_raw_collective_cut_off_are_none_and_the_report_says_what_cuts_a_graph():
    """Two new users' raw all_to_all_single into a new buffer (no backward) left their gradients
    None: the report spoke only of a gradient never computed for an expert without tokens."""
    impl = os.path.join(DATA, "bad_returns.py") + "::gather_into_new_buffer"
    out = cli("case", "tp_mlp", "--impl", impl, OK)
    refused(out, 1, "layout", "output 'grad_x': rank 0 returned None", "a raw torch.distributed collective")


def test_a_target_file_that_raises_at_import_names_its_line(tmp_path):
    """A NameError at a target file's top level was reported with no line, and no traceback either."""
    bad = tmp_path / "broken_target.py"
    bad.write_text("import shardfuzz\n\nTARGET = make_target()\n")
    out = cli("fuzz", str(bad), "--max-examples", "1")
    refused(
        out, 2, "raised NameError: name 'make_target' is not defined", f"(at {bad}:3: TARGET = make_target())"
    )


def test_a_tuple_for_the_outputs_is_reported_as_the_contract_not_the_math(tmp_path):
    """A new user's implementation returned a tuple: the report, shrunk to 1 rank, said "the bug is
    in what a rank computes on its own (its math, ...)"."""
    impl = os.path.join(DATA, "bad_returns.py") + "::ret_tuple"
    for case in (OK, OK.replace("world_size=2, mesh=(2,)", "world_size=1, mesh=(1,)")):
        out = cli("case", "tp_mlp", "--impl", impl, case)
        assert out.returncode == 1, out.stdout + out.stderr
        text = out.stdout + out.stderr
        assert "ImplementationReturnError" in text and "returned tuple, expected a dict of outputs" in text, (
            text
        )
        assert "breaks its contract: every rank returns a dict of the target's outputs" in text, text
        assert "its math" not in text, text
    # a campaign's summary, after shrinking to 1 rank, does not blame the math either
    out = cli("fuzz", "tp_mlp", "--impl", impl, "--max-examples", "3", "--failures-dir", str(tmp_path))
    text = out.stdout + out.stderr
    assert out.returncode == 1 and "FOUND rank-error" in text and "world_size=1" in text, text
    assert "its math" not in text, text


def test_none_where_the_oracle_gives_none_is_no_value_and_passes():
    runner = Runner(MISTAKES + "::none_output")
    case = Case(target="none_output", world_size=2, mesh=(2,), sizes={"rows": 3, "cols": 1}, split=("rows",))
    assert runner.run_case(case) < 1


def test_judge_does_not_crash_on_none():
    runner = Runner(MISTAKES + "::none_output")
    case = Case(target="none_output", world_size=2, mesh=(2,), sizes={"rows": 3, "cols": 1}, split=("rows",))
    expected = runner.expected(case)
    from shardfuzz.verdict.judge import check_layouts

    locals_ = [{"total": None, "unused": None}, {"total": expected.ref["total"].float(), "unused": 1}]
    problems = check_layouts(case, runner.target.outputs_for(case), locals_, expected)
    assert (
        "output 'total': rank 0 returned None, expected a tensor (the oracle's global value is [1]"
        in problems[0]
    )
    assert "output 'unused': rank 1 returned an int, the oracle gives None" in problems[1]
    # a numpy array has a shape and a dtype too: it was "returned a tensor [3] float32, expected a
    # tensor", which contradicts itself
    locals_ = [{"total": expected.ref["total"].float().numpy(), "unused": None}] * 2
    problems = check_layouts(case, runner.target.outputs_for(case), locals_, expected)
    assert "output 'total': rank 0 returned a numpy.ndarray [1] float32, expected a tensor" in problems[0], (
        problems
    )


# -- world sizes and environment variables -------------------------------------------------------
def test_huge_world_size_is_refused_before_any_rank_starts():
    out = cli("fuzz", "tp_mlp", "--world-sizes", "1000", "--max-examples", "1")
    refused(out, 2, "world_sizes=1000", "SHARDFUZZ_MAX_WORLD")


def test_world_size_limit_and_its_override(monkeypatch):
    monkeypatch.delenv("SHARDFUZZ_MAX_WORLD", raising=False)
    assert max_world_size() == min(16, 4 * (os.cpu_count() or 1))
    with pytest.raises(InvalidArgument, match="world_sizes=17"):
        shardfuzz.RunConfig(world_sizes=(1, 17))
    monkeypatch.setenv("SHARDFUZZ_MAX_WORLD", "32")
    check_world_size(32)
    assert shardfuzz.RunConfig(world_sizes=(32,)).world_sizes == (32,)
    monkeypatch.setenv("SHARDFUZZ_MAX_WORLD", "0")
    with pytest.raises(InvalidArgument, match="SHARDFUZZ_MAX_WORLD='0'; must be an integer >= 1"):
        shardfuzz.RunConfig()


@pytest.mark.parametrize("duration", ["nan", "inf", "-1s", "0"])
def test_duration_must_be_finite_and_positive(duration):
    out = cli("fuzz", "tp_mlp", f"--duration={duration}")
    refused(out, 2, "--duration", duration)


def test_bad_pool_size_variable_is_refused_naming_it():
    out = cli("fuzz", "tp_mlp", "--max-examples", "2", env={"SHARDFUZZ_MAX_POOL_RANKS": "abc"})
    refused(out, 2, "SHARDFUZZ_MAX_POOL_RANKS='abc'", "integer >= 1")


@pytest.mark.parametrize(
    "name", ["SHARDFUZZ_MAX_POOL_RANKS", "SHARDFUZZ_WORKER_THREADS", "SHARDFUZZ_DRIVER_THREADS"]
)
@pytest.mark.parametrize("value", ["abc", "0", "-3", "1.5"])
def test_every_numeric_variable_is_validated(monkeypatch, name, value):
    monkeypatch.setenv(name, value)
    with pytest.raises(InvalidArgument, match=f"{name}={value!r}"):
        shardfuzz.RunConfig()


def test_env_int_defaults():
    assert env_int("SHARDFUZZ_NOT_SET_ANYWHERE", 7, 1) == 7


def test_search_path_entries_must_be_folders(tmp_path, monkeypatch):
    from shardfuzz.spec.refs import add_search_path, search_path

    monkeypatch.setenv("SHARDFUZZ_PATH", str(tmp_path / "nope"))
    with pytest.raises(
        TargetError, match=r"environment variable SHARDFUZZ_PATH holds .*nope.*not a directory"
    ):
        search_path()
    with pytest.raises(TargetError, match=r"--search-path=.*nope.*is not a directory"):
        add_search_path([str(tmp_path / "nope")])


# -- implementations ------------------------------------------------------------------------------
def test_an_implementation_that_is_not_callable_is_refused():
    out = cli("fuzz", "tp_mlp", "--impl", os.path.join(DATA, "impls.py") + "::_HOLD", "--max-examples", "2")
    refused(out, 2, "_HOLD", "is a list, not a function")
    assert "FOUND" not in out.stdout


def test_an_implementation_that_does_not_exist_is_refused():
    out = cli("fuzz", "tp_mlp", "--impl", os.path.join(DATA, "impls.py") + "::nothing", "--max-examples", "2")
    refused(out, 2, "nothing", "has no attribute")


# -- Case fields ------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "old, new, named",
    [
        ("mesh=(2,)", "mesh=2", ["mesh=2", "tuple of ints"]),
        (
            "sizes={'batch': 1, 'seq': 1, 'd_model': 1, 'hidden': 2, 'd_out': 1}",
            "sizes=[1, 2]",
            ["sizes=[1, 2]", "dict"],
        ),
        ("options={}", "options=[1]", ["options=[1]", "dict"]),
        ("seed=0", "seed='a'", ["seed='a'", "int"]),
        ("seed=0", "seed=0.5", ["seed=0.5", "int"]),
        ("seed=0", "seed=-1", ["seed=-1", "int"]),
        ("profile='normal'", "profile='bogus'", ["profile='bogus'", "normal, large, small, ties"]),
        ("split=('hidden',)", "split='hidden'", ["split='hidden'", "tuple of size names"]),
        ("world_size=2", "world_size=True", ["world_size=True", "int"]),
        ("target='tp_mlp'", "target=3", ["target=3"]),
    ],
)
def test_bad_case_fields_are_named(old, new, named):
    assert old in OK
    out = cli("case", "tp_mlp", OK.replace(old, new))
    refused(out, 2, *named)


def test_a_missing_size_is_named():
    out = cli("case", "tp_mlp", OK.replace(", 'd_out': 1", ""))
    refused(out, 2, "'d_out'")


def test_a_size_the_target_cannot_take_is_the_targets_error():
    out = cli("case", "tp_mlp", OK.replace("'hidden': 2", "'hidden': 0"))
    refused(out, 2, "target 'tp_mlp'", "ZeroDivisionError", "'hidden': 0")


def test_check_case_names_sizes_against_what_the_target_draws():
    from shardfuzz.verdict.oracle import check_case

    t = shardfuzz.get_target("tp_mlp")
    case = Case.parse(OK.replace("'d_out': 1", "'d_uot': 1"))
    with pytest.raises(
        TargetError, match=r"lacks \['d_out'\] and has \['d_uot'\], which the target does not draw"
    ):
        check_case(t, case)
    with pytest.raises(TargetCodeError, match=r"sizes\['hidden'\]=0 is below the smallest value"):
        check_case(t, Case.parse(OK.replace("'hidden': 2", "'hidden': 0")))
    check_case(t, Case.parse(OK))


# -- the target's own code ---------------------------------------------------------------------------
def test_an_oracle_that_raises_while_fuzzing_is_the_targets_error():
    out = cli("fuzz", ORACLE_RAISES, "--max-examples", "20", "--world-sizes", "1,2")
    refused(out, 2, "target 'row_mean'", "oracle(inputs, case) raised ValueError: oracle bug: rows >= 2")
    assert "oracle_raises.py" in out.stderr and "The target's traceback" in out.stderr
    assert os.path.join("shardfuzz", "oracle.py") not in out.stderr  # only the target's frames
    # and the two ways out, for a reference op that refuses a case the strategy draws
    assert "keep it out of the strategy" in out.stderr and "raise shardfuzz.Unsupported(" in out.stderr
    # a condition on several sizes (a new user's GroupNorm: C/G*H*W >= 2) has no min_size: a .map
    assert "a condition on several sizes, a .map over the cases" in out.stderr, out.stderr


def test_an_oracle_may_refuse_a_case_as_an_implementation_does():
    """The way out the error above names: Unsupported from the oracle rejects the case, counted
    by its reason, never an error and never a pass."""
    target = os.path.join(DATA, "oracle_refuses.py") + "::TARGET"
    result = shardfuzz.run(target, profile="shardfuzz-ci", database=None, max_examples=15, world_sizes=(1, 2))
    assert not result.found, result.report
    assert result.stats.unsupported["one row"] > 0 and result.stats.passed > 0, result.stats.summary()
    # the first case refused for a reason can be looked at: a new user could not, from a count alone
    rerun = result.stats.first_refused["one row"]
    assert rerun.startswith("shardfuzz case ") and "Case(target='row_mean_refusing'" in rerun, rerun
    out = cli("fuzz", target, "--max-examples", "15", "--world-sizes", "1,2", "--no-progress")
    assert out.returncode == 0, out.stdout + out.stderr
    assert "the first refused (one row): shardfuzz case " in out.stdout, out.stdout


def test_a_run_whose_every_case_is_refused_says_it_tested_nothing():
    """A new user's torch TP on Conv2d, mapped to Unsupported as the docs say: every case refused
    ended in Hypothesis' Unsatisfiable traceback and exit 1, which reads as found. It is a usage
    error naming the implementation and the reasons counted."""
    target = os.path.join(DATA, "oracle_refuses.py") + "::REFUSES_ALL"
    said = r"impl='reference': target 'row_mean_refusing_all' ran no example, every case drawn was rejected"
    with pytest.raises(
        InvalidArgument, match=said + r" \(unsupported: not implemented x\d+\): nothing was tested"
    ):
        shardfuzz.run(target, profile="shardfuzz-ci", database=None, max_examples=5, world_sizes=(1,))
    out = cli("fuzz", target, "--max-examples", "5", "--world-sizes", "1")
    refused(out, 2, "ran no example, every case drawn was rejected", "nothing was tested")


def test_a_run_whose_covering_rows_passed_and_then_every_draw_was_refused_says_what_was_tested():
    """The covering rows run before Hypothesis: where they ran, "nothing was tested" was untrue."""
    import collections
    from types import SimpleNamespace

    from shardfuzz.engine.search import nothing_tested
    from shardfuzz.engine.stats import Stats

    stats = Stats(examples=3, unsupported=collections.Counter({"not implemented": 459}))
    runner = SimpleNamespace(stats=stats, impl_name="refuses", target=SimpleNamespace(name="t"))
    said = nothing_tested(runner)
    assert said.startswith(
        "impl='refuses': target 't' ran its 3 covering rows, then every case Hypothesis drew"
    )
    assert "(unsupported: not implemented x459): only those 3 cases were tested" in said, said


def test_an_oracle_that_raises_on_a_given_case_is_the_targets_error():
    case = (
        "Case(target='row_mean', world_size=1, mesh=(1,), sizes={'rows': 2, 'cols': 1}, split=('rows',), "
        "dtype='float32', profile='normal', seed=0, options={})"
    )
    out = cli("case", ORACLE_RAISES, case)
    refused(out, 2, "target 'row_mean'", "ValueError: oracle bug: rows >= 2", "'rows': 2")


# -- strict specs: names that do not exist --------------------------------------------------------------
def test_a_misspelt_input_layout_key_is_a_usage_error():
    case = (
        "Case(target='misspelt_layout', world_size=2, mesh=(2,), sizes={'rows': 3, 'cols': 1}, "
        "split=('rows',), dtype='float32', profile='normal', seed=0, options={})"
    )
    out = cli("case", MISTAKES + "::misspelt_layout", case)
    refused(out, 2, "Target 'misspelt_layout': input_layouts key 'xx' is not an input; inputs are ['x']")


def test_case_on_a_file_of_several_targets_runs_the_target_the_case_names(capsys):
    from shardfuzz.frontends.cli import main

    case = (
        "Case(target='none_output', world_size=2, mesh=(2,), sizes={'rows': 3, 'cols': 1}, "
        "split=('rows',), dtype='float32', profile='normal', seed=0, options={})"
    )
    assert main(["case", MISTAKES, case]) == 0, capsys.readouterr()
    assert "PASS: Case(target='none_output'" in capsys.readouterr().out
    assert main(["case", MISTAKES, case.replace("'none_output'", "'nonesuch'")]) == 2
    assert "has no target 'nonesuch'; it defines ['misspelt_layout'" in capsys.readouterr().err
    with pytest.raises(TargetError, match="input_layouts key 'xx' is not an input"):
        shardfuzz.run(MISTAKES + "::misspelt_layout", max_examples=5, database=None)


def test_a_strategy_that_draws_past_the_bounds_it_declares_is_a_usage_error_before_a_finding():
    """A ``.map`` under ``bounded_like`` that moves a size past the declared bounds made findings
    whose failure files replay refused ("never draws this case"): now the first such draw stops the
    run, naming the size and its bounds, from the covering rows and from Hypothesis' draws alike
    (there shrunk to a smaller case outside, and never reported as flaky)."""
    from shardfuzz.engine.search import search
    from shardfuzz.engine.settings import build_settings

    where = "its strategy drew a case outside the bounds it declares (sizes['cols']=3; it draws 1..2"
    with pytest.raises(TargetError, match=re.escape(where)):
        shardfuzz.run(MISTAKES + "::past_bounds", max_examples=20, database=None)
    runner = Runner(MISTAKES + "::past_bounds", config=shardfuzz.RunConfig(world_sizes=(1, 2)))
    with pytest.raises(TargetError, match=re.escape(where)) as e:
        search(runner, build_settings("shardfuzz-ci", max_examples=20), database=None, rows=False)
    assert "world_size=1" in str(e.value) and "'rows': 1" in str(e.value), str(e.value)  # shrunk
    assert runner.stats.examples < 20  # nothing ran after it: the shrink looks only at draws


def test_a_misspelt_option_name_is_a_usage_error():
    case = (
        "Case(target='ulysses', world_size=2, mesh=(2,), sizes={'batch': 1, 'seq': 2, 'kv_heads': 1, "
        "'q_per_kv': 1, 'head_dim': 2}, split=('seq',), options={'causl': True})"
    )
    out = cli("case", "ulysses", case)
    refused(out, 2, "lacks ['causal'] and has ['causl'], which the target does not draw")
    # the options it draws, with the parameters of its own profiles only (the opt-in edge
    # profile's were listed for every target, a new user's audit)
    refused(out, 2, "target 'ulysses' draws the options ['causal', 'grid', 'scale']")


@pytest.mark.parametrize(
    "target, message",
    [
        (
            "misspelt_magnitude",
            "magnitude key 'totl' is not an output, and output 'total' has no magnitude; outputs are ['total', 'unused']",
        ),
        ("undeclared_output", "declared output 'totl' is not returned by the oracle"),
    ],
)
def test_other_names_that_do_not_exist_are_usage_errors(target, message):
    runner = Runner(MISTAKES + "::" + target)
    case = Case(target=target, world_size=1, mesh=(1,), sizes={"rows": 1, "cols": 1}, split=("rows",))
    with pytest.raises(TargetError, match=message.replace("[", r"\[").replace("]", r"\]")):
        runner.expected(case)


def test_gradients_must_be_outputs():
    t = shardfuzz.get_target("moe")  # outputs declared as a mapping (tp_mlp's depend on the case)
    with pytest.raises(TargetError, match="gradients names \\['grad_q'\\], which are not outputs"):
        t.derive("moe2", gradients=("grad_x", "grad_q"))


# -- failure files with bad fields: replay and repro refuse them up front --------------------------------
@pytest.mark.parametrize("command", ["replay", "repro"])
def test_a_record_with_a_missing_size_is_refused(tmp_path, command):
    case = Case.parse(OK).to_dict()
    del case["sizes"]["d_out"]
    path = failure_record(tmp_path, "case-missing-size.json", case={"sizes": case["sizes"]})
    extra = ["-o", str(tmp_path / "out.py")] if command == "repro" else []
    out = cli(command, path, *extra)
    refused(out, 2, path, "field 'case' is invalid", "lacks ['d_out']")
    assert not (tmp_path / "out.py").exists()


def test_a_record_with_a_string_seed_is_refused(tmp_path):
    path = failure_record(tmp_path, "case-seed-str.json", case={"seed": "a"})
    refused(cli("replay", path), 2, path, "field 'case' is invalid: seed='a'")


@pytest.mark.parametrize("command", ["replay", "repro"])
def test_a_record_with_an_option_value_of_another_kind_than_drawn_is_refused(tmp_path, command):
    """A string for a number reached the target's oracle and failed there, named as the target's
    error (a new user's hand-edited ``"steps": "2"``)."""
    path = failure_record(
        tmp_path, "case-scale-str.json", case={"profile": "large", "options": {"scale": "10"}}
    )
    extra = ["-o", str(tmp_path / "out.py")] if command == "repro" else []
    out = cli(command, path, *extra)
    refused(
        out, 2, path, "field 'case' is invalid: options['scale']='10': target 'tp_mlp' draws scale as a float"
    )
    assert not (tmp_path / "out.py").exists()
    ok = failure_record(tmp_path, "case-scale-int.json", case={"profile": "large", "options": {"scale": 10}})
    assert "field 'case'" not in cli("replay", ok).stderr  # an int for a float is taken


@pytest.mark.parametrize("command", ["replay", "repro"])
def test_a_record_whose_implementation_cannot_be_imported_is_refused(tmp_path, command):
    path = failure_record(tmp_path, "unknown-impl.json", impl="func", impl_ref="no_such_mod:func")
    extra = ["-o", str(tmp_path / "out.py")] if command == "repro" else []
    out = cli(command, path, *extra)
    refused(out, 2, path, "field 'impl_ref'", "no_such_mod")
    assert not (tmp_path / "out.py").exists()


def test_a_record_whose_implementation_is_not_one_is_refused_before_anything_runs(tmp_path):
    # a callable that takes no ctx (the CLI's own entry point) ran on the ranks and was reported
    # as a finding of "a different cause"
    path = failure_record(
        tmp_path, "not-an-impl.json", impl="entry", impl_ref="shardfuzz.frontends.cli:entry", impl_kwargs={}
    )
    refused(
        cli("replay", path),
        2,
        path,
        "field 'impl_ref'",
        "is not an implementation: it does not take the rank's ctx",
    )


@pytest.mark.parametrize(
    "changes, named",
    [
        ({"backend": "mpi"}, "field 'backend' is 'mpi'; allowed: gloo, nccl"),
        ({"impl_kwargs": [1]}, "field 'impl_kwargs' is [1]; must be an object"),
        ({"target_ref": "/no/such/dir/t.py::t"}, "field 'target_ref'"),
        ({"case": {"world_size": 2000, "mesh": [2000]}}, "world_size=2000"),
    ],
)
def test_other_bad_record_fields_are_named(tmp_path, changes, named):
    path = failure_record(tmp_path, "bad.json", **changes)
    refused(cli("replay", path), 2, path, named)


# -- the pytest plugin's options ---------------------------------------------------------------------


@pytest.mark.parametrize(
    "option, named",
    [
        ("--shardfuzz-failures-dir=/proc/shardfuzz-nope", "--shardfuzz-failures-dir='/proc/shardfuzz-nope'"),
        ("--shardfuzz-timeout=nan", "--shardfuzz-timeout=nan"),
        ("--shardfuzz-world-sizes=2,1000", "--shardfuzz-world-sizes=1000"),
    ],
)
def test_bad_plugin_options_are_usage_errors(pytester, option, named):
    pytester.makepyfile(test_a="def test_plain():\n    pass\n")
    result = pytester.runpytest_inprocess("-p", "no:cacheprovider", option)  # fails at configure
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    text = "\n".join(result.outlines + result.errlines)
    assert named in text and "Traceback" not in text, text


def test_a_pinned_option_the_target_lacks_is_an_error_naming_it():
    with pytest.raises(
        InvalidArgument,
        match="option 'lse_gradient' pinned, but target 'ring_attention' has no such option",
    ) as info:
        shardfuzz.run(
            "ring_attention", "reference", max_examples=2, database=None, options={"lse_gradient": False}
        )
    # the target's own options first; a value profile's (scale, grid) said to be the profiles'
    # (a new user read grid and scale as options of their target)
    listed = str(info.value).split("its options: ")[1]
    own, profiles = listed.split(" (and ")
    assert own == "logit_scale, lse_grad, variant", listed
    assert profiles == "grid, scale, set by its value profiles)", listed


@pytest.mark.parametrize(
    "target,pinned,profile",
    [
        ("tp_mlp", {"grid": 0.5}, "ties"),
        ("tp_mlp", {"scale": 100.0}, "large"),
        ("ring_allreduce", {"edge": "subnormal"}, "edge"),
        ("ring_allreduce", {"edge": "max", "edge_slot": 3}, "edge"),
    ],
)
def test_a_pinned_value_profile_parameter_puts_every_case_in_its_profile(target, pinned, profile):
    """``--option grid=0.5`` failed on the first case drawn in another profile, "no such option;
    its options: scale, ...": the parameters of a case's own profile were listed as the target's."""
    t = get_target(target)
    drawn = sampling.draw_pool(t.strategy(options=tuple(pinned.items())), 5, 40)
    assert len(drawn) >= 30
    for case, _ in drawn:
        assert case.profile == profile, case
        assert {k: case.options[k] for k in pinned} == pinned, case
        if profile == "edge":
            assert edge_problem(case.options) is None, case
        # the other profiles' parameters are gone
        others = {p for name, ps in PROFILE_PARAMS.items() if name != profile for p in ps} - set(
            PROFILE_PARAMS[profile]
        )
        assert not others & set(case.options), case
    # a case already in the profile keeps its own draws where nothing is pinned
    native = next(c for c, _ in sampling.draw_pool(t.strategy(), 5, 200) if c.profile == profile)
    assert pin_options(target, pinned, native).options == {**native.options, **pinned}


@pytest.mark.parametrize(
    "target,pinned,message",
    [
        (
            "ring_allreduce",
            {"scale": 0},
            "option 'scale'=0 pinned; a value profile's scale is a number in [1e-06, 1e+06] (above 1: large",
        ),
        (
            "tp_mlp",
            {"scale": 0.01},
            "scale=0.01 pinned: a parameter of the 'small' value profile, which target 'tp_mlp' does not draw; it draws",
        ),
        (
            "tp_mlp",
            {"grid": -1.0},
            "option 'grid'=-1.0 pinned; a value profile's grid is a number in [0.00390625, 256]",
        ),
        (
            "tp_mlp",
            {"grid": 0.5, "scale": 10.0},
            "options grid, scale pinned together, but no value profile has them all",
        ),
        (
            "ring_allreduce",
            {"edge": "huge"},
            "options['edge']='huge'; it draws max, subnormal, signed_zero, repeat",
        ),
        ("ring_allreduce", {"edge_exp": 9}, "options['edge_exp']=9; it draws an int in [0, 7]"),
        # tp_mlp draws no edge profile: its parameters are no option of it
        (
            "tp_mlp",
            {"edge": "max"},
            "option 'edge' pinned: a parameter of the edge value profile, which target 'tp_mlp' does not "
            "draw; it draws large, normal, ties",
        ),
        # a grid of 1e-300 made every input NaN, a scale of 1e39 every one inf
        ("tp_mlp", {"grid": 1e-300}, "option 'grid'=1e-300 pinned; a value profile's grid is a number in"),
        ("tp_mlp", {"scale": 1e39}, "option 'scale'=1e+39 pinned; a value profile's scale is a number in"),
        (
            "moe",
            {"scale": 10.0},
            "option 'scale' pinned: a parameter of the large and small value profiles, which target 'moe' "
            "does not draw; it draws normal, ties",
        ),
    ],
)
def test_a_pinned_value_profile_parameter_out_of_its_range_is_an_error_naming_it(target, pinned, message):
    with pytest.raises(InvalidArgument, match=re.escape(message)):
        shardfuzz.run(target, "reference", max_examples=2, database=None, options=pinned)


def test_a_pinned_value_profile_on_a_target_without_bounds_replays():
    """A target that declares no bounds declares no profiles either: a pinned scale puts its cases
    in a profile its draws may not show, and a replay (check_case) takes that profile's own
    parameters, checked as a pin is (it refused them: "has ['scale'], which the target does not
    draw")."""
    moe = get_target("moe")  # draws normal and ties
    unbounded = dataclasses.replace(moe, cases=moe.drawn().map(lambda c: c))
    assert bounds_of(unbounded.drawn()) is None
    drawn = sampling.draw_pool(unbounded.strategy(options=(("scale", 0.01),)), 5, 20)
    assert drawn and all(c.profile == "small" and c.options["scale"] == 0.01 for c, _ in drawn)
    check_case(unbounded, drawn[0][0])  # what a replay of its failure file checks
    bad = dataclasses.replace(drawn[0][0], options={**drawn[0][0].options, "scale": -1.0})
    with pytest.raises(TargetError, match=re.escape("case options['scale']=-1.0; the 'small' value profile")):
        check_case(unbounded, bad)


@pytest.mark.parametrize(
    "pinned,why",
    [  # DTensor's own crash on place=X3 was reported as a finding; op=aten.cumsum ran past an
        # exclusion by the op's full name, the known scan bug coming back as new
        ({"place": "X3"}, "place not one of R, S<dim of the tensor>, Psum"),
        ({"op": "aten.cumsum"}, "op named without its overload: aten.cumsum.default (x250)"),
        (
            {"op": "cumsum"},
            "op not drawn: not an op of this torch as named: did you mean 'aten.cumsum.default'? (x250)",
        ),
        ({"op": "nope_op"}, "op not drawn: not an op of this torch (x250)"),
        ({"op": "aten.lgamma.default"}, "op not drawn: numerics or input structure of its own (x250)"),
    ],
)
def test_pinned_options_the_target_supports_no_case_with_are_an_error_naming_why(pinned, why):
    with pytest.raises(InvalidArgument, match="supports none of the 250 cases drawn with them") as e:
        shardfuzz.run("dtensor_ops", "torch_dtensor", max_examples=2, database=None, options=pinned)
    assert why in str(e.value), str(e.value)
    case = next(c for c, _ in pool_for(get_target("dtensor_ops")) if len(c.mesh) == 2)
    on_2d = dataclasses.replace(case, options={**case.options, "place": "S0"})  # one entry, two axes
    assert "place not one of" in get_target("dtensor_ops").supports(on_2d)


def test_a_second_impl_is_a_usage_error_not_a_silent_replacement():
    """``--impl reference --impl offset_floor`` fuzzed only the second, saying nothing."""
    out = cli("fuzz", "tp_mlp", "--impl", "reference", "--impl", "missing_f_backward", "--max-examples", "1")
    assert out.returncode == 2, out.stdout + out.stderr
    assert "--impl given twice ('reference', 'missing_f_backward'); one implementation per run" in out.stderr
    assert "fuzzing" not in out.stdout  # before any fuzzing


@pytest.mark.parametrize(
    "target,pinned,message",
    [  # a string for a number reached the target's inputs() and crashed there, blamed on the target
        (
            "zero_adamw",
            {"steps": "2"},
            "option 'steps'='2' pinned, but target 'zero_adamw' draws steps as an int",
        ),
        ("ring_attention", {"lse_grad": 1}, "draws lse_grad as a bool (e.g. "),
        # and the quoting the shell keeps (ord="2" is ord=2 to it: a DTensor maintainer tried both)
        ("ring_attention", {"variant": 2}, """give a string (on the command line: --option "variant='2'")"""),
        ("ring_attention", {"logit_scale": "big"}, "draws logit_scale as a float (e.g. "),
    ],
)
def test_a_pinned_option_value_of_another_kind_than_drawn_is_an_error_naming_it(target, pinned, message):
    with pytest.raises(InvalidArgument, match=re.escape(message)):
        shardfuzz.run(target, "reference", max_examples=2, database=None, options=pinned)
    case = next(c for c, _ in pool_for(get_target(target)) if set(pinned) <= set(c.options))
    (name,) = pinned
    fine = 3 if name == "logit_scale" else case.options[name]  # an int for a float is fine
    assert pin_options(target, {name: fine}, case).options[name] == fine
    assert pin_options(target, {name: None}, case).options[name] is None  # an option may be optional


def test_a_list_option_value_says_how_to_give_it_quoted():
    """A DTensor maintainer's --option dims=[0] got a generic error; dtensor_ops draws it as a string."""
    out = cli("fuzz", "dtensor_ops", "--option", "dims=[0]", "--max-examples", "1")
    assert out.returncode == 2 and "--option \"dims='[0]'\"" in out.stderr, out.stderr


def test_a_moved_file_is_found_beside_a_colleague_without_a_project_marker(tmp_path, monkeypatch):
    """A failure file's target moved to a folder with no pyproject.toml, setup.* or .git above it:
    the recorded relative path is looked up in the current folder, as documented (it was tried only
    under a marked project root, so the replay failed "does not exist" beside the file)."""
    from shardfuzz.errors import TargetError
    from shardfuzz.spec.refs import _marked_root, resolve_file

    colleague = tmp_path / "colleague"
    colleague.mkdir()
    (colleague / "col_linear.py").write_text("TARGET = None\n")
    assert _marked_root(str(colleague)) is None, "a marker above the test's folder"
    gone = str(tmp_path / "mytargets" / "col_linear.py")
    monkeypatch.chdir(colleague)
    assert resolve_file(gone, "target_ref", "col_linear.py") == str(colleague / "col_linear.py")
    with pytest.raises(TargetError, match="does not exist"):
        resolve_file(gone, "target_ref", "other.py")


def test_a_failure_file_field_is_named_once_in_its_error():
    """'field 'target_ref': target_ref: file ... does not exist': the check named it a second time."""
    from shardfuzz.engine import failure_load
    from shardfuzz.spec.refs import resolve_file

    with pytest.raises(InvalidArgument) as e:
        failure_load._field(
            "failure file 'f.json'", "target_ref", resolve_file, "/gone/t.py", "target_ref", "t.py"
        )
    assert str(e.value).startswith("failure file 'f.json': field 'target_ref': file "), str(e.value)
    assert str(e.value).count("target_ref") == 1, str(e.value)


def test_a_target_hook_that_raises_on_a_pinned_option_is_the_targets_error_not_the_fuzzers(tmp_path):
    """A new user's per_group function looked a pinned ``--option`` up in a table of the values the
    strategy draws: KeyError while the covering rows were made, and exit 3, "the fuzzer itself
    failed". It is the target's error: exit 2, naming the hook and the case, with its traceback."""
    target = os.path.join(os.path.dirname(__file__), "data", "hook_raises_target.py")
    out = run_cli(
        "fuzz", target, "--option", "k=4", "--max-examples", "5", "--no-progress", cwd=str(tmp_path)
    )
    assert out.returncode == 2, out.stdout + out.stderr
    assert "its per_group['width'](case) raised KeyError: 4" in out.stderr, out.stderr
    assert "the fuzzer itself failed" not in out.stdout + out.stderr
    assert run_cli("fuzz", target, "--max-examples", "5", "--no-progress", cwd=str(tmp_path)).returncode == 0


def test_a_target_hook_that_returns_no_number_is_the_targets_error_too():
    """A per_group function returning None (a lookup that missed) was converted outside the guard:
    a TypeError, and "the fuzzer itself failed" (a review found it)."""
    import types

    from shardfuzz.spec.triggers import quantity

    case = Case(target="toy", world_size=2, mesh=(2,), sizes={"n": 2}, split=("n",))
    with pytest.raises(TargetCodeError, match=r"its per_group\['width'\]\(case\) raised TypeError"):
        quantity(types.SimpleNamespace(name="toy"), "width", lambda c: None, case)
    assert quantity(types.SimpleNamespace(name="toy"), "width", lambda c: 3.0, case) == 3
