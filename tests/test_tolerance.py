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
