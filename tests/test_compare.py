import math
import warnings

import pytest
import torch

from shardfuzz.errors import InvalidArgument
from shardfuzz.spec.tolerance import OutputTolerance, Tolerance
from shardfuzz.verdict.compare import compare_tensor


def _cmp(actual, expected, bound=1e-6):
    e = torch.tensor(expected, dtype=torch.float64)
    return compare_tensor(torch.tensor(actual), e, torch.full_like(e, bound), 0, lambda i: i)


def test_within_and_beyond_tolerance():
    assert _cmp([1.0, 2.0], [1.0, 2.0 + 5e-7]).bad == 0
    rd = _cmp([1.0, 2.5], [1.0, 2.0])
    assert rd.bad == 1 and rd.max_abs_at == (1,) and math.isclose(rd.max_abs, 0.5)


def test_nan_and_inf_policy():
    assert _cmp([float("nan")], [float("nan")]).bad == 0
    assert _cmp([float("inf")], [float("inf")]).bad == 0
    assert _cmp([float("-inf")], [float("inf")]).bad == 1
    assert _cmp([float("nan")], [1.0]).bad == 1
    assert _cmp([1.0], [float("nan")]).bad == 1
    assert _cmp([float("inf")], [1.0]).max_ratio == math.inf


def test_bound_follows_noise_rerun_and_floor():
    tol = Tolerance()
    ref = torch.tensor([1.0, 0.0], dtype=torch.float64)
    low = torch.tensor([1.0, 0.0], dtype=torch.float32)
    quiet = torch.zeros(2, dtype=torch.float64)
    b32 = tol.bound(ref, low, quiet, None, "float32", 2)
    b16 = tol.bound(ref, low, quiet, None, "bfloat16", 2)
    assert (b16 > 1000 * b32).all()  # the floor is in units of the case dtype's roundoff
    # the floor: 2 u rms(ref) on every element, the exact zero included
    assert torch.allclose(b32, torch.full((2,), 2 * 2.0**-24 * math.sqrt(0.5), dtype=torch.float64))
    # a noisy element (a cancellation the Monte-Carlo samples saw) gets 4x its noise
    noise = torch.tensor([0.0, 1e-3], dtype=torch.float64)
    assert tol.bound(ref, low, noise, None, "float32", 2)[1] >= 4e-3
    # an element whose samples fell small gets the output's median noise
    noise = torch.tensor([1e-3, 0.0, 1e-3], dtype=torch.float64)
    ref3 = torch.ones(3, dtype=torch.float64)
    assert tol.bound(ref3, ref3.float(), noise, None, "float32", 2)[1] >= 4e-3
    # the case-dtype rerun's own error counts twice
    noisy = torch.tensor([1.001, 0.0], dtype=torch.float32)
    assert tol.bound(ref, noisy, quiet, None, "float32", 2)[0] >= 2 * 0.00099
    # an output that is exactly 0 everywhere takes its floor from the case's scale
    zeros = torch.zeros(2, dtype=torch.float64)
    assert (
        tol.bound(zeros, zeros.float(), quiet, None, "bfloat16", 2, case_scale=3.0) >= 2 * 2.0**-8 * 3.0
    ).all()
    # a hand-written magnitude replaces the output's scale in the floor
    mag = torch.tensor([1.0, 100.0], dtype=torch.float64)
    assert tol.bound(ref, low, quiet, mag, "float32", 2)[1] > 50 * b32[1]


def test_legacy_model_is_kept_for_comparison():
    tol = Tolerance(noise_model="dtype-rerun")
    ref = torch.tensor([1.0, 0.0], dtype=torch.float64)
    low = torch.tensor([1.0, 0.0], dtype=torch.float32)
    b32 = tol.bound(ref, low, None, None, "float32", 2)
    assert b32[0] == 4 * 4 * 2.0**-24 * (1 + math.sqrt(0.5)) + torch.finfo(torch.float32).tiny


def test_output_tolerance_parse_and_bound():
    t = OutputTolerance.parse("rtol:1e-3, atol:1e-5")
    assert (t.rtol, t.atol) == (1e-3, 1e-5)
    assert OutputTolerance.parse("atol:0.5") == OutputTolerance(atol=0.5)
    for bad in ("rtol=1", "rtol:x", "rtol:1,rtol:2", "ptol:1", "rtol:-1", "atol:inf"):
        with pytest.raises(ValueError, match=r"rtol|atol"):
            OutputTolerance.parse(bad)
    assert torch.equal(
        t.bound(torch.tensor([-2.0, 0.0], dtype=torch.float64)),
        torch.tensor([1e-5 + 2e-3, 1e-5], dtype=torch.float64),
    )
    with pytest.raises(InvalidArgument, match="per_output"):
        Tolerance(per_output={"y": 3})
    with pytest.raises(InvalidArgument, match="noise_model='x'"):
        Tolerance(noise_model="x")


def test_report_of_worst_elements_names_a_cancellation():
    e = torch.tensor([1e-6, 1.0], dtype=torch.float64)
    a = torch.tensor([1e-3, 1.0])
    bound = torch.full_like(e, 1e-5)
    noise = torch.tensor([2.0**-24 * 0.5, 2.0**-24], dtype=torch.float64)
    rd = compare_tensor(a, e, bound, 0, lambda i: i, noise, 2.0**-24)
    assert rd.bad == 1 and len(rd.worst) == 1
    text = rd.worst[0].describe()
    assert "vs expected 1e-06" in text and "noise estimate" in text and "a cancellation" in text
    # the note concludes: the rounding is in the bound, so it does not explain this element (a
    # new user read "a cancellation" beside an element 1e5x past the bound as "only noise")
    assert "so it does not explain this element (99.9x past it)" in text, text
    # far past the bound (a whole contribution missing) the note on every element was only noise
    far = compare_tensor(a * 100, e, bound, 0, lambda i: i, noise, 2.0**-24).worst[0]
    assert far.ratio > 100 and "cancellation" not in far.describe(), far.describe()
    assert (
        "cancellation"
        not in compare_tensor(a, e * 0 + 1e-3 + 1, bound, 0, lambda i: i, noise, 2.0**-24).worst[0].describe()
    )


def _same_index(index):
    return index


def test_the_numpy_path_of_a_passing_piece_describes_it_as_the_torch_path_does(monkeypatch):
    """``_passing`` (numpy, the usual case) and the torch path give the same description of every
    passing piece (bf16, float32 and float64 locals, a strided bound, a zero bound met exactly), and
    leave every failing or non-finite piece to the torch path."""
    import dataclasses

    import shardfuzz.verdict.compare as compare

    gen = torch.Generator().manual_seed(0)
    passing = declined = 0
    for trial in range(600):
        shape = tuple(int(s) for s in torch.randint(1, 5, (1 + trial % 3,), generator=gen))
        dtype = (torch.float32, torch.bfloat16, torch.float64)[trial % 3]
        expected = torch.randn(shape, dtype=torch.float64, generator=gen)
        actual = (expected + 1e-3 * torch.randn(shape, dtype=torch.float64, generator=gen)).to(dtype)
        bound = 1e-2 * torch.rand((*shape, 2), dtype=torch.float64, generator=gen)[..., 0]  # strided
        if trial % 7 == 0:  # atol = rtol = 0, met exactly
            actual, bound = expected.clone(), torch.zeros(shape, dtype=torch.float64)
        if trial % 11 == 0:
            actual = actual.clone().reshape(-1)
            actual[0] = float("nan") if trial % 2 else float("inf")
            actual = actual.reshape(shape)
            if trial % 3 == 0:  # infinite on both sides: inf - inf
                expected = expected.clone().reshape(-1)
                expected[0] = actual[0].item()
                expected = expected.reshape(shape)
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # inf - inf warned from numpy, where torch does not
            fast = compare._passing(actual, expected, bound, 1, _same_index)
        monkeypatch.setattr(compare, "_passing", lambda *args: None)
        slow = compare.compare_tensor(actual, expected, bound, 1, _same_index)
        monkeypatch.undo()
        if fast is None:
            declined += 1
            assert slow.bad > 0 or not bool(torch.isfinite(actual).all()), slow  # the NaN/Inf policy's
            continue
        passing += 1
        described = {k: v for k, v in dataclasses.asdict(fast).items() if k not in ("local", "wrong")}
        assert described == {k: v for k, v in dataclasses.asdict(slow).items() if k not in ("local", "wrong")}
    assert passing > 200 and declined > 100, (passing, declined)


def test_a_greatest_difference_that_passes_where_it_is_says_so():
    """The largest difference may sit where more is allowed and pass there: a new user read its
    index as the wrong element's. It says it passes there, and the worst element is the one listed."""
    from shardfuzz.report.findings import format_output_diff
    from shardfuzz.verdict.compare import OutputDiff

    e = torch.tensor([1.0, 100.0], dtype=torch.float64)
    bound = torch.tensor([1e-6, 1.0], dtype=torch.float64)
    rd = compare_tensor(torch.tensor([1.1, 100.5]), e, bound, 0, lambda i: i)
    assert rd.bad == 1 and rd.max_abs_at == (1,)
    text = format_output_diff(OutputDiff("y", "Shard(0)", "float32", (2,), [rd], bound=bound), str)
    assert (
        "at index (1,) (an element that passes: 1 is allowed there; the worst element against its own tolerance, below, is "
        in text
    ), text
    wrong = compare_tensor(torch.tensor([1.0, 103.0]), e, bound, 0, lambda i: i)
    text = format_output_diff(OutputDiff("y", "Shard(0)", "float32", (2,), [wrong], bound=bound), str)
    assert "at index (1,) (up to 1 allowed there; the worst element is 3x its tolerance)" in text, text


def test_an_inf_or_nan_where_the_oracle_is_finite_asks_whether_the_case_dtype_overflowed():
    """A float16 implementation whose ``x**3`` overflowed read "nan vs expected 0 ... (infx)" with
    no word of an overflow (a new user's GELU audit); a finite mismatch gets no such line."""
    from shardfuzz.report.findings import format_output_diff
    from shardfuzz.verdict.compare import OutputDiff

    e = torch.tensor([0.0, 2.0], dtype=torch.float64)
    bound = torch.full_like(e, 1e-3)
    for bad in (float("nan"), float("inf")):
        rd = compare_tensor(torch.tensor([bad, 2.0], dtype=torch.float16), e, bound, 0, lambda i: i)
        text = format_output_diff(OutputDiff("y", "Shard(0)", "float16", (2,), [rd], bound=bound), str)
        assert (
            "inf or NaN where the oracle is finite: did the implementation's arithmetic overflow float16 (its "
            "largest finite value is 65504), or a narrower type it computes in," in text
        ), text
        assert "Did an exp underflow to 0 and then meet a log or a division" in text, text
    wrong = compare_tensor(torch.tensor([1.0, 2.0], dtype=torch.float16), e, bound, 0, lambda i: i)
    text = format_output_diff(OutputDiff("y", "Shard(0)", "float16", (2,), [wrong], bound=bound), str)
    assert "inf or NaN" not in text, text
    inf = torch.tensor([math.inf, 2.0]).double()
    both = compare_tensor(torch.tensor([math.inf, 9.0]), inf, bound, 0, lambda i: i)
    text = format_output_diff(OutputDiff("y", "Shard(0)", "float32", (2,), [both], bound=bound), str)
    assert "inf or NaN" not in text, text  # the oracle's infinity is matched: the wrong element is finite
    nan_at_inf = compare_tensor(torch.tensor([math.nan, 2.0]), inf, bound, 0, lambda i: i)
    text = format_output_diff(OutputDiff("y", "Shard(0)", "float32", (2,), [nan_at_inf], bound=bound), str)
    assert nan_at_inf.bad == 1 and "inf or NaN" not in text, text  # the oracle is not finite there
    # a Python float output (its dtype named "float", which torch also reads as float32): no largest value
    py = compare_tensor(torch.tensor([math.nan, 2.0]), e, bound, 0, lambda i: i)
    text = format_output_diff(OutputDiff("y", "Replicate()", "float", (2,), [py], bound=bound), str)
    assert "overflow float, or a narrower type it computes in, or make a NaN" in text, text
    # or an element never written: a new user's resharding target filled its buffer with NaN
    assert "an element the implementation never wrote" in text, text


def test_a_nan_is_printed_as_nan_where_it_is_the_greatest_difference():
    """A NaN beside a finite oracle value is ranked as infinitely wrong, and the report's greatest
    differences say nan there, as its worst-element line does (a new user read "inf" above "nan")."""
    from shardfuzz.report.findings import format_output_diff
    from shardfuzz.verdict.compare import OutputDiff

    e = torch.tensor([0.0, 2.0], dtype=torch.float64)
    bound = torch.full_like(e, 1e-6)
    nan = compare_tensor(torch.tensor([float("nan"), 2.0]), e, bound, 0, lambda i: i)
    assert nan.bad == 1 and nan.max_abs == math.inf and nan.max_abs_nan and nan.max_rel_nan
    od = OutputDiff("y", "Shard(0)", "float32", (2,), [nan], bound=bound)
    text = format_output_diff(od, lambda r: f"rank {r}")
    assert "greatest absolute difference: nan (a NaN on one side) at index (0,)" in text, text
    assert "greatest relative difference: nan (a NaN on one side) at index (0,)" in text, text
    # an infinity stays an infinity, and a finite difference its value
    inf = compare_tensor(torch.tensor([float("inf"), 2.0]), e, bound, 0, lambda i: i)
    assert inf.max_abs == math.inf and not inf.max_abs_nan and not inf.max_rel_nan
    text = format_output_diff(OutputDiff("y", "Shard(0)", "float32", (2,), [inf], bound=bound), str)
    assert "greatest absolute difference: inf at index (0,)" in text, text
    both = compare_tensor(
        torch.tensor([float("nan"), 5.0]), torch.tensor([float("nan"), 2.0]).double(), bound, 0, str
    )
    # NaN matching NaN is right: the greatest differences are the wrong element's (the relative
    # one read the matched NaNs' nan), and an infinity expected is inf on both lines
    assert both.bad == 1 and not both.max_abs_nan and both.max_abs == 3.0 and both.max_abs_at == "(1,)"
    assert both.max_rel == 1.5 and both.max_rel_at == "(1,)" and not both.max_rel_nan
    inf_expected = compare_tensor(
        torch.tensor([5.0, 2.0]), torch.tensor([math.inf, 2.0]).double(), bound, 0, str
    )
    assert inf_expected.max_abs == inf_expected.max_rel == math.inf
    assert not inf_expected.max_abs_nan and not inf_expected.max_rel_nan


def test_a_rank_with_an_empty_piece_reads_as_empty_not_ok():
    """An empty shard was "rank 1: ok (worst error/tolerance 0)" above a map that said "(empty)"
    (a new user's Ulysses audit)."""
    from shardfuzz.report.findings import format_output_diff
    from shardfuzz.verdict.compare import OutputDiff

    e = torch.tensor([1.0, 2.0], dtype=torch.float64)
    wrong = compare_tensor(torch.tensor([1.0, 5.0]), e, torch.full_like(e, 1e-6), 0, lambda i: i)
    empty = compare_tensor(torch.zeros(0), e[:0], torch.zeros(0, dtype=torch.float64), 1, lambda i: i)
    assert empty.n == 0 and empty.bad == 0
    text = format_output_diff(
        OutputDiff("y", "Shard(0)", "float32", (2,), [wrong, empty]), lambda r: f"rank {r}"
    )
    assert (
        "  rank 1: no element of the value (an empty or all-padding piece): nothing to compare" in text
        and "rank 1: ok" not in text
    ), text
    assert "  rank 0: 1 / 2 elements wrong" in text, text
