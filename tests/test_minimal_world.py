"""Honest minimal world sizes: a finding on 2+ ranks is tried on 1 rank with the same global sizes
(through Hypothesis: shardfuzz.strategies.one_rank_path, shardfuzz.engine.finish.try_one_rank); one that
fails there is reported on 1 rank and says so, one that needs 2 ranks is not."""

import io
import os

import pytest
from hypothesis.control import BuildContext
from hypothesis.internal.conjecture.data import ConjectureData

import shardfuzz.strategies as sst
from shardfuzz import RunConfig
from shardfuzz.engine.failures import FailureRecorder, load
from shardfuzz.frontends import campaign
from shardfuzz.report.findings import ONE_RANK_NOTE, ONE_RANK_SHORT, REFUSAL_NOTE, is_refusal
from shardfuzz.spec.sampling import draw_pool

HERE = os.path.dirname(__file__)
TOY = os.path.join(HERE, "data", "toy_target.py")
CAUSES = os.path.join(HERE, "data", "cause_impls.py")


def _draw(strategy, choices):
    data = ConjectureData.for_choices(choices)
    with BuildContext(data, is_final=True, wrapped_test=_draw):
        return data.draw(strategy)


def test_the_1_rank_path_keeps_the_global_sizes_and_is_drawn_only_inside_it():
    s = sst.cases("t", sizes={"n": sst.Split(), "b": sst.Free(1, 3)})
    case, choices = next((c, ch) for c, ch in draw_pool(s, 1, 100) if c.world_size >= 2 and c.sizes["n"] > 3)
    assert _draw(s, choices) == case == _draw(s, (*choices, 0))  # outside the path: nothing more drawn
    with sst.one_rank_path():
        one = _draw(s, (*choices, 0))
        assert _draw(s, (*choices, 1)) == case
    assert (one.world_size, one.mesh) == (
        1,
        (1,),
    ) and one.sizes == case.sizes  # > 3 rows: never drawn for 1 rank
    assert (one.dtype, one.profile, one.seed, one.options) == (
        case.dtype,
        case.profile,
        case.seed,
        case.options,
    )


def test_no_1_rank_path_where_the_world_sizes_leave_1_out():
    s = sst.cases("t", sizes={"n": sst.Split()}, world_sizes=[2, 3])
    case, choices = draw_pool(s, 1, 1)[0]
    with sst.one_rank_path():
        assert _draw(s, (*choices, 0)) == case


def _fuzz(impl, failures_dir=None):
    config = RunConfig(profile="shardfuzz-ci", max_examples=40, world_sizes=(1, 2))
    recorder = failures_dir and FailureRecorder(str(failures_dir))
    out = campaign.fuzz_one(TOY, f"{CAUSES}::{impl}", config, recorder=recorder, stream=io.StringIO())
    [(finding, path)] = out.findings
    if failures_dir:
        assert load(path, trust_refs=True)["case"] == finding.case  # its file passes the bounds check
    return out, finding


def test_a_bug_without_communication_is_reported_on_1_rank_with_the_note(tmp_path):
    # on 1 rank the toy draws at most 2 rows: only a case drawn for 2 ranks has 3
    out, finding = _fuzz("wrong_from_three_rows", tmp_path)
    assert finding.kind == "mismatch" and (finding.case.world_size, finding.case.sizes["n"]) == (1, 3)
    assert ONE_RANK_NOTE in finding.report and "found on 2 ranks" in finding.report
    assert out.result.case == finding.case
    assert ONE_RANK_SHORT in campaign.summary_table([out.row()])


def test_a_bug_that_needs_2_ranks_is_reported_on_2_without_the_note():
    out, finding = _fuzz("wrong_on_rank1")
    assert finding.kind == "mismatch" and finding.case.world_size == 2
    assert ONE_RANK_NOTE not in finding.report and ONE_RANK_SHORT not in campaign.summary_table([out.row()])


def test_a_not_implemented_error_is_reported_as_a_possible_refusal_without_the_note():
    """A new user's torch TP on a Conv2d: torch's 'not supported' read as a bug in the rank's math on
    1 rank; the report says how to map such a refusal to Unsupported instead."""
    out, finding = _fuzz("not_implemented")
    assert finding.kind == "rank-error" and finding.case.world_size == 1
    assert REFUSAL_NOTE in finding.report, finding.report
    assert ONE_RANK_NOTE not in finding.report and ONE_RANK_SHORT not in campaign.summary_table([out.row()])


@pytest.mark.parametrize(
    "exc_type,line,refusal",
    [
        ("NotImplementedError", "NotImplementedError: anything", True),
        ("ValueError", "ValueError: SyncBatchNorm expected input tensor to be on GPU or XPU", True),
        (
            "RuntimeError",
            "RuntimeError: BF16 all reduce communication hook required CUDA 11+ and NCCL 2.10+",
            True,
        ),
        ("RuntimeError", "RuntimeError: this op only supports contiguous inputs", True),
        ("RuntimeError", "RuntimeError: mat1 and mat2 shapes cannot be multiplied (1x2 and 1x1)", False),
        ("ValueError", "ValueError: the loss is not finite", False),
        ("TypeError", "TypeError: unsupported operand type(s) for +: 'Tensor' and 'NoneType'", False),
    ],
)
def test_a_refusal_is_told_from_a_crash_by_its_type_or_its_words(exc_type, line, refusal):
    assert is_refusal(exc_type, f"Traceback (most recent call last):\n  ...\n{line}\n") is refusal
