"""The shardfuzz command: exit codes 0 / 1 / 2 / 3 and its output."""

import os
import pathlib
import re
import types

import pytest

from shardfuzz.engine import covering
from shardfuzz.engine.runner import Runner
from shardfuzz.frontends.testing import run_cli
from shardfuzz.spec.triggers import SPLIT_RULES_DIFFER

EXAMPLE = os.path.join(os.path.dirname(os.path.dirname(__file__)), "examples", "mean_target.py")


def cli(*args, timeout=300):
    """``shardfuzz ARGS`` in this process (conftest.run_cli): the command's own code, without a
    second ``import torch``; ``timeout`` is kept for the subprocess form's signature."""
    return run_cli(*args)


def test_an_error_nobody_caught_exits_3_with_its_traceback_never_1(monkeypatch, capsys):
    """A maintainer's pinned placement crashed the progress line's conditions with an IndexError:
    the traceback, and exit 1, which CI reads as a counterexample found."""
    from shardfuzz.frontends import cli

    def crash(argv=None):
        raise IndexError("tuple index out of range")

    codes = []
    monkeypatch.setattr(cli, "main", crash)
    monkeypatch.setattr(cli, "exit_without_teardown", codes.append)
    cli.entry()
    err = capsys.readouterr().err
    assert codes == [cli.EXIT_INFRA] and "Traceback" in err and "IndexError: tuple index out of range" in err
    assert "the fuzzer itself failed: an error nobody caught" in err and "nothing was found" in err


def test_list_shows_targets_and_implementations():
    out = cli("list")
    assert out.returncode == 0, out.stderr
    assert "tp_mlp:" in out.stdout and "vocab_parallel:" in out.stdout
    assert "missing_allreduce" in out.stdout and "planted bug" in out.stdout
    # each implementation's record says what it is: torch's DTensor SP plan is verified to pass
    line = next(x for x in out.stdout.splitlines() if x.strip().startswith("torch_sp_dtensor "))
    assert "verified to pass: torch SP's DTensor plan" in line, line


def test_list_shows_a_files_target_and_its_implementations():
    out = cli("list", EXAMPLE)
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines() == [
        "row_mean:",
        "  reference                reference (fuzzed when no --impl is given)",
        "  mean_of_means            under test",
        "(under test: fuzz it with --impl NAME; a record (PlantedBug, ExpectedFailure, Verified) is "
        "optional and lets a test check what a run finds (docs/reference/target-spec.md))",
    ]
    out = cli("list", "nope.py")
    assert out.returncode == 2 and "'nope.py' does not exist" in out.stderr, out.stderr


def test_list_of_a_file_with_several_targets_shows_each_and_a_run_asks_which(tmp_path):
    """``shardfuzz list FILE`` is how a user learns what a file holds: every target it defines (it
    exited 2 with 'add ::NAME', the one thing it was asked to show); a run still needs one."""
    two = tmp_path / "two_targets.py"
    two.write_text(
        pathlib.Path(EXAMPLE).read_text()
        + "\nimport dataclasses\nSECOND = dataclasses.replace(TARGET, name='row_mean_two')\n"
    )
    out = cli("list", str(two))
    assert out.returncode == 0, out.stderr
    heads = [line for line in out.stdout.splitlines() if not line.startswith((" ", "("))]
    assert heads == ["row_mean:", "row_mean_two:"], out.stdout
    assert out.stdout.count("mean_of_means") == 2, out.stdout
    out = cli("fuzz", str(two), "--max-examples", "1")
    assert out.returncode == 2, out.stdout + out.stderr
    assert "defines several targets ['row_mean', 'row_mean_two']; add ::NAME" in out.stderr, out.stderr


def test_fuzz_clean_target_exits_0_with_a_summary():
    out = cli("fuzz", EXAMPLE, "--max-examples", "20")
    assert out.returncode == 0, out.stdout + out.stderr
    assert "row_mean" in out.stdout and "reference" in out.stdout and "20 examples" in out.stdout
    assert "covering rows first" not in out.stdout  # 20 is more than its rows
    # fewer examples asked than the target has covering rows: the run says why it runs more (a
    # new user read 7 examples for --max-examples 5 as a bug)
    out = cli("fuzz", EXAMPLE, "--max-examples", "1")
    rows = len(covering.rows_for(Runner(EXAMPLE)))
    assert out.returncode == 0 and rows > 1, out.stdout + out.stderr
    assert f", its {rows} covering rows first (more than the 1 example asked) ..." in out.stdout, out.stdout


def test_a_closest_pass_that_is_an_upper_bound_is_measured_again_with_the_noise_term():
    # derandomized: row_mean's closest pass is a sure pass, judged without the noise term; its case
    # is judged once more with it, and measures no more than the bound; the measure comes first (new
    # users read "closest pass at most 1 (...)" as a run at the edge of its tolerance)
    out = cli("fuzz", EXAMPLE, "--max-examples", "20", "--profile", "shardfuzz-ci")
    assert out.returncode == 0, out.stdout + out.stderr
    found = re.search(
        r"closest pass (?P<low>[\d.e+-]+) \(measured[^)]*; the passes not measured passed a stricter check, "
        r"the bound without the noise term(, at up to (?P<high>[\d.e+-]+))?\)",
        out.stdout,
    )
    assert found is not None and "closest pass at most" not in out.stdout, out.stdout
    assert found["high"] is None or float(found["low"]) <= float(found["high"]), out.stdout


def test_an_option_that_only_one_branch_of_the_cases_has_can_be_pinned():
    # tp_mlp draws the plain MLP (no option) or sequence parallelism (option sequence_parallel)
    out = cli(
        "fuzz", "tp_mlp", "--option", "sequence_parallel=True", "--max-examples", "6", "--world-sizes", "2"
    )
    assert out.returncode == 0, out.stdout + out.stderr
    assert "sequence parallel 100%" in out.stdout, out.stdout


def test_a_pinned_value_the_target_never_draws_is_warned_about_with_the_closest_drawn_one():
    """--option kind=1f1bb ran as a clean run of a value the target never draws (a new user's
    norm=rmss); a target may take values it does not draw, so the run goes on, with a warning."""
    out = cli("fuzz", "pipeline_1f1b", "--option", "kind=1F1B", "--max-examples", "3", "--world-sizes", "2")
    assert out.returncode == 0, out.stdout + out.stderr
    assert (
        ("shardfuzz: warning: option kind='1F1B' pinned, but none of the ") in out.stderr
        and " cases drawn of target 'pipeline_1f1b' has it: they have kind '1f1b', 'gpipe'" in out.stderr
    ), out.stderr
    assert "did you mean '1f1b'?" in out.stderr, out.stderr
    # a drawn value, and a value of another kind than strings, get none
    for pin in ("kind=gpipe", "microbatches=9"):
        quiet = cli("fuzz", "pipeline_1f1b", "--option", pin, "--max-examples", "3", "--world-sizes", "2")
        assert quiet.returncode == 0 and "warning" not in quiet.stderr, quiet.stderr


def test_a_usage_error_is_the_message_first_and_a_misspelled_option_gets_the_closest_one():
    """A new user's --max-exmaples got the top-level usage and no hint; a bad --world-sizes printed
    its message under fuzz's 15-line usage, where it was easy to miss."""
    out = cli("fuzz", "tp_mlp", "--max-exmaples", "10")
    assert out.returncode == 2
    assert out.stderr.splitlines() == [
        "shardfuzz fuzz: error: unrecognized arguments: --max-exmaples (did you mean --max-examples?) 10",
        "(see 'shardfuzz fuzz --help' for its usage)",
    ], out.stderr
    out = cli("fuzz", "tp_mlp", "--world-sizes", "0")
    assert out.returncode == 2
    assert out.stderr.splitlines()[0].startswith("shardfuzz fuzz: error: argument --world-sizes: "), (
        out.stderr
    )
    assert len(out.stderr.splitlines()) == 2, out.stderr


def test_an_option_from_other_fuzzers_says_what_shardfuzz_does_instead(capsys):
    """A new user's ``--seed 3`` was answered "did you mean --fleet?"."""
    from shardfuzz.frontends.cli import main

    with pytest.raises(SystemExit) as e:
        main(["fuzz", "tp_mlp", "--seed", "3"])
    err = capsys.readouterr().err
    assert (
        e.value.code == 2 and "--seed (no such option: --profile shardfuzz-ci draws the same cases" in err
    ), err
    assert "did you mean" not in err, err


def test_repro_given_a_rerun_line_says_it_takes_failure_files(capsys):
    """A new user gave ``repro`` the report's rerun line (``--impl X 'Case(...)'``) and read only
    "unrecognized arguments"."""
    from shardfuzz.frontends.cli import main

    case = "Case(target='tp_mlp', world_size=2, mesh=(2,), sizes={}, split=())"
    with pytest.raises(SystemExit) as e:
        main(["repro", "tp_mlp", "--impl", "missing_allreduce", case])
    err = capsys.readouterr().err
    assert e.value.code == 2 and "; repro takes failure files (FILE: a finding writes one under" in err, err
    assert "shardfuzz case TARGET --impl IMPL 'Case(...)', reruns a case" in err, err
    with pytest.raises(SystemExit):
        main(["fuzz", "tp_mlp", "--impl", "missing_allreduce", case])  # a target, not a failure file
    assert "takes failure files" not in capsys.readouterr().err


def test_case_of_a_refused_case_prints_its_reason_and_its_message():
    """``case`` printed only the short reason an implementation counts its refusals by (``q heads %
    sp``), not its message (``q heads 2 not divisible by sp 3``): a new user's Ulysses audit."""
    causes = os.path.join(os.path.dirname(__file__), "data", "cause_impls.py")
    toy = os.path.join(os.path.dirname(__file__), "data", "toy_target.py")
    case = (
        "Case(target='toy', world_size=3, mesh=(3,), sizes={'n': 3}, split=('n',), dtype='float32', "
        "profile='normal', seed=0, options={})"
    )
    out = cli("case", toy, "--impl", f"{causes}::refuses_odd_worlds", case)
    assert out.returncode == 2, out.stdout + out.stderr
    assert out.stderr.strip() == "UNSUPPORTED: odd world (3 ranks: this one splits in halves only)", (
        out.stderr
    )


def test_a_run_with_a_finding_does_not_warn_of_its_refused_share():
    """A new user's batch norm was told to rewrite its strategy (63% of 27 drawn cases refused) in a
    run that found its bug at example 1: the shrink drew tiny cases the target refuses."""
    from shardfuzz.frontends.campaign import _fault_lines

    row = {"found": False, "unsupported": 17, "examples": 10}
    assert any("17 of 27 drawn cases (63%) were refused" in line for line in _fault_lines(row))
    assert not any("were refused" in line for line in _fault_lines({**row, "found": True}))


def test_a_clean_run_says_when_it_refused_many_cases_and_what_it_never_reached():
    """A new user's target refused half its cases as unsupported: Hypothesis steered away from
    them, its own trigger stayed at 0%, and the summary said only how many were rejected. An
    implementation that refuses odd worlds, on worlds 2 and 3: world>=3 is never reached."""
    causes = os.path.join(os.path.dirname(__file__), "data", "cause_impls.py")
    toy = os.path.join(os.path.dirname(__file__), "data", "toy_target.py")
    args = ("fuzz", toy, "--impl", f"{causes}::refuses_odd_worlds", "--max-examples", "20", "--no-progress")
    out = cli(*args, "--world-sizes", "2,3")
    assert out.returncode == 0, out.stdout + out.stderr
    refused = re.search(r"(\d+) of (\d+) drawn cases \((\d+)%\) were refused as unsupported", out.stdout)
    assert refused, out.stdout
    n, drawn, share = map(int, refused.groups())
    assert (
        drawn == n + 20 and share >= 25 and f"({n} more cases drawn, rejected as unsupported)" in out.stdout
    )
    never = next(x for x in out.stdout.splitlines() if "never reached:" in x)
    assert "world>=3" in never, out.stdout
    # every world supported: neither line
    out = cli(*args, "--world-sizes", "2,4")
    assert out.returncode == 0, out.stdout + out.stderr
    assert "refused as unsupported:" not in out.stdout and "never reached" not in out.stdout, out.stdout


def test_a_long_clean_run_says_which_conditions_it_met_far_less_often_than_its_strategy_draws():
    """A new user's 1,500-example clean run met bfloat16 in 6% and world>=3 in 5% of its examples
    (the strategy draws them in about a third), and nothing said so: Hypothesis dwelt near its
    closest pass. A condition met in under a quarter of its drawn share is named, with both."""
    import collections

    from shardfuzz.engine.stats import Stats
    from shardfuzz.frontends.campaign import _fault_lines, rarely_reached

    drawn = {"bfloat16": 0.33, "world>=3": 0.40, "uneven": 0.5, "2-D mesh": 0.1}
    seen = collections.Counter({"bfloat16": 18, "world>=3": 120, "uneven": 0, "2-D mesh": 1})
    rare = rarely_reached(Stats(examples=300, triggers=seen), drawn)
    assert rare == [("bfloat16", 0.06, 0.33, 0)], rare  # 0% is "never reached"; 10% drawn too rare to say
    assert rarely_reached(Stats(examples=100, triggers=seen), drawn) == []  # too short to say
    line = "\n".join(_fault_lines({"found": False, "rarely_reached": rare}))
    assert "rarely reached: bfloat16 6% (of the strategy's draws: 33%): the search dwelt" in line, line
    assert "--dtypes" in line and "exclusions" not in line, line


def test_a_condition_met_rarely_because_its_cases_were_excluded_says_so_not_the_search():
    """A new user excluded the sizes the group does not divide (--exclude), and the summary said
    "rarely reached: uneven 2% ... the search dwelt on other cases", with nothing said of the 1,136
    drawn cases the exclusions set aside to run 150."""
    import collections

    from shardfuzz.engine.stats import Stats
    from shardfuzz.frontends.campaign import _fault_lines, rarely_reached

    stats = Stats(examples=300, triggers=collections.Counter({"uneven": 6, "bfloat16": 18}))
    stats.excluded_triggers.update({"uneven": 1136})
    rare = rarely_reached(stats, {"uneven": 0.5, "bfloat16": 0.33})
    assert rare == [("uneven", 0.02, 0.5, 1136), ("bfloat16", 0.06, 0.33, 0)], rare
    lines = "\n".join(
        _fault_lines({"found": False, "rarely_reached": rare[:1], "excluded": 1136, "examples": 300})
    )
    assert (
        "uneven 2% (of the strategy's draws: 50%; 1136 cases that met it excluded as known failures)" in lines
    )
    assert "exclusions set their cases aside" in lines and "dwelt" not in lines, lines
    assert "1136 of 1436 drawn cases (79%) were excluded as known failures" in lines, lines
    both = "\n".join(_fault_lines({"found": False, "rarely_reached": rare}))
    assert (
        "the search dwelt on other cases (it steers towards the largest error/tolerance), or exclusions"
        in both
    )
    few = "\n".join(_fault_lines({"found": False, "excluded": 10, "examples": 300}))
    assert "were excluded" not in few, few


def test_conditions_that_the_pinned_options_put_out_of_reach_are_named_in_a_clean_summary():
    """A new user pinned clip_factor=None on a ZeRO target: "active clip" left the progress line
    unsaid, and a clean run of a clipping bug read as a clean bill."""
    from shardfuzz import RunConfig
    from shardfuzz.frontends.campaign import _fault_lines

    pinned = Runner("zero_adamw", config=RunConfig(options={"clip_factor": None}))
    assert "clip active" in pinned.out_of_reach_of_pins(), pinned.out_of_reach_of_pins()
    assert "clip active" not in pinned.progress_conditions()
    assert Runner("zero_adamw").out_of_reach_of_pins() == ()
    assert (
        "clip active"
        not in Runner("zero_adamw", config=RunConfig(options={"steps": 2})).out_of_reach_of_pins()
    )
    lines = "\n".join(_fault_lines({"found": False, "out_of_reach_of_pins": ["clip active"]}))
    assert "out of reach of the pinned options (--option): clip active" in lines, lines
    assert not _fault_lines({"found": True, "out_of_reach_of_pins": ["clip active"]})


def test_a_thin_margin_on_the_shrunk_case_says_how_far_its_larger_failing_cases_went():
    """A new user's summing bug shrank to d_model 2, where its gradient cancels, and was reported at
    1.38x (read as noise); the same finding was 8.4e4x past its bound on d_model 3."""
    from types import SimpleNamespace

    from shardfuzz.engine.stats import Stats
    from shardfuzz.frontends.campaign import _finding_lines, _widest

    stats = Stats()

    def finding(ratio, site=("grad_emb",)):
        return SimpleNamespace(kind="mismatch", ratio=ratio, site=site)

    for r in (8.4e4, 12.0, 1.38):  # the first failing example, then shrinking
        stats.count_finding(finding(r))
    stats.count_finding(finding(9e9, site=("y",)))  # another finding: not this one's
    assert _widest(stats, finding(1.38)) == 8.4e4
    assert _widest(stats, finding(9e3)) is None  # within 10x of the shrunk case's: not said
    line = "\n".join(
        _finding_lines(
            {"kind": "mismatch", "margin": 1.38, "margin_why": "in grad_emb", "widest": 8.4e4, "case": "C"}
        )
    )
    assert "margin 1.38x (in grad_emb; 8.4e+04x on larger failing cases before shrinking): C" in line, line


def test_a_run_mostly_refused_by_the_engine_for_the_dtype_range_is_not_sent_to_its_strategy():
    """A new user's float16 loss scaler had 251 of 551 cases refused as "the oracle overflows the
    case dtype", and the summary said to draw only cases the implementation supports."""
    from shardfuzz.frontends.campaign import _fault_lines

    def lines(reasons):
        row = {"found": False, "unsupported": 251, "examples": 300, "unsupported_reasons": reasons}
        return "\n".join(_fault_lines(row))

    engine = lines({"the oracle overflows the case dtype": 240, "seq 1": 11})
    assert "251 of 551 drawn cases (46%) were refused" in engine and "keep the large profile" in engine, (
        engine
    )
    assert "strategies.md" not in engine
    own = lines({"seq 1": 240, "the oracle overflows the case dtype": 11})
    assert "draw only cases the implementation supports (docs/reference/strategies.md)" in own, own


def test_the_runner_counts_the_conditions_of_the_cases_it_excludes():
    from shardfuzz import Case, RunConfig
    from shardfuzz.errors import Unsupported

    case = Case(target="row_mean", world_size=3, mesh=(3,), sizes={"rows": 4, "cols": 2}, split=("rows",))
    runner = Runner(EXAMPLE, config=RunConfig(exclude=("world_size == 3",)))
    with pytest.raises(Unsupported):
        runner.run_case(case)
    assert runner.stats.excluded_triggers["world>=3"] == 1 and runner.stats.excluded_triggers["uneven"] == 1


def test_fuzz_finding_exits_1_and_prints_the_report_and_rerun_line():
    out = cli("fuzz", EXAMPLE, "--impl", "mean_of_means", "--max-examples", "100")
    assert out.returncode == 1, out.stdout + out.stderr
    assert "mismatched elements" in out.stdout
    # no --failures-dir: the file goes to $SHARDFUZZ_FAILURES_DIR (the tests set it to a tmp dir)
    written = pathlib.Path(os.environ["SHARDFUZZ_FAILURES_DIR"]) / "row_mean-mean_of_means-gloo-mismatch.json"
    assert f"failure file: {written}" in out.stdout and written.exists()
    rerun = next(line for line in out.stdout.splitlines() if line.startswith("Rerun this case: "))
    # the rerun line reproduces exactly that case
    import shlex

    again = cli(*shlex.split(rerun.removeprefix("Rerun this case: shardfuzz ")))
    assert again.returncode == 1 and "FAIL (mismatch)" in again.stdout


def test_case_that_passes_exits_0():
    case = "Case(target='row_mean', world_size=3, mesh=(3,), sizes={'rows': 4, 'cols': 2}, split=('rows',))"
    out = cli("case", EXAMPLE, case)
    assert out.returncode == 0, out.stdout + out.stderr
    assert out.stdout.startswith("PASS")
    assert "never draws this case" not in out.stderr, out.stderr
    # one its strategy never draws runs too, and says so (a new user's seq 3 on 2 ranks, where
    # their strategy drew only sizes the group divides, ran without a word)
    out = cli("case", EXAMPLE, case.replace("'cols': 2", "'cols': 5"))
    assert out.returncode == 0 and out.stdout.startswith("PASS"), out.stdout + out.stderr
    assert "note: target 'row_mean' never draws this case: sizes['cols']=5; it draws 1..3" in out.stderr, (
        out.stderr
    )
    # each output's ratio, judged with the noise term: not a sure pass's upper bound as in a run
    assert "per output (error/tolerance; 0: compared exactly and equal): mean " in out.stdout, out.stdout
    from shardfuzz import Case, Runner

    quick, full = Runner(EXAMPLE), Runner(EXAMPLE)
    full.always_noise = True
    assert quick.run_case(Case.parse(case)) >= full.run_case(Case.parse(case))
    assert quick.last_verdict.upper_bound and not full.last_verdict.upper_bound


def test_impl_by_reference_from_the_cli():
    out = cli("fuzz", EXAMPLE, "--impl", f"{EXAMPLE}::mean_of_means", "--max-examples", "30")
    assert out.returncode == 1 and "mismatch" in out.stdout


@pytest.mark.parametrize(
    "args, message",
    [
        (["fuzz", "nope"], "target='nope' is unknown; known targets:"),
        (["fuzz", "tp_mlp", "--impl", "nope"], "impl='nope' is not an implementation of target 'tp_mlp'"),
        (["fuzz", "tp_mlp", "--max-examples", "0"], "'0' is not an integer >= 1"),
        (["fuzz", "tp_mlp", "--world-sizes", "two"], "--world-sizes='two'"),
        (["fuzz", "tp_mlp", "--backend", "mpi"], "invalid choice: 'mpi'"),
        (["case", "tp_mlp", "Case(target='tp_mlp', world_size=2, mesh=(3,))"], "mesh=(3,) has 3 ranks"),
        (["fuzz", "missing_file.py"], "missing_file.py' does not exist"),
        (
            ["fuzz", EXAMPLE, "--tolerance", "out=rtol:abc"],
            "--tolerance 'out=rtol:abc': rtol value 'abc' is not a number; expected OUTPUT=rtol:X,atol:Y",
        ),
        (["fuzz", EXAMPLE, "--tolerance", "rtol:1e-3"], "--tolerance 'rtol:1e-3': no OUTPUT="),
        (["fuzz", EXAMPLE, "--tolerance", "mean=rtl:1"], "'rtl:1' is not rtol:X,atol:Y"),
        (["fuzz", EXAMPLE, "--tolerance", "mean=atol:-1"], "atol=-1.0; must be a finite number >= 0"),
        (
            ["fuzz", EXAMPLE, "--tolerance", "men=rtol:1e-3"],
            "--tolerance names output 'men', which target 'row_mean' does not have; its outputs are ['mean']",
        ),
        (
            ["fuzz", EXAMPLE, "ulysses", "--tolerance", "men=rtol:1e-3"],
            "which none of the targets has; outputs: row_mean: ['mean']; ulysses: ['grad_k'",
        ),
        (
            [
                "case",
                EXAMPLE,
                "--tolerance",
                "men=atol:1",
                "Case(target='row_mean', world_size=1, mesh=(1,))",
            ],
            "--tolerance names output 'men'",
        ),
        (
            ["fuzz", EXAMPLE, "--dtypes", "float32,float8"],
            "--dtypes 'float32,float8': 'float8' is not a dtype; expected comma-separated dtypes from float32,",
        ),
        (["fuzz", EXAMPLE, "--dtypes", ","], "--dtypes ',': no dtype given"),
    ],
)
def test_usage_errors_exit_2_and_name_the_argument(args, message):
    out = cli(*args)
    assert out.returncode == 2, out.stdout + out.stderr
    assert message in out.stderr


def test_infrastructure_failure_exits_3():
    # nccl needs one GPU per rank; this machine (and CI) has fewer than 2
    import torch

    if torch.cuda.device_count() >= 2:
        pytest.skip("this machine has 2+ GPUs, so nccl at world size 2 would start")
    out = cli("fuzz", "tp_mlp", "--backend", "nccl", "--world-sizes", "2", "--max-examples", "2")
    assert out.returncode == 3, out.stdout + out.stderr
    assert "the fuzzer itself failed" in out.stderr and "one CUDA device per rank" in out.stderr


def test_tolerance_flags_repeat_and_the_last_for_an_output_wins():
    from shardfuzz import OutputTolerance, Tolerance
    from shardfuzz.frontends.cli import _config
    from shardfuzz.frontends.cli_args import build_parser

    argv = [
        "--tolerance",
        "y=rtol:1e-3",
        "--tolerance",
        "grad_x=atol:2",
        "--tolerance",
        "y=rtol:0.5,atol:1e-5",
    ]
    args = build_parser().parse_args(["fuzz", "tp_mlp", "--dtypes", "float64,bfloat16", *argv])
    config = _config(args, dtypes=args.dtypes)
    assert config.dtypes == ("float64", "bfloat16")
    assert config.tolerance == Tolerance(
        per_output={"y": OutputTolerance(rtol=0.5, atol=1e-5), "grad_x": OutputTolerance(atol=2.0)}
    )
    for command in (["case", "tp_mlp", "Case()"], ["replay", "f.json"]):  # every command that runs cases
        assert build_parser().parse_args([*command, *argv]).tolerance[-1][0] == "y"


@pytest.mark.slow  # 4 CLI processes (~25 s); the ci suite proves the flags' parsing (above) and the
# same options reaching a run through the pytest plugin (tests/test_plugin.py)
def test_dtypes_and_tolerance_flags_reach_the_run_and_replay(tmp_path):
    """bf16 only, and a per-output tolerance: absurdly tight finds a "mismatch" in the correct
    reference; a loose one passes, and replays the failure file as passing."""
    common = [EXAMPLE, "--dtypes", "bfloat16", "--profile", "shardfuzz-ci", "--failures-dir", str(tmp_path)]
    tight = cli("fuzz", *common, "--tolerance", "mean=rtol:0,atol:0", "--max-examples", "30")
    assert tight.returncode == 1, tight.stdout + tight.stderr
    assert "(dtypes bfloat16; tolerance mean=rtol:0.0,atol:0.0) ..." in tight.stdout
    assert "dtype='bfloat16'" in tight.stdout and "mismatched elements" in tight.stdout
    loose = cli("fuzz", *common, "--tolerance", "mean=rtol:1,atol:1", "--max-examples", "10")
    assert loose.returncode == 0, loose.stdout + loose.stderr
    last = [line for line in loose.stdout.splitlines() if "row_mean/reference: 10 examples" in line][-1]
    assert "bfloat16 100%" in last  # every case drawn was bf16
    # the failure files lie outside the project that holds the example target: trusted by the flag
    again = cli("replay", str(tmp_path), "--tolerance", "mean=rtol:1,atol:1", "--trust-refs")
    assert again.returncode == 0 and "now passes" in again.stdout, again.stdout + again.stderr
    bad = cli("replay", str(tmp_path), "--tolerance", "nope=rtol:1", "--trust-refs")
    assert bad.returncode == 2 and "--tolerance names output 'nope'" in bad.stderr


@pytest.mark.parametrize("target", ["ddp_buckets", "tp_mlp"])
def test_progress_line_names_each_condition_once(target):
    """A condition both generic and declared by the target (ddp_buckets' ``backward``) is shown once."""
    from shardfuzz import Runner

    runner = Runner(target)
    shown = runner.progress_conditions()
    assert len(shown) == len(set(shown)), shown
    assert set(runner.target.triggers) <= set(shown)


def test_progress_line_leaves_out_the_targets_conditions_a_pinned_option_cannot_reach():
    """A DTensor maintainer's run pinned to a pointwise op listed "never reached: a sharded dim the
    op reduces or scans, keepdim, in-place op": no case of that op can reach them. Without the pin
    they are blind spots worth naming, and stay."""
    from shardfuzz import RunConfig, Runner

    unpinned = set(Runner("dtensor_ops", "torch_dtensor").progress_conditions())
    assert {"a sharded dim the op reduces or scans", "keepdim", "in-place op"} <= unpinned
    gelu = RunConfig(options={"op": "aten.gelu.default"})
    pinned = set(Runner("dtensor_ops", "torch_dtensor", gelu).progress_conditions())
    assert not {"a sharded dim the op reduces or scans", "keepdim", "in-place op"} & pinned, pinned
    assert {"uneven", "world>=3"} <= pinned  # the generic ones stay, as the run's world sizes allow
    summed = RunConfig(options={"op": "aten.sum.dim_IntList"})
    assert (
        "a sharded dim the op reduces or scans"
        in Runner("dtensor_ops", "torch_dtensor", summed).progress_conditions()
    )


def test_progress_line_shows_uneven_only_for_a_target_that_splits_a_size():
    """A target whose sizes are all Free (a ZeRO flat buffer the implementation pads itself) cannot
    be uneven: two new users read its ``uneven 0%`` as a blind spot."""
    from shardfuzz import Runner

    free_only = os.path.join(os.path.dirname(__file__), "data", "relu_padding_target.py")
    assert "uneven" not in Runner(free_only).progress_conditions()
    assert "uneven" in Runner("tp_mlp").progress_conditions()


def test_progress_line_shows_no_2d_mesh_condition_for_a_strategy_of_1d_meshes():
    """A new user's ``cases(max_dims=1)`` run listed "never reached: 2-D mesh, group<world (no
    example met them)": its strategy cannot draw them, and the line read as a gap in the search."""
    from shardfuzz import Runner

    one_d = os.path.join(os.path.dirname(__file__), "data", "parallel_target.py")
    assert not {"2-D mesh", "group<world"} & set(Runner(one_d).progress_conditions())
    assert {"2-D mesh", "group<world"} <= set(Runner("tp_mlp").progress_conditions())


def test_progress_line_shows_empty_shards_where_the_strategy_draws_them():
    """A new user's two empty-shard bugs were found (so ``Split(allow_empty=True)`` reached empty
    shards), but the line of a clean run never named the condition: nothing said it was reached."""
    from shardfuzz import Runner

    assert "empty shard" in Runner("ring_allreduce").progress_conditions()
    free_only = os.path.join(os.path.dirname(__file__), "data", "relu_padding_target.py")
    assert "empty shard" not in Runner(free_only).progress_conditions()
    # where the split rules cut apart too: a new user's tensor_split target (heads 5 on 4 ranks)
    # saw only "empty DTensor shard" on its line, not the condition its bug needed
    assert SPLIT_RULES_DIFFER in Runner("tp_mlp").progress_conditions()
    assert SPLIT_RULES_DIFFER not in Runner(free_only).progress_conditions()


def test_progress_line_shows_the_per_group_relations_the_cases_reach():
    """ulysses' ``kv_heads<group`` (KV heads replicated over more ranks) showed only in pytest's
    statistics, not in the CLI's line (a new user's ZeRO-3 target's ``numel%group!=0`` too)."""
    from shardfuzz import Runner

    shown = Runner("ulysses").progress_conditions()
    assert {"kv_heads<group", "kv_heads%group!=0"} <= set(shown), shown
    assert not any("%group" in t or "<group" in t for t in Runner("tp_mlp").progress_conditions())


@pytest.mark.parametrize("target,batched", [("tp_mlp", True), ("ring_allreduce", False)])
def test_progress_line_shows_batch_only_for_a_target_with_a_batch(target, batched):
    """``batch>1 0%`` on a target whose cases have no ``batch`` size read as a blind spot (a new
    user's MoE target): the line shows it only where a case can have one."""
    from shardfuzz import Runner

    assert ("batch>1" in Runner(target).progress_conditions()) == batched


@pytest.mark.parametrize(
    "worlds,hidden",
    [
        ((2, 3), {"2-D mesh"}),
        ((1, 2), {"2-D mesh", "world>=3"}),
        ((1,), {"uneven", "group<world"}),
        ((2, 3, 5), {"2-D mesh"}),  # 5 is prime: no two axes above 1
    ],
)
def test_progress_line_leaves_out_what_the_world_sizes_cannot_reach(worlds, hidden):
    """A ``test_for(..., world_sizes=(2, 3))`` listed ``never reached: 2-D mesh``, which no world of
    2 or 3 can form (both mesh axes above 1 needs 4 ranks)."""
    from shardfuzz import Runner
    from shardfuzz.engine.config import RunConfig

    conditions = Runner("tp_mlp", "reference", RunConfig(world_sizes=worlds)).progress_conditions()
    assert not hidden & set(conditions), conditions
    assert "uneven" in Runner("tp_mlp").progress_conditions()
    if 2 in worlds:
        assert "uneven" in conditions, conditions


@pytest.mark.parametrize(
    "dtypes,shown,hidden",
    [(None, "bfloat16", "float16"), (("float16",), "float16", "bfloat16"), (("float32",), None, "bfloat16")],
)
def test_progress_line_shows_the_low_precision_dtypes_the_run_draws(dtypes, shown, hidden):
    """A ``--dtypes float16`` run's line showed ``bfloat16 0%`` and not its own dtype's share."""
    from shardfuzz import Runner
    from shardfuzz.engine.config import RunConfig

    conditions = Runner("tp_mlp", "reference", RunConfig(dtypes=dtypes)).progress_conditions()
    assert shown is None or shown in conditions, conditions
    assert hidden not in conditions, conditions


def test_a_job_killed_before_its_summary_is_named_beside_a_finding():
    """A `--workers 2` child killed with SIGKILL vanished: no line, no row, and the exit code said
    only the other job's finding."""
    import io
    import sys
    import textwrap

    from shardfuzz.frontends.jobs import run_jobs

    child = textwrap.dedent(
        """
        import json, os, signal, sys
        if sys.argv[1] == "die":
            os.kill(os.getpid(), signal.SIGKILL)
        out = sys.argv[sys.argv.index("--summary-json") + 1]
        json.dump([{"target": "t", "found": True}], open(out, "w"))
        sys.exit(1)
        """
    )
    out = io.StringIO()
    jobs = [[sys.executable, "-c", child, "die"], [sys.executable, "-c", child, "find"]]
    rows, codes, interrupted = run_jobs(jobs, [1, 1], budget=2, parallel=2, stream=out)
    assert codes == [-9, 1] and not interrupted
    assert rows == [{"target": "t", "found": True, "job": 2}]
    assert "[job 1] ended killed by signal 9 with no summary" in out.getvalue(), out.getvalue()


def test_stop_at_first_ends_a_timed_campaign_after_its_first_finding():
    """A new user's CI job ran `--duration` past its first finding (found at example 2, then 1,598
    more): --stop-at-first ends the campaign after the run that made it, shrunk and saved. The
    duration here is far longer than the subprocess may take: only the flag ends it in time."""
    args = ("fuzz", "tp_mlp", "--impl", "missing_f_backward", "--no-progress", "--duration", "20m")
    out = cli(*args, "--stop-at-first", timeout=240)
    assert out.returncode == 1, out.stdout + out.stderr
    assert "FOUND mismatch" in out.stdout + out.stderr, out.stdout + out.stderr
    out = cli("fuzz", "tp_mlp", "--stop-at-first", "--max-examples", "5")
    assert out.returncode == 2 and "--stop-at-first without --duration" in out.stderr, out.stderr


def test_stop_at_first_stops_the_workers_of_the_target_that_found(tmp_path):
    """With --workers, the worker that found stops its siblings (SIGINT, as Ctrl-C does: each keeps
    its summary), and a sibling not started yet never starts; another target's job runs on."""
    import io
    import sys
    import textwrap

    from shardfuzz.frontends.jobs import run_jobs

    child = textwrap.dedent(
        """
        import json, os, sys, time
        out = sys.argv[sys.argv.index("--summary-json") + 1]
        role, flag = sys.argv[1], sys.argv[2]
        def done(row, code):
            json.dump([{"target": role, **row}], open(out, "w"))
            sys.exit(code)
        def wait_for(path):  # no fixed sleeps: a loaded machine starts processes late
            end = time.time() + 60
            while not os.path.exists(path) and time.time() < end:
                time.sleep(0.05)
        try:
            if role == "worker":  # the first worker finds once a sibling searches; siblings search on
                try:
                    os.close(os.open(flag, os.O_CREAT | os.O_EXCL))
                except FileExistsError:
                    open(flag + ".searching", "w").close()
                    time.sleep(120)
                    done({"found": False}, 0)
                wait_for(flag + ".searching")
                open(flag + ".found", "w").close()
                done({"found": True}, 1)
            wait_for(flag + ".found")  # another target's job: clean, a second after the finder
            time.sleep(1)
            done({"found": False}, 0)
        except KeyboardInterrupt:
            done({"found": False, "stopped": True}, 130)
        """
    )
    flag = str(tmp_path / "found")
    worker, other = ([sys.executable, "-c", child, role, flag] for role in ("worker", "other"))
    out = io.StringIO()
    # three at once: a worker, the other target's job, a worker; the fourth job, a worker, waits
    jobs = [worker, other, worker, worker]
    rows, codes, interrupted = run_jobs(jobs, [1] * 4, budget=4, parallel=3, stream=out, stop_at_first=True)
    assert sorted(codes) == [0, 1, 130] and codes[1] == 0 and not interrupted, (codes, out.getvalue())
    assert len(rows) == 3 and sum(r.get("stopped", False) for r in rows) == 1, rows  # the 4th never ran


def test_a_rerun_line_carries_the_import_path_a_fresh_process_lacks(tmp_path, monkeypatch):
    """Under pytest (its root on sys.path) a target file that imports a module beside it ran, but
    the report's `shardfuzz case` rerun line failed to import it in a new shell (a new user's
    my_layers): the line now starts with the PYTHONPATH it needs, for an `--impl pkg.mod:func` of
    such a folder too; a built-in target's does not."""
    import sys

    from shardfuzz import Runner
    from shardfuzz.spec import refs

    monkeypatch.delenv("PYTHONPATH", raising=False)
    refs._fresh_import_path.cache_clear()  # read again without it
    (tmp_path / "helper_layers.py").write_text("SCALE = 1.0\n")
    (tmp_path / "helper_impls.py").write_text(
        "import sys\nmine = sys.modules['_shardfuzz_example_mean'].mean_of_means\n"
    )
    target = tmp_path / "uses_helper.py"
    text = pathlib.Path(EXAMPLE).read_text()
    target.write_text(
        text.replace("import shardfuzz\n", "import helper_layers  # beside it\nimport shardfuzz\n", 1)
    )
    monkeypatch.syspath_prepend(str(tmp_path))  # what pytest's rootdir or a script's folder does
    for name in ("helper_layers", "helper_impls", "_shardfuzz_example_mean"):
        monkeypatch.delitem(sys.modules, name, raising=False)  # gone again after the test
    try:
        prefix = Runner(str(target), "mean_of_means").reporter.rerun_prefix
        assert prefix.startswith(f"PYTHONPATH={tmp_path} shardfuzz case {target}::row_mean"), prefix
        assert Runner(EXAMPLE, "mean_of_means").reporter.rerun_prefix.startswith("shardfuzz case ")  # none
        # the same prefix for pytest's replay note and the standalone script's torchrun line (a new
        # user's replay as printed failed: No module named 'mylib')
        assert Runner(str(target), "mean_of_means").import_path_prefix() == f"PYTHONPATH={tmp_path} "
        assert refs.pythonpath_prefix([f"{target}::row_mean"]) == f"PYTHONPATH={tmp_path} "
        # an implementation named as pkg.mod:func from that folder needs it too
        from shardfuzz.spec.refs import import_file

        sys.modules["_shardfuzz_example_mean"] = import_file(EXAMPLE, "example")
        prefix = Runner(EXAMPLE, "helper_impls:mine").reporter.rerun_prefix
        assert prefix.startswith(f"PYTHONPATH={tmp_path} shardfuzz case "), prefix
        assert Runner("tp_mlp", "missing_allreduce").reporter.rerun_prefix.startswith(
            "shardfuzz case tp_mlp "
        )
        # and where $PYTHONPATH found that folder: a new shell lacks it too (two new users pasted
        # such a line into one and got ModuleNotFoundError)
        monkeypatch.setenv("PYTHONPATH", str(tmp_path))
        refs._fresh_import_path.cache_clear()
        prefix = Runner(str(target), "mean_of_means").reporter.rerun_prefix
        assert prefix.startswith(f"PYTHONPATH={tmp_path} shardfuzz case {target}::row_mean"), prefix
    finally:
        refs._fresh_import_path.cache_clear()


def test_a_rerun_line_whose_import_path_cannot_be_read_stays_bare(tmp_path, monkeypatch):
    """The import path on a rerun line is advice: a fresh interpreter that cannot be asked, a
    finder that raises, or any failure in reading it leaves the line as it was, never the run."""
    import subprocess
    import sys

    from shardfuzz import Runner
    from shardfuzz.spec import refs

    monkeypatch.delenv("PYTHONPATH", raising=False)
    (tmp_path / "helper_layers2.py").write_text("SCALE = 1.0\n")
    target = tmp_path / "uses_helper2.py"
    text = pathlib.Path(EXAMPLE).read_text()
    target.write_text(text.replace("import shardfuzz\n", "import helper_layers2\nimport shardfuzz\n", 1))
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "helper_layers2", raising=False)

    class Raising:  # a meta-path finder that cannot say: asked, skipped
        @staticmethod
        def find_spec(*args, **kwargs):
            raise ImportError("cannot say")

    refs._fresh_import_path.cache_clear()
    try:
        first = Runner(str(target), "mean_of_means").reporter.rerun_prefix  # imports the file
        with monkeypatch.context() as m:  # the file imported: only the check asks the finders now
            m.setattr(sys, "meta_path", [Raising, *sys.meta_path])
            again = Runner(str(target), "mean_of_means").reporter.rerun_prefix
        assert first == again and again.startswith(f"PYTHONPATH={tmp_path} "), (first, again)

        def no_interpreter(*args, **kwargs):
            raise OSError("no fresh interpreter here")

        refs._fresh_import_path.cache_clear()
        with monkeypatch.context() as m:
            m.setattr(subprocess, "run", no_interpreter)
            assert refs.import_path_for([f"{target}::row_mean"]) == []  # every folder counts as fresh
        with monkeypatch.context() as m:
            m.setattr(refs, "import_path_for", lambda refs_: 1 / 0)
            assert Runner(str(target), "mean_of_means").reporter.rerun_prefix.startswith("shardfuzz case ")
    finally:
        refs._fresh_import_path.cache_clear()


def test_the_profile_option_says_what_each_profile_runs():
    """A new user found ``--profile``'s row empty in the CLI reference, and that ``shardfuzz-ci`` is
    derandomized only in the design notes (a bug its 30 fixed cases missed was found by 4 of 5
    random runs of 30)."""
    from shardfuzz.engine.config import PROFILES
    from shardfuzz.engine.settings import build_settings
    from shardfuzz.frontends.cli_args import build_parser

    fuzz = next(
        a
        for a in build_parser()._subparsers._group_actions[0].choices["fuzz"]._actions
        if a.dest == "profile"
    )
    for name in PROFILES:
        s = build_settings(name)
        said = re.search(rf"{name}( is what CI runs)? \(?(\d+) examples|{name} (\d+)\b", fuzz.help)
        assert said and int(said.group(2) or said.group(3)) == s.max_examples, (name, fuzz.help)
    assert "derandomized" in fuzz.help and build_settings("shardfuzz-ci").derandomize


def test_a_fuzzer_failure_after_a_finding_reports_the_finding_and_exits_1(monkeypatch, capsys):
    """A driver whose torchrun node was stopped for good printed nothing of the finding it had made
    and exited 3, "the fuzzer itself failed": the finding is reported and decides the exit code,
    and the failure is said beside it. With no finding, it is exit 3 as before."""
    from shardfuzz.errors import InfrastructureError
    from shardfuzz.frontends import campaign
    from shardfuzz.frontends import cli as main_cli

    toy = os.path.join(os.path.dirname(__file__), "data", "toy_target.py")
    lost = "no rank server connected to 127.0.0.1:29600 within 60 s"
    real, runs = campaign.search, []

    def search(runner, *args, **kw):  # the first run finds the bug; the next loses the ranks
        runs.append(runner)
        if len(runs) == 1:
            return real(runner, *args, **kw)
        raise InfrastructureError(lost)

    monkeypatch.setattr(campaign, "search", search)
    argv = ["fuzz", toy, "--impl", "wrong_rank1", "--duration", "60", "--no-progress"]
    code = main_cli.main(argv)
    out, err = capsys.readouterr()
    assert code == main_cli.EXIT_FOUND, out + err
    assert "shardfuzz: 1 of" in out and "FOUND mismatch" in out, out
    assert f"the fuzzer itself failed after the findings above: {lost}" in err, err
    assert main_cli.main(argv) == main_cli.EXIT_INFRA  # no finding this time: the first run fails
    assert f"the fuzzer itself failed: {lost}" in capsys.readouterr().err


def test_max_examples_beside_a_duration_ends_the_campaign_at_those_examples_in_all_its_runs(
    monkeypatch, capsys
):
    """Two new users asked for "N examples or T minutes, whichever comes first": the two flags were
    refused together. Each run of the campaign gets what the earlier runs left of N."""
    from shardfuzz.frontends import campaign
    from shardfuzz.frontends import cli as main_cli

    toy = os.path.join(os.path.dirname(__file__), "data", "toy_target.py")
    real, budgets = campaign.search, []

    def search(runner, settings, **kw):  # runs of at most 10 examples: the campaign needs three
        budgets.append(settings.max_examples)
        return real(runner, type(settings)(settings, max_examples=min(settings.max_examples, 10)), **kw)

    monkeypatch.setattr(campaign, "search", search)
    argv = ["fuzz", toy, "--duration", "10m", "--max-examples", "25", "--no-progress"]
    assert main_cli.main(argv) == main_cli.EXIT_OK
    out = capsys.readouterr().out
    assert budgets == [25, 15, 5], budgets
    (row,) = [line for line in out.splitlines() if line.startswith("toy ")]
    assert row.split()[2:3] == ["25"] and row.split()[4:5] == ["3"], row  # examples, runs


def test_progress_beside_a_duration_and_examples_shows_the_nearer_end():
    from shardfuzz.frontends import campaign

    stats = types.SimpleNamespace(examples=10, failures=0, hangs=0, triggers={})
    out = types.SimpleNamespace(
        runner=types.SimpleNamespace(stats=stats, config=types.SimpleNamespace(timeout=None)),
        label="toy",
        findings=[],
    )
    # 10 examples in 5 s: 40 more take 20 s, before the deadline's 95 s; 4 more take 2 s
    assert campaign._progress(out, 100.0, 50, 5.0, ()).remaining == 20.0
    assert campaign._progress(out, 100.0, 14, 5.0, ()).remaining == 2.0
    assert campaign._progress(out, 8.0, 50, 5.0, ()).remaining == 3.0  # the deadline first
    assert campaign._progress(out, 100.0, None, 5.0, ()).remaining == 95.0  # a duration alone


def test_a_clean_run_whose_outputs_were_all_zero_says_it_compared_nothing(capsys):
    """A new user's dropout at p = 0.999 passed a whole run at "closest pass 0 (every compared
    element equal)": every output was 0 or x whatever the code did, and nothing said so."""
    from shardfuzz.frontends import cli as main_cli

    scaled = os.path.join(os.path.dirname(__file__), "data", "scaled_target.py")
    base = ["fuzz", scaled, "--max-examples", "10", "--no-progress", "--profile", "shardfuzz-ci"]
    assert main_cli.main([*base, "--option", "p=1.0"]) == main_cli.EXIT_OK
    out = capsys.readouterr().out
    (row,) = [line for line in out.splitlines() if line.startswith("scaled ")]
    ran = int(row.split()[2])
    said = f"{ran} of {ran} passing examples (100%) had every output all zero or constant in the oracle, where a sum, a scale"
    assert said in out and "outputs all zero or constant in passing examples: y 100%" in out, out
    assert main_cli.main([*base, "--option", "p=0.5"]) == main_cli.EXIT_OK
    assert "all zero or constant" not in capsys.readouterr().out


def test_a_clean_run_whose_bound_was_as_wide_as_an_output_says_it_checked_little(capsys):
    """A new user's one-pass variance over features offset by 1,000 passed with an allowed error of
    141 on LayerNorm outputs of +-1, and the summary read as a healthy pass. An output whose allowed
    error covered its whole value (a zero answer would have passed) in 20% of the passes is named;
    a fixed tolerance of 1e9 is the plainest such bound."""
    from shardfuzz.frontends import cli as main_cli

    scaled = os.path.join(os.path.dirname(__file__), "data", "scaled_target.py")
    base = ["fuzz", scaled, "--max-examples", "10", "--no-progress", "--profile", "shardfuzz-ci"]
    base += ["--option", "p=0.5"]  # no output all zero (said by the line above instead)
    assert main_cli.main([*base, "--tolerance", "y=atol:1e9,rtol:0"]) == main_cli.EXIT_OK
    out = capsys.readouterr().out
    said = "passes where an output's allowed error was as large as the output itself (a zero answer would have passed): y 100%"
    assert said in out, out
    assert main_cli.main(base) == main_cli.EXIT_OK
    assert "allowed error was as large" not in capsys.readouterr().out


def test_a_clean_run_says_which_value_profiles_changed_no_input(capsys):
    """A new user's attention target gave its input the role ``logits`` and its weights ``weight``,
    as the docs advise: ``large`` then changed nothing, and a quarter of the examples repeated
    normal-profile cases, unsaid. A target whose inputs it scales (examples/mean_target.py) gets
    no line."""
    from shardfuzz.frontends import cli as main_cli

    here = os.path.dirname(__file__)
    base = ["--max-examples", "30", "--no-progress", "--profile", "shardfuzz-ci"]
    target = os.path.join(here, "data", "logits_target.py")
    assert main_cli.main(["fuzz", target, *base]) == main_cli.EXIT_OK
    out = capsys.readouterr().out
    (line,) = [line.strip() for line in out.splitlines() if "changed no input" in line]
    assert re.match(r"value profiles that changed no input: large \(\d+ passing examples\): each of", line), (
        out
    )
    assert "ties" not in line.split(":")[1]  # it quantises logits and weights: not inert
    mean = os.path.join(here, "..", "examples", "mean_target.py")
    assert main_cli.main(["fuzz", mean, *base]) == main_cli.EXIT_OK
    assert "changed no input" not in capsys.readouterr().out


def test_a_clean_run_that_compared_no_element_says_so(capsys):
    """A new user's --option n_params=0 made every output empty: the run passed "at 0 (every
    compared element equal)", and only a line about value profiles hinted that nothing changed."""
    from shardfuzz.frontends import cli as main_cli

    target = os.path.join(os.path.dirname(__file__), "data", "empty_outputs_target.py")
    base = ["fuzz", target, "--max-examples", "10", "--no-progress", "--profile", "shardfuzz-ci"]
    assert main_cli.main([*base, "--option", "n_params=0"]) == main_cli.EXIT_OK
    out = capsys.readouterr().out
    assert re.search(
        r"(\d+) of \1 passing examples \(100%\) compared no element: every output was empty", out
    ), out
    assert "changed no input" not in out  # empty inputs: no profile could change them
    assert main_cli.main(base) == main_cli.EXIT_OK
    assert "compared no element" not in capsys.readouterr().out


def test_the_degenerate_line_names_a_size_that_was_1_in_most_of_those_passes():
    """A new user's block-sparse attention: grad_q and grad_k were 0 in 42% of the passes (one key
    per query row), and the line did not say which size did it: seq 1, in most of them."""
    from shardfuzz.engine.stats import Stats
    from shardfuzz.frontends.campaign import degenerate_line, degenerate_record

    s = Stats(passed=10, degenerate_passes=1)
    s.degenerate_outputs.update({"grad_q": 4, "y": 1})
    s.degenerate_at_one.update({("grad_q", "seq"): 3, ("grad_q", "batch"): 1, ("y", "seq"): 1})
    s.passes_at_one.update({"seq": 3, "batch": 5})
    record = degenerate_record(s)
    assert record["outputs"] == {"grad_q": 4} and record["at_one"] == {"grad_q": ["seq", 3, 3]}
    line = degenerate_line(record)
    assert line.startswith(
        "outputs all zero or constant in passing examples: grad_q 40% "
        "(seq 1 in 75% of them, in 30% of all passes)"
    )
    assert "passing examples (" not in line  # 1 of 10 with every output so: below the 20% said
    # often right there (a recurrence's decay gradient at seq 1), but such a pass shows nothing
    assert "often right there" in line and "a pass there shows nothing of that output" in line, line
    assert degenerate_record(Stats(passed=10, degenerate_passes=1)) == {}


def test_the_degenerate_line_names_no_size_that_is_as_often_1_in_every_pass():
    """A new user's causal attention: grad_q was 0 in 21% of the passes (seq 1, or equal keys),
    and the line named heads 1, in 79% of them: the strategy drew heads 1 in as many of all its
    passes. A size is named only where it is 1 far more often in those passes than in all."""
    from shardfuzz.engine.stats import Stats
    from shardfuzz.frontends.campaign import DEGENERATE_LIFT, degenerate_line, degenerate_record

    s = Stats(passed=100, degenerate_passes=0)
    s.degenerate_outputs.update({"grad_q": 21})
    s.degenerate_at_one.update({("grad_q", "heads"): 17, ("grad_q", "seq"): 9})
    s.passes_at_one.update({"heads": 75, "seq": 9})
    record = degenerate_record(s)
    assert record["at_one"] == {}, record  # heads: 81% against 75% of all; seq: 43%, under half
    assert "heads" not in degenerate_line(record)
    s.passes_at_one["heads"] = int(100 * 17 / 21 / DEGENERATE_LIFT) - 1  # now well over its base rate
    assert degenerate_record(s)["at_one"] == {"grad_q": ["heads", 17, s.passes_at_one["heads"]]}


def test_a_fuzzer_failure_after_clean_examples_says_how_many_ran(monkeypatch, capsys):
    """A new user's torchrun node was lost after 755 clean examples: the run ended with "the fuzzer
    itself failed: no rank server connected ...", nothing of what had run."""
    from shardfuzz.errors import InfrastructureError
    from shardfuzz.frontends import campaign
    from shardfuzz.frontends import cli as main_cli

    toy = os.path.join(os.path.dirname(__file__), "data", "toy_target.py")
    real, runs = campaign.search, []

    def search(runner, *args, **kw):  # the first run is clean; the next loses the ranks
        runs.append(runner)
        if len(runs) == 1:
            return real(runner, *args, **kw)
        raise InfrastructureError("no rank server connected to 127.0.0.1:29600 within 60 s")

    monkeypatch.setattr(campaign, "search", search)
    argv = ["fuzz", toy, "--duration", "60", "--no-progress"]
    assert main_cli.main(argv) == main_cli.EXIT_INFRA
    err = capsys.readouterr().err
    ran = runs[0].stats.examples
    assert ran > 0 and f"within 60 s (after {ran} examples of toy/reference, nothing found)" in err, err


def test_ranks_lost_while_a_finding_shrinks_or_in_a_later_target_keep_the_finding(monkeypatch, capsys):
    """Ranks lost for good in the very run that found a bug (while it shrank), or in the next
    target of the command: the finding was lost (exit 3, or Hypothesis' group of two failures as a
    raw traceback); it is reported, cut short, and decides the exit code."""
    from shardfuzz.engine.runner import Runner
    from shardfuzz.errors import Finding, InfrastructureError
    from shardfuzz.frontends import campaign
    from shardfuzz.frontends import cli as main_cli

    toy = os.path.join(os.path.dirname(__file__), "data", "toy_target.py")
    lost = "no rank server connected to 127.0.0.1:29600 within 60 s"
    real_run_case, since = Runner.run_case, []

    def run_case(self, case):  # the ranks go away two examples after the first finding
        if len(since) > 2:
            raise InfrastructureError(lost)
        try:
            return real_run_case(self, case)
        except Finding:
            since.append(case)
            raise
        finally:
            if since:
                since.append(case)

    with monkeypatch.context() as m:
        m.setattr(Runner, "run_case", run_case)
        code = main_cli.main(["fuzz", toy, "--impl", "wrong_rank1", "--no-progress"])
    out, err = capsys.readouterr()
    assert code == main_cli.EXIT_FOUND, out + err
    assert f"the fuzzer itself failed ({lost}) before Hypothesis finished shrinking" in out, out
    assert f"the fuzzer itself failed after the findings above: {lost}" in err, err

    real_fuzz_one, campaigns = campaign.fuzz_one, []

    def fuzz_one(*args, **kw):  # the second target's campaign finds no rank server
        campaigns.append(args[0])
        if len(campaigns) > 1:
            raise InfrastructureError(lost)
        return real_fuzz_one(*args, **kw)

    monkeypatch.setattr(campaign, "fuzz_one", fuzz_one)
    code = main_cli.main(["fuzz", toy, toy, "--impl", "wrong_rank1", "--no-progress"])
    out, err = capsys.readouterr()
    assert code == main_cli.EXIT_FOUND and "FOUND mismatch" in out, out + err
    assert f"the fuzzer itself failed after the findings above: {toy}: {lost}" in err, err


def test_ranks_lost_while_finishing_a_finding_keep_it(monkeypatch, capsys):
    """The finishing phase runs cases too (the 1-rank try of a finding on 2 ranks): ranks lost for
    good there exited 3 with nothing of the finding printed, a review found."""
    from shardfuzz.engine.runner import Runner
    from shardfuzz.errors import InfrastructureError
    from shardfuzz.frontends import campaign
    from shardfuzz.frontends import cli as main_cli

    toy = os.path.join(os.path.dirname(__file__), "data", "toy_target.py")
    lost = "no rank server connected to 127.0.0.1:29600 within 60 s"
    real_search, real_run_case, searched = campaign.search, Runner.run_case, []

    def search(runner, *args, **kw):  # the search finds and shrinks the bug; then the ranks go
        result = real_search(runner, *args, **kw)
        searched.append(result)
        return result

    def run_case(self, case):
        if searched:
            raise InfrastructureError(lost)
        return real_run_case(self, case)

    monkeypatch.setattr(campaign, "search", search)
    monkeypatch.setattr(Runner, "run_case", run_case)
    code = main_cli.main(["fuzz", toy, "--impl", "wrong_rank1", "--no-progress", "--max-examples", "30"])
    out, err = capsys.readouterr()
    assert searched and searched[0].found and searched[0].case.world_size >= 2  # a 1-rank try ran
    assert code == main_cli.EXIT_FOUND, out + err
    assert "FOUND mismatch" in out, out
    assert f"the fuzzer itself failed after the findings above: {lost}" in err, err


def test_a_jobs_parent_says_a_childs_failure_beside_its_findings(monkeypatch, capsys):
    """A --jobs child whose ranks were lost after its findings exits 1 (its findings decide): the
    parent said nothing of the failure, which only its row holds."""
    import io

    from shardfuzz.engine.config import RunConfig
    from shardfuzz.frontends import campaign
    from shardfuzz.frontends import cli as main_cli

    toy = os.path.join(os.path.dirname(__file__), "data", "toy_target.py")
    row = campaign.fuzz_one(toy, "wrong_rank1", RunConfig(max_examples=10), stream=io.StringIO()).row()
    row["failed"] = "no rank server connected to 127.0.0.1:29600 within 60 s"
    monkeypatch.setattr(main_cli, "run_jobs", lambda *_a, **_k: ([row], [1], False))
    code = main_cli.main(["fuzz", toy, toy, "--jobs", "2", "--no-progress"])
    err = capsys.readouterr().err
    assert code == main_cli.EXIT_FOUND, err
    assert f"the fuzzer itself failed: toy/wrong_rank1: {row['failed']}" in err, err


def test_a_run_of_16_bit_cases_only_says_which_wider_outputs_it_judged_at_their_bound():
    """A new user's bfloat16-only run of an Adafactor step kept W, R and C in float32 (as the docs
    advise) and missed a per-shard RMS that float32 cases find at once: nothing said those outputs
    were judged at bfloat16's bound. A clean run that drew only 16-bit cases names them."""
    master = os.path.join(os.path.dirname(__file__), "data", "master_target.py")
    args = ("fuzz", master, "--max-examples", "6", "--no-progress")
    out = cli(*args, "--dtypes", "bfloat16")
    assert out.returncode == 0, out.stdout + out.stderr
    note = next((x for x in out.stdout.splitlines() if "judged at the case dtype's bound" in x), None)
    assert note is not None and "m (float32 in bfloat16 cases)" in note, out.stdout
    for more in (
        ("--dtypes", "bfloat16,float32"),
        ("--dtypes", "bfloat16", "--tolerance", "m=rtol:1e-6,atol:0"),
    ):
        out = cli(*args, *more)
        assert out.returncode == 0, out.stdout + out.stderr
        assert "judged at the case dtype's bound" not in out.stdout, (more, out.stdout)
    # a target with no wider output, in bfloat16 alone: a bug under one rounding cannot show (a new
    # user's ZeRO step clipped to a 1e-3 update: 496x in float32 cases, clean in 1,690 bfloat16)
    only = "bfloat16 cases only: a bug smaller than one rounding of their outputs"
    out = cli("fuzz", EXAMPLE, "--max-examples", "6", "--no-progress", "--dtypes", "bfloat16")
    assert out.returncode == 0 and only in out.stdout, out.stdout + out.stderr
    out = cli("fuzz", EXAMPLE, "--max-examples", "6", "--no-progress", "--dtypes", "bfloat16,float32")
    assert out.returncode == 0 and only not in out.stdout, out.stdout + out.stderr
