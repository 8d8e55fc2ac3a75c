"""The finding context and the report's leak note: a finding's report names the global state its
example left behind above the rerun line, written there when the report is made (issue 22: the
runner used to cut the finished text apart at "Rerun this case:" and paste the note in)."""

import pytest

from shardfuzz.case import Case
from shardfuzz.errors import LayoutMismatch
from shardfuzz.report.findings import Reporter
from shardfuzz.spec.tolerance import Tolerance
from shardfuzz.verdict.judge import Verdict

CASE = Case(target="toy", world_size=2, mesh=(2,), sizes={"n": 3}, split=("n",))
REPORTER = Reporter("toy", "impl", "mod:impl", "gloo", "shardfuzz case toy --impl impl", Tolerance())


def _report(leaks):
    with pytest.raises(LayoutMismatch) as excinfo:
        REPORTER.raise_verdict(CASE, Verdict(layout_problems=["rank 0 holds [2]"]), {}, leaks)
    return excinfo.value


def test_a_layout_report_says_the_values_were_not_compared():
    """Two new users read a layout finding as the only thing wrong: a count beside the misshapen
    output was wrong too, and the report never compared it."""
    from shardfuzz.report.findings import LAYOUT_FIRST

    assert LAYOUT_FIRST in _report(()).report


def test_a_finite_margin_names_its_output_and_an_infinite_one_says_why():
    """A new user read 44.9x in the summary and 2.48x at the top of the report (the first output's)
    and could not tell which output the margin was of."""
    import math

    import torch

    from shardfuzz.report.closest_pass import margin_text, margin_why
    from shardfuzz.verdict.compare import OutputDiff, RankDiff

    def od(name, ratio):
        return OutputDiff(
            name, "Replicate()", "float32", (1,), [RankDiff(0, 1, 1, max_ratio=ratio)], bound=torch.ones(1)
        )

    diffs = [od("y", 2.48), od("grad_w1", 44.9)]
    assert margin_text(44.9, margin_why(diffs, 44.9)) == "44.9x (in grad_w1)"
    assert margin_text(3.0, margin_why(diffs, 3.0)) == "3x"  # no output of that ratio: the figure alone
    assert margin_why([od("y", math.inf)], math.inf) == "y differs where its bound is 0"


def test_the_leak_note_sits_above_the_rerun_line_as_before():
    plain, leaky = _report(()), _report(["rank 0 left x = 1", "rank 1 left y = 2"])
    # what the runner made of the plain report before issue 22, by cutting it at the rerun line
    head, sep, tail = plain.report.rpartition("\nRerun this case: ")
    note = "\nThe example also left global state behind (restored or the pool restarted):"
    assert leaky.report == head + note + "\n  rank 0 left x = 1\n  rank 1 left y = 2" + sep + tail
    assert leaky.args == (leaky.report,) and leaky.leaks == ("rank 0 left x = 1", "rank 1 left y = 2")
    assert "global state" not in plain.report and plain.leaks == ()


def test_the_rerun_line_keeps_a_target_path_with_a_space_whole(tmp_path):
    """The rerun line is pasted into a shell: a target file under a folder with a space was split
    in two there. A plain name stays unquoted, as users type it."""
    import os
    import shlex
    import shutil

    from shardfuzz import Runner

    folder = tmp_path / "my targets"
    folder.mkdir()
    toy = folder / "toy.py"
    shutil.copy(os.path.join(os.path.dirname(__file__), "data", "toy_target.py"), toy)
    words = shlex.split(Runner(str(toy), "wrong_rank1").reporter.rerun_prefix)
    assert words == ["shardfuzz", "case", f"{toy}::toy", "--impl", "wrong_rank1"], words
    assert Runner("tp_mlp", "missing_allreduce").reporter.rerun_prefix == (
        "shardfuzz case tp_mlp --impl missing_allreduce"
    )


def test_the_rerun_line_runs_where_the_case_ran_torchrun_servers_and_a_device():
    """A finding on torchrun's rank servers (``--ranks``) said ``shardfuzz case ...`` without them:
    pasted, it ran on local ranks, not the nodes that failed. A device other than the backend's
    default is kept too; the secret file is a path, never the secret."""
    import shlex

    from shardfuzz import RunConfig
    from shardfuzz.engine.runner import rerun_flags

    config = RunConfig(ranks="0.0.0.0:29600", secret_file="/keys/my secret", device="cuda")
    flags = ["--device", "cuda", "--ranks", "0.0.0.0:29600", "--secret-file", "/keys/my secret"]
    assert shlex.split(rerun_flags(config)) == flags
    assert rerun_flags(RunConfig()) == rerun_flags(RunConfig(device="cpu")) == ""
    assert shlex.split(rerun_flags(RunConfig(backend="nccl"))) == ["--backend", "nccl"]  # cuda: its default
    # a hang found with --timeout 0.05 reran at the adaptive 10 s (a new user's async DDP)
    assert shlex.split(rerun_flags(RunConfig(timeout=0.05))) == ["--timeout", "0.05"]


def test_a_timeout_past_a_day_is_refused_naming_it():
    """--timeout 1e9 was accepted, and the pool's start crashed (exit 3): the ranks' gloo timeout
    is a multiple of it."""
    from shardfuzz import RunConfig
    from shardfuzz.errors import InvalidArgument
    from shardfuzz.frontends import cli

    with pytest.raises(InvalidArgument, match=r"timeout=1000000000.0; must be at most 86400 seconds"):
        RunConfig(timeout=1e9)
    assert RunConfig(timeout=86400).timeout == 86400
    assert cli.main(["fuzz", "tp_mlp", "--timeout", "1e9", "--max-examples", "1"]) == cli.EXIT_USAGE


def test_a_non_finite_mismatch_on_an_empty_shard_says_how_to_look_past_it():
    """A new user's vocab-parallel loss that all-reduced the log of the sums, wrong on every split
    at 9e6x, shrank to vocab 1 on 2 ranks: log(0) on the rank without vocabulary, margin inf, read
    as an empty-shard bug. An integer output's mismatch (inf too) or a finite one says nothing."""
    import math

    import torch

    from shardfuzz.verdict.compare import OutputDiff, RankDiff

    def verdict(ratio, bound):
        ranks = [RankDiff(0, 1, 1, max_ratio=ratio)]
        return Verdict(
            diffs=[OutputDiff("loss", "Replicate()", "float32", (1,), ranks, bound=bound)], worst=ratio
        )

    reporter = Reporter(
        "t", "impl", "mod:impl", "gloo", "shardfuzz case t --impl impl", Tolerance(),
        conditions=lambda case: ["uneven", "empty shard"],
    )  # fmt: skip
    note = "run again with --exclude \"'empty shard' in triggers\""
    assert note in reporter._non_finite_edge_note(CASE, verdict(math.inf, torch.ones(1)))
    # a case rerun as given was never shrunk: said as a condition (a new user's `shardfuzz case`)
    assert "where this is the shrunk case" in reporter._non_finite_edge_note(
        CASE, verdict(math.inf, torch.ones(1))
    )
    assert reporter._non_finite_edge_note(CASE, verdict(9e6, torch.ones(1))) is None
    assert reporter._non_finite_edge_note(CASE, verdict(math.inf, None)) is None  # compared exactly
    # no empty shard met (a chunked loop that skipped its partial last chunk): the general word
    general = REPORTER._non_finite_edge_note(CASE, verdict(math.inf, torch.ones(1)))
    assert general.startswith("the outputs are not finite in the smallest case the shrinker found"), general
    # said as one possibility: a log-sum-exp without its max is -inf on seq 2, nothing empty (a new
    # user's report blamed an empty edge)
    assert "if the code has nothing to do there" in general and "if it has, the values themselves" in general


def test_a_findings_report_names_the_trigger_conditions_its_shrunk_case_meets(proof):
    """What the minimal case still has is what the bug needs: a new user's GQA bug shrank to
    kv_heads 1 on 2 ranks, and the report never said kv_heads%group!=0 (the condition the target
    declares, which the progress line counted). The search is test_targets' proof, shared."""
    import glob
    import json

    from shardfuzz.spec.registry import get_target
    from shardfuzz.spec.triggers import conditions_met

    (path,) = glob.glob(str(proof("ulysses", "gqa_pad_separately") / "*.json"))
    rec = json.loads(open(path).read())
    case = Case.from_dict(rec["case"])
    met = conditions_met(get_target("ulysses"), case)
    # the shrunk case of gqa_pad_separately: one KV head shared by two query heads, on 2 ranks
    assert (case.world_size, case.sizes["kv_heads"], case.sizes["q_per_kv"]) == (2, 1, 2), case
    assert met == ("backward", "kv_heads < sp with GQA", "kv_heads%group!=0", "kv_heads<group"), met
    lines = rec["report"].splitlines()
    assert lines[2] == repr(case) and f"trigger conditions this case meets: {', '.join(met)}" in lines[3:5], (
        lines[:6]
    )


def test_the_conditions_a_report_names_come_in_a_readers_order_each_once():
    """Generic conditions in the order the progress line's vocabulary lists them, then backward and
    the target's own, then the rest sorted (per-group relations, the value profile)."""
    from shardfuzz.spec.registry import get_target
    from shardfuzz.spec.triggers import conditions_met

    case = Case(
        target="ulysses", world_size=3, mesh=(3,), split=("seq",), dtype="bfloat16", profile="ties",
        sizes={"batch": 2, "seq": 5, "kv_heads": 2, "q_per_kv": 2, "head_dim": 2}, options={"causal": True},
    )  # fmt: skip
    met = conditions_met(get_target("ulysses"), case)
    assert met[:6] == (
        "world>=3",
        "world non-power-of-2",
        "group>=3",
        "group non-power-of-2",
        "uneven",
        "batch>1",
    )
    assert met[6:8] == ("bfloat16", "backward"), met
    own = [t for t in get_target("ulysses").triggers if t in met]  # in the order the target declares them
    assert "causal" in own and list(met[8 : 8 + len(own)]) == own, met
    rest = list(met[8 + len(own) :])
    assert rest == sorted(rest) and "profile=ties" in rest and "kv_heads%group!=0" in rest, met
    assert len(set(met)) == len(met)


def test_an_ignored_collective_on_one_rank_says_its_values_were_not_compared_not_that_its_math_is_wrong():
    """A new user's raw all-reduce in forward (identity backward, as Megatron's g) was reported on
    1 rank with the note that the bug is in the rank's own math; its values were never compared."""
    from shardfuzz.errors import IgnoredCollective
    from shardfuzz.report.findings import ONE_RANK_NOTE

    one = Case(target="toy", world_size=1, mesh=(1,), sizes={"n": 3}, split=("n",))
    verdict = Verdict(ignored={0: ["c10d::allreduce_: an autograd kernel was not registered"]})
    with pytest.raises(IgnoredCollective) as excinfo:
        REPORTER.raise_verdict(one, verdict, {}, ())
    report = excinfo.value.report
    assert ONE_RANK_NOTE not in report and not excinfo.value.notes_one_rank, report
    assert "The values were not compared" in report, report
    # a mismatch on 1 rank keeps the note
    with pytest.raises(LayoutMismatch) as excinfo:
        REPORTER.raise_verdict(one, Verdict(layout_problems=["rank 0 holds [2]"]), {}, ())
    assert ONE_RANK_NOTE in excinfo.value.report


def test_a_layout_problem_of_the_dtype_alone_says_so_and_a_shape_names_the_declaration_too():
    """A new user's FSDP2 MLP built its nn.Linear without dtype=: float64 cases held float32
    parameters, and the report's 1-rank note sent them to the math. A dtype alone is said as such;
    a wrong shape keeps the note."""
    import torch

    from shardfuzz.errors import LayoutMismatch
    from shardfuzz.report.findings import LAYOUT_DECLARED, ONE_RANK_NOTE
    from shardfuzz.spec.layouts import Replicate
    from shardfuzz.verdict.judge import DTYPE_ONLY, check_layouts
    from shardfuzz.verdict.oracle import Expected

    one = Case(target="toy", world_size=1, mesh=(1,), sizes={"n": 3}, split=("n",), dtype="float64")
    ref = torch.ones(3, dtype=torch.float64)
    expected = Expected(ref={"y": ref}, low={"y": ref}, mag={}, inputs={})
    outputs = {"y": Replicate()}
    problems = check_layouts(one, outputs, [{"y": ref.float()}], expected)
    assert problems == ["output 'y' (Replicate()): rank 0 holds [3] float32, expected [3] float64 "
                        f"(global [3] over 1 ranks){DTYPE_ONLY}"], problems  # fmt: skip
    with pytest.raises(LayoutMismatch) as excinfo:
        REPORTER.raise_verdict(one, Verdict(layout_problems=problems), {}, ())
    assert ONE_RANK_NOTE not in excinfo.value.report and "ctx.dtype" in excinfo.value.report
    assert LAYOUT_DECLARED not in excinfo.value.report  # a dtype is no layout's
    # nor does the summary point at the note (a new user's: "the report says where to look")
    assert not excinfo.value.notes_one_rank
    problems = check_layouts(one, outputs, [{"y": ref[:2]}], expected)  # the shape: the note stays
    assert problems and not problems[0].endswith(DTYPE_ONLY), problems
    with pytest.raises(LayoutMismatch) as excinfo:
        REPORTER.raise_verdict(one, Verdict(layout_problems=problems), {}, ())
    assert ONE_RANK_NOTE in excinfo.value.report and excinfo.value.notes_one_rank
    # a shape may be the declaration's mistake: a new user's correct code returned an output
    # sharded that the target declared Replicate(), and read the finding as a bug in the code
    assert LAYOUT_DECLARED in excinfo.value.report


def test_a_near_mismatch_names_the_oracle_ops_the_noise_model_gave_one_rounding():
    """A new user's correct EmbeddingBag was reported at 1.8x against F.embedding_bag, an op the
    noise model then had no rule for, and nothing pointed at it. The noise samples record such ops,
    and a mismatch within 100x of its bound names them; a far one does not."""
    import torch

    from shardfuzz.errors import Mismatch
    from shardfuzz.verdict.compare import OutputDiff, compare_tensor
    from shardfuzz.verdict.noise import estimate

    x = torch.randn(3, 2, dtype=torch.float64)
    seen: set[str] = set()
    estimate(
        lambda: {"d": torch.cdist(x, x + 1)}, {"d": torch.cdist(x, x + 1)}, "float32", 0, 2, 2, seen=seen
    )
    assert seen == {"_cdist_forward"}, seen
    seen.clear()
    estimate(lambda: {"y": x @ x.T}, {"y": x @ x.T}, "float32", 0, 2, 2, seen=seen)
    assert seen == set(), seen

    e, bound = torch.tensor([1.0], dtype=torch.float64), torch.tensor([1e-3], dtype=torch.float64)
    for got, named in ((1.002, True), (2.0, False)):  # 2x its bound; 1000x
        rd = compare_tensor(torch.tensor([got]), e, bound, 0, lambda i: i)
        diff = OutputDiff("d", "Replicate()", "float32", (1,), [rd], bound=bound)
        verdict = Verdict(diffs=[diff], worst=rd.max_ratio, unmodelled=("_cdist_forward",))
        with pytest.raises(Mismatch) as e_info:
            REPORTER.raise_verdict(CASE, verdict, {})
        said = "the noise model has no rule for aten._cdist_forward in the oracle" in e_info.value.report
        assert said == named, e_info.value.report
