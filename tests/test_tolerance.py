"""Tolerance(precision=...): an implementation that computes part of its work in a narrower dtype
than the case's by design is judged at that dtype's rounding."""

import pytest

from shardfuzz import InvalidArgument, Tolerance


def test_precision_judges_every_case_at_the_coarser_rounding_and_says_so():
    tol = Tolerance(precision="bfloat16")
    assert tol.judged_dtype("float32") == tol.judged_dtype("bfloat16") == "bfloat16"
    assert Tolerance(precision="float32").judged_dtype("bfloat16") == "bfloat16"  # never finer
    assert Tolerance().judged_dtype("float64") == "float64"
    said = tol.describe("float32")
    assert said.startswith("judged at bfloat16's rounding (precision='bfloat16'; the case is float32): ")
    assert "4 * noise" in said  # the 16-bit factor, as for a bfloat16 case
    assert Tolerance(precision="float16").describe("float16") == Tolerance().describe("float16")
    with pytest.raises(
        InvalidArgument, match="precision='bf16'; allowed: float64, float32, bfloat16, float16"
    ):
        Tolerance(precision="bf16")


def test_an_implementation_lossy_by_design_passes_at_its_precision_and_a_bug_still_fails(tmp_path):
    """A new user's DDP bf16_compress_hook on float32 gradients: reported at 2,030x in float32 cases,
    and every fixed tolerance they tried gave another false positive. ``precision`` judges every
    op at bfloat16's rounding: the compressed sum passes, and a mean that should be a sum fails."""
    import json
    import os

    import shardfuzz
    from shardfuzz.frontends import cli

    target = os.path.join(os.path.dirname(__file__), "data", "compressed_target.py") + "::TARGET"
    strict = shardfuzz.run(target, "reference", profile="shardfuzz-ci", database=None, max_examples=15)
    assert strict.found and strict.kind == "mismatch", strict.report
    assert "is exactly a bfloat16 value" in strict.report and "--precision bfloat16" in strict.report
    lossy = Tolerance(precision="bfloat16")
    run = dict(profile="shardfuzz-ci", database=None, max_examples=30, tolerance=lossy)
    clean = shardfuzz.run(target, "reference", **run)
    assert not clean.found and clean.stats.passed == 30, clean.report
    bug = shardfuzz.run(target, "mean", failures_dir=str(tmp_path), **run)
    assert bug.found and bug.kind == "mismatch", bug.report
    assert "judged at bfloat16's rounding (precision='bfloat16'; the case is float32)" in bug.report
    # its failure file carries the precision, and a replay judges with it and says so
    (path,) = tmp_path.glob("*.json")
    assert json.loads(path.read_text())["tolerance"]["precision"] == "bfloat16"
    code = cli.main(["replay", str(path), "--trust-refs"])
    assert code == cli.EXIT_FOUND


def test_the_narrower_note_needs_every_wrong_value_to_be_a_narrower_dtypes_and_no_grid():
    from types import SimpleNamespace

    import torch

    from shardfuzz.case import Case
    from shardfuzz.report.findings import narrower_note

    case = Case(target="t", world_size=1, mesh=(1,), sizes={"n": 4}, split=("n",))

    def note(values, on=case, judged="float32"):
        local = torch.tensor(values, dtype=torch.float32)
        rank = SimpleNamespace(local=local, wrong=torch.ones_like(local, dtype=torch.bool))
        return narrower_note([SimpleNamespace(ranks=[rank])], on, judged)

    generic = torch.randn(8, generator=torch.Generator().manual_seed(0))
    assert note(generic.tolist()) is None
    said = note(generic.to(torch.bfloat16).float().tolist())
    assert (
        said.startswith("every wrong element (8) is exactly a bfloat16 value")
        and "--precision bfloat16" in said
    )
    assert "exactly a float16 value" in note(generic.half().float().tolist())
    assert note([1.0, 2.0, -3.0]) is None  # integers (a count, a zero): representable anywhere
    assert note([0.3359375]) is None  # one element: 1 in 65,536 by chance
    assert note(generic.to(torch.bfloat16).float().tolist(), judged="bfloat16") is None
    ties = Case(
        target="t",
        world_size=1,
        mesh=(1,),
        sizes={"n": 4},
        split=("n",),
        profile="ties",
        options={"grid": 0.5},
    )
    assert note(generic.to(torch.bfloat16).float().tolist(), on=ties) is None


def test_the_narrower_note_leaves_out_values_that_a_cancellation_left_with_few_bits():
    """A new user's float32 LayerNorm gradients over 2 features (a summing bug): 2 wrong elements,
    -7.7486e-07 and 8.64267e-07 where the terms were about 5.6 (noise 3.3e-07 and 4.1e-07), were
    said to be "exactly a bfloat16 value". A cancellation leaves a small multiple of the terms'
    spacing, with few significant bits: those values do not count. Values far above their noise
    still do."""
    from types import SimpleNamespace

    import torch

    from shardfuzz.case import Case
    from shardfuzz.report.findings import narrower_note

    case = Case(target="t", world_size=1, mesh=(1,), sizes={"n": 4}, split=("n",))

    def note(values, noise):
        local = torch.tensor(values, dtype=torch.float32)
        rank = SimpleNamespace(
            local=local, wrong=torch.ones_like(local, dtype=torch.bool), noise=torch.tensor(noise)
        )
        return narrower_note([SimpleNamespace(ranks=[rank])], case, "float32")

    cancelled = torch.tensor([-7.7486e-07, 8.64267e-07]).to(torch.bfloat16).float().tolist()  # as printed
    assert note(cancelled, [3.33e-07, 4.11e-07]) is None
    generic = torch.randn(8, generator=torch.Generator().manual_seed(0)).to(torch.bfloat16).float()
    assert "exactly a bfloat16 value" in note(generic.tolist(), [1e-7] * 8)


def test_a_tolerance_for_an_exactly_compared_output_is_refused_not_printed_as_applied():
    """A new user's --tolerance skipped=atol:5 on an int64 skip flag was printed in the header as
    applied, and the flag still failed at a difference of 1."""
    import os

    import pytest

    from shardfuzz import Case, RunConfig, Runner
    from shardfuzz.errors import InvalidArgument
    from shardfuzz.frontends import cli
    from shardfuzz.spec.tolerance import OutputTolerance

    toy = os.path.join(os.path.dirname(__file__), "data", "toy_target.py")
    case = Case(target="toy", world_size=2, mesh=(2,), sizes={"n": 3}, split=("n",))
    exact = Tolerance(per_output={"count": OutputTolerance(atol=5.0)})
    with pytest.raises(InvalidArgument, match=r"a tolerance for output 'count' .* compared exactly: .*int64"):
        Runner(toy, config=RunConfig(tolerance=exact)).run_case(case)
    floating = Tolerance(per_output={"total": OutputTolerance(atol=5.0), "c*": OutputTolerance(atol=1.0)})
    assert Runner(toy, config=RunConfig(tolerance=floating)).run_case(case) <= 1  # a pattern: not refused
    assert cli.main(["case", toy, "--tolerance", "count=atol:5", repr(case)]) == cli.EXIT_USAGE
