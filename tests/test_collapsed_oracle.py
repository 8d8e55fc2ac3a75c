"""An oracle that overflows an intermediate in the case dtype to finite wrong outputs (a float16
RMSNorm by hand: ``x * x`` is inf, ``rsqrt`` gives 0, every output a finite 0) leaves the bound's
``2 * |oracle_in_case_dtype - oracle64|`` term at twice the true value, where any output within it
passes: such a case is refused and counted, as a non-finite one is, never judged (a planted bug
passed at 0.4999 before; a new user's Llama block)."""

import dataclasses
import math
import os

import pytest
import torch

import shardfuzz
from shardfuzz import Case, Runner
from shardfuzz.errors import Unsupported
from shardfuzz.verdict import oracle as oracle_module
from shardfuzz.verdict.oracle import check_case_dtype_collapse, evaluate_oracle

HERE = os.path.dirname(os.path.abspath(__file__))
TARGET = f"{os.path.join(HERE, 'data', 'collapse_target.py')}::TARGET"
REFUSED = "the oracle overflows the case dtype"


def _case(dtype):
    return Case(
        target="collapse_rmsnorm",
        world_size=2,
        mesh=(2,),
        sizes={"rows": 3, "d": 3},
        split=("rows",),
        dtype=dtype,
        options={"scale": 1e3},
    )


def test_a_collapsed_case_is_refused_naming_the_op_and_the_output():
    with pytest.raises(Unsupported, match=r"overflows float16 in mul .* output 'y' is off by more") as e:
        Runner(TARGET, "weight_grad_not_reduced").run_case(_case("float16"))
    assert e.value.reason == REFUSED


def test_judged_without_the_refusal_the_bug_passes_at_half_its_bound(monkeypatch):
    """What the refusal is for: the same case judged passes the unreduced gradient."""
    monkeypatch.setattr(oracle_module, "check_case_dtype_collapse", lambda *a, **k: None)
    assert 0.45 < Runner(TARGET, "weight_grad_not_reduced").run_case(_case("float16")) < 1.0


def test_the_same_bug_in_float32_is_found():
    with pytest.raises(shardfuzz.Mismatch):
        Runner(TARGET, "weight_grad_not_reduced").run_case(_case("float32"))
    assert Runner(TARGET, "reference").run_case(_case("float32")) <= 1.0


def test_an_overflow_that_decides_a_branch_refuses_an_output_the_branch_left_far_off():
    """A new user's float16 ZeRO step: the oracle checks its gradient with isfinite, in Python, and
    skips the step; in float16 the check overflowed and the float64 oracle stepped, so the bound's
    rerun term held the whole update, and any output passed (0.499). The outputs hold no value
    computed from the inf: the overflow reached them through the branch alone."""
    skip = TARGET.replace("::TARGET", "::SKIP_TARGET")
    case = dataclasses.replace(_case("float16"), target="collapse_skipped_step")
    with pytest.raises(Unsupported, match=r"overflows float16 in mul .* output 'w_new' is off by more") as e:
        Runner(skip, "reference").run_case(case)
    assert e.value.reason == REFUSED
    assert Runner(skip, "reference").run_case(dataclasses.replace(case, dtype="float32")) <= 1.0  # judged


def test_an_exact_output_the_oracle_decides_otherwise_in_the_case_dtype_says_so():
    """The same new user's skip flag, compared exactly: the ranks and the oracle's float16 run skip,
    its float64 run does not, and the report sent them to the code every rank runs."""
    flag = TARGET.replace("::TARGET", "::FLAG_TARGET")
    case = dataclasses.replace(_case("float16"), target="collapse_skip_flag")
    with pytest.raises(shardfuzz.Mismatch) as e:
        Runner(flag, "reference").run_case(case)
    assert "the oracle run in float16 gives 'skipped' otherwise than its float64 run" in e.value.report
    assert "shardfuzz.decision()" in e.value.report


def test_only_an_overflow_behind_a_wrong_output_refuses():
    ref = {"y": torch.tensor([1.0, 2.0, -4.0], dtype=torch.float64)}
    calls = []

    def overflowed(name):
        return lambda off: (calls.append(name), name)[1]

    collapsed = {"y": torch.zeros(3, dtype=torch.float16)}
    with pytest.raises(Unsupported, match="in pow"):
        check_case_dtype_collapse(
            shardfuzz.get_target(TARGET), _case("float16"), ref, collapsed, overflowed("pow")
        )
    # off by more than half, but nothing overflowed (a sum that cancels in the case dtype): judged
    check_case_dtype_collapse(
        shardfuzz.get_target(TARGET), _case("float16"), ref, collapsed, lambda off: None
    )
    # within half of every value, or off only where the value is tiny against the output's largest:
    # the oracle is not rerun
    close = {"y": torch.tensor([0.6, 2.0, -4.0], dtype=torch.float16)}
    tiny = {"y": torch.tensor([1.0, 2.0, -4.0], dtype=torch.float64)}
    tiny["y"][0] = 1e-3
    for low, r in ((close, ref), ({"y": torch.tensor([0.0, 2.0, -4.0], dtype=torch.float16)}, tiny)):
        check_case_dtype_collapse(shardfuzz.get_target(TARGET), _case("float16"), r, low, overflowed("x"))
    assert calls == ["pow"]


def test_the_oracle_is_rerun_on_the_random_state_of_the_case(monkeypatch):
    """The rerun that looks for the overflow draws what the case's own runs drew (an oracle that
    draws a mask from torch's global generator): its outputs are the case-dtype run's, bit for bit."""
    target = shardfuzz.get_target(TARGET.replace("::TARGET", "::DROPPED_TARGET"))
    case = dataclasses.replace(_case("float16"), target="collapse_rmsnorm_dropped", options={"scale": 1.0})
    expected = evaluate_oracle(target, case)
    seen = {}
    monkeypatch.setattr(oracle_module, "watched_overflow", lambda watch, outputs, off: seen.update(outputs))
    torch.rand(8)  # what ran since (noise samples) moved the global generator on
    oracle_module._first_overflow(target, case, expected.inputs, expected.rng, ["y"])
    assert torch.equal(seen["y"], expected.low["y"]) and bool((expected.low["y"] == 0).any())


def test_a_run_counts_the_refused_cases():
    result = shardfuzz.run(TARGET, "reference", profile="shardfuzz-ci", database=None, dtypes=("float16",))
    assert not result.found, result.report
    assert result.stats.unsupported.get(REFUSED, 0) > 0 and result.stats.passed > 0, result.stats.summary()


def test_the_watch_names_an_overflow_not_a_mask_or_empty_memory():
    """A ``-inf`` mask value is given, not made, and an empty tensor's memory is no result (both
    seen in ``ring_attention``'s oracle; each refused a case before the watch knew them)."""

    def first(fn):
        watch = oracle_module.OverflowWatch()
        with watch:
            fn()
        return watch.first

    big = torch.tensor([300.0, 1.0], dtype=torch.float16)
    assert first(lambda: big * big) == "mul"
    assert first(lambda: big.masked_fill(big < 2, float("-inf"))) is None
    assert first(lambda: big.new_empty_strided((2,), (1,)).fill_(0)) is None
    assert first(lambda: (big * 2).exp()) == "exp"
    # in place and out=: the inputs are looked at before the op overwrites them (a review of ae67580)
    assert first(lambda: big.clone().mul_(big)) == "mul_"
    assert first(lambda: big.clone().pow_(2)) == "pow_"
    assert first(lambda: torch.mul(big, big, out=torch.zeros(2, dtype=torch.float16))) == "mul"
    # -inf in float64 too (a log-space mask): no overflow of the case dtype
    assert first(lambda: torch.log(big - big)) is None
    assert first(lambda: torch.tensor([0.0], dtype=torch.float64).log()) is None
    # a cast down overflows where its float64 rerun, cast to float64, does not (a review of stop 61)
    wide = big.float()
    assert first(lambda: (wide * wide).half()) == "_to_copy"
    assert first(lambda: (wide * wide).sum(dtype=torch.float16)) == "sum"
    # a stale NaN in a buffer that is only written is no input
    assert first(lambda: torch.mul(big, big, out=torch.full((2,), math.nan, dtype=torch.float16))) == "mul"
    assert first(lambda: torch.full((2,), math.nan, dtype=torch.float16).copy_(wide * wide)) == "copy_"
    # a random draw that overflows is one, and is not drawn again (the rerun would draw more)
    torch.manual_seed(0)
    watched = first(lambda: torch.zeros(4, dtype=torch.float16).normal_(0, 1e5)), torch.rand(1)
    torch.manual_seed(0)
    torch.zeros(4, dtype=torch.float16).normal_(0, 1e5)
    assert watched[0] == "normal_" and torch.equal(watched[1], torch.rand(1))


def test_an_output_off_for_another_reason_is_not_blamed_on_an_overflow():
    """A float16 additive mask, ``(1 - keep) * -1e9``, overflows to -inf harmlessly; an output
    that only cancels, computed from none of it, is judged (a review of stop 61: it was refused)."""
    keep = torch.tensor([1.0, 0.0], dtype=torch.float16)
    a = torch.tensor([1000.0, 1000.0], dtype=torch.float16)
    watch = oracle_module.OverflowWatch()
    with watch:
        masked = torch.softmax(a + (1 - keep) * -1e9, -1)
        cancelled = (a + 0.3) - a
    outputs = {"p": masked, "c": cancelled}
    assert watch.first == "mul"
    assert oracle_module.watched_overflow(watch, outputs, ["c"]) is None
    assert oracle_module.watched_overflow(watch, outputs, ["p"]) == "mul"


def test_a_self_oracle_refuses_the_same_case_from_the_ranks_watch():
    """With the implementation at world size 1 as the oracle, its case-dtype run is watched on the
    rank: the same refusal, and without it the unreduced gradient passes there too."""
    target = TARGET.replace("::TARGET", "::SELF_TARGET")
    case = dataclasses.replace(_case("float16"), target="collapse_rmsnorm_self")
    with pytest.raises(Unsupported, match=r"overflows float16 in mul .* output 'y'") as e:
        Runner(target, "weight_grad_not_reduced").run_case(case)
    assert e.value.reason == REFUSED
    assert Runner(target, "reference").run_case(dataclasses.replace(case, dtype="float32")) <= 1.0


def test_an_oracle_that_squares_in_place_is_refused_too():
    """``sq = x.clone(); sq.mul_(x)``: the same collapse through an in-place op (a review of ae67580:
    the watch looked at the inputs after the op had overwritten them, and the bug passed at 0.4999)."""
    target = TARGET.replace("::TARGET", "::INPLACE_TARGET")
    case = dataclasses.replace(_case("float16"), target="collapse_rmsnorm_inplace")
    with pytest.raises(Unsupported, match=r"overflows float16 in mul_") as e:
        Runner(target, "weight_grad_not_reduced").run_case(case)
    assert e.value.reason == REFUSED


def test_an_op_that_takes_no_float64_counts_as_an_overflow():
    """The watch's float64 rerun of an op that insists on its dtype raises; the op's non-finite
    result then counts as the case dtype's overflow (the case is refused, never passed)."""
    bits = torch.tensor([1, 2], dtype=torch.int16).view(torch.float16)
    with pytest.raises(RuntimeError):
        torch.ops.aten.bitwise_and.Tensor(bits.double(), bits.double())
    assert oracle_module._finite_in_float64(torch.ops.aten.bitwise_and.Tensor, (bits, bits), {})
