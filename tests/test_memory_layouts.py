"""Memory layouts at the collectives (issue 29, section 1): the trace records the strides of every
non-contiguous tensor a rank hands to a collective, and a report says so, naming the layouts."""

import math
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import shardfuzz
from shardfuzz.protocol import Collective
from shardfuzz.ranks.trace import _strides
from shardfuzz.report.divergence import describe_layouts, format_trace

HERE = Path(__file__).resolve().parent
TARGET = str(HERE.parent / "examples" / "row_parallel_cancel.py")
STRIDED = str(HERE / "data" / "strided_impls.py") + "::transposed_partial"


def _all_reduce(seq, strides=()):
    return Collective(
        seq, "all_reduce", (0, 1), ((2, 3),), "float32", (), None, None, "c10d", "all_reduce", strides
    )


def test_the_trace_keeps_strides_only_for_non_contiguous_tensors():
    a = torch.zeros(2, 3)
    assert _strides([a, a[:, :2].contiguous()]) == ()  # the common case costs one check a tensor
    assert _strides([a, a.t()]) == (None, (1, 3))
    event = _all_reduce(0, ((1, 2),))
    assert Collective.from_json(event.to_json()) == event
    # a trace line written before strides were recorded still reads
    old = '[0,"all_reduce",[0,1],[[2,3]],"float32",[],null,null,"c10d","all_reduce"]'
    assert Collective.from_json(old) == _all_reduce(0)


def test_a_report_names_the_ranks_whose_layouts_differ():
    assert describe_layouts({0: [_all_reduce(0)], 1: [_all_reduce(0)]}) is None
    text = describe_layouts(
        {0: [_all_reduce(0), _all_reduce(1, ((1, 2),))], 1: [_all_reduce(0), _all_reduce(1)]}
    )
    assert text is not None
    assert "all_reduce #2 on group [0, 1]: non-contiguous on rank 0: float32[2, 3] strides (1, 2)" in text
    assert "rank 1 passed contiguous tensors: the layouts differ" in text and "pytorch/pytorch#192920" in text
    same = describe_layouts({r: [_all_reduce(0, ((1, 2),))] for r in (0, 1)})
    assert same is not None and "the same strides on every rank" in same
    assert "non-contiguous: float32[2, 3] strides (1, 2)" in format_trace({0: [_all_reduce(0, ((1, 2),))]})


def test_user_code_handing_a_strided_tensor_to_all_reduce_is_caught_and_the_report_names_the_layouts():
    result = shardfuzz.run(TARGET, STRIDED, profile="shardfuzz-ci", database=None, max_examples=60)
    assert result.found and result.kind == "mismatch", result.report
    assert "layouts: a rank handed a non-contiguous tensor to a collective" in result.report, result.report
    assert "strides (1, " in result.report, result.report


def test_the_torch_only_reproducer_shows_gloo_all_reduce_wrong_on_non_contiguous_tensors():
    # examples/upstream/gloo_all_reduce_non_contiguous.py, as an upstream reader would run it: it
    # exits 1 while torch's gloo sums a non-contiguous tensor's raw memory (docs/triggers.md says
    # so; this fails once torch fixes it, and the docs must change with it)
    script = HERE.parent / "examples" / "upstream" / "gloo_all_reduce_non_contiguous.py"
    env = {**os.environ, "MASTER_PORT": str(_free_port())}
    res = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120, env=env)
    assert res.returncode == 1, res.stdout + res.stderr
    assert "transposed on rank 0, contiguous on rank 1: got" in res.stdout, res.stdout + res.stderr
    assert "a column (stride 3) on every rank: got" in res.stdout, res.stdout
    assert "transposed on every rank:" not in res.stdout, res.stdout  # the same dense layout sums right


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_a_strided_view_keeps_the_values_and_is_not_contiguous():
    from shardfuzz.spec.layouts import strided_view

    for shape in [(2, 3), (3,), (1, 3), (2, 1), (2, 2, 2)]:
        t = torch.arange(math.prod(shape), dtype=torch.float32).reshape(shape)
        v = strided_view(t)
        assert torch.equal(v, t) and not v.is_contiguous(), shape
    one = torch.ones(1, 1)
    assert strided_view(one) is one  # one element is contiguous in every layout


GRAD_SUM = str(HERE / "data" / "strided_target.py")


def test_layout_free_inputs_arrive_strided_and_a_layout_agnostic_reference_passes():
    result = shardfuzz.run(GRAD_SUM, "reference", profile="shardfuzz-ci", database=None, max_examples=40)
    assert not result.found, result.report
    assert result.stats.triggers["strided inputs"] > 0, result.stats.summary()


def test_code_that_all_reduces_its_input_view_as_it_is_is_caught_with_strided_inputs():
    result = shardfuzz.run(GRAD_SUM, "in_place", profile="shardfuzz-ci", database=None, max_examples=60)
    assert result.found and result.kind == "mismatch", result.report
    case = result.case
    assert case.options["strided"] is True and case.group_size >= 2, result.report
    assert "layouts: a rank handed a non-contiguous tensor to a collective" in result.report


def test_a_layout_free_name_that_is_no_input_is_an_error_naming_it():
    import dataclasses

    from shardfuzz.errors import TargetError
    from shardfuzz.spec.registry import get_target

    with pytest.raises(TargetError, match="layout_free='g'; must be a tuple of input names"):
        dataclasses.replace(get_target(GRAD_SUM), layout_free="g")
    wrong = dataclasses.replace(get_target(GRAD_SUM), layout_free=("gg",))
    with pytest.raises(TargetError, match=r"layout_free.*'gg'"):
        shardfuzz.Runner(wrong, "reference").run_case(
            shardfuzz.Case(target="grad_sum", world_size=1, mesh=(1,), sizes={"rows": 1, "cols": 1})
        )


def test_autograds_lazy_zeros_travel_as_zeros():
    """sgn's gradient is a ZeroTensor (no storage): an output holding one reaches the driver as
    zeros, not as the rank's "Cannot convert a ZeroTensor to numpy" (a false finding)."""
    from shardfuzz.protocol import decode, encode

    x = torch.randn(3, dtype=torch.bfloat16, requires_grad=True)
    torch.sgn(x).backward(torch.ones(3, dtype=torch.bfloat16))
    assert x.grad._is_zerotensor()
    got = decode(encode({"grad": x.grad}))["grad"]
    assert got.dtype == torch.bfloat16 and torch.equal(got, torch.zeros(3, dtype=torch.bfloat16))


def test_an_oracles_lazy_zeros_are_real_zeros_in_what_it_expects():
    """An oracle whose gradient is a ZeroTensor (autograd.grad of sgn) gives zeros a reproducer
    can write out (tolist() of a ZeroTensor raises: "unallocated storage")."""
    from shardfuzz.protocol import dense

    x = torch.randn(3, requires_grad=True)
    (g,) = torch.autograd.grad(torch.sgn(x), x, torch.ones(3))
    assert g._is_zerotensor()
    assert dense(g).tolist() == [0.0, 0.0, 0.0] and not dense(g)._is_zerotensor()
    assert dense(x) is x


def test_an_oracle_that_overflows_the_case_dtype_where_float64_does_not_is_refused_not_judged():
    """exp2 of 150 is inf in float32 and 1.4e45 in float64: no float32 implementation can match the
    oracle there, so the case is counted as unsupported (it was a mismatch against any
    implementation); where float64 overflows too, or nowhere, nothing is refused."""
    from shardfuzz.verdict.oracle import check_case_dtype_range

    case = shardfuzz.Case(target="t", world_size=1, mesh=(1,), sizes={}, dtype="float32")
    named = type("T", (), {"name": "t"})
    big = torch.tensor([150.0, 1.0], dtype=torch.float64)
    with pytest.raises(shardfuzz.Unsupported, match="overflows float32 where its float64 value is finite"):
        check_case_dtype_range(named, case, {"y": big.exp2()}, {"y": big.float().exp2()})
    both = torch.tensor([float("inf"), 1.0])
    check_case_dtype_range(named, case, {"y": both.double()}, {"y": both})  # inf in both
    check_case_dtype_range(named, case, {"y": big}, {"y": big.float()})  # finite in both
