"""PyTorch's context-parallel ring (real PyTorch code) as implementations of ring_attention.

Its expected failures (the abort on an uneven sequence, the float32 merge of float64 inputs) are
records of the target, proved found and shrunk by tests/test_targets.py. Here: the implementation
restricted to what torch supports passes, with its contract choice (no LSE gradient) pinned as an
option and the rest rejected loudly, never passed.
"""

import pytest

import shardfuzz


@pytest.mark.parametrize("impl", ["torch_cp_ring_even", "torch_cp_ring_even_a2a"])
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_torch_ring_passes_on_what_it_supports(impl, dtype):
    result = shardfuzz.run(
        "ring_attention",
        impl,
        profile="shardfuzz-ci",
        database=None,
        max_examples=60,
        dtypes=(dtype,),
        options={"lse_grad": False},
    )
    assert not result.found, result.report
    assert result.stats.passed == result.stats.examples >= 60
    # uneven sequences are refused (counted), and every variant ran
    assert result.stats.unsupported["uneven seq"] > 0
    for variant in ("full", "causal", "zigzag"):
        assert result.stats.triggers[f"variant={variant}"] > 0, result.stats.summary()


def test_a_pinned_option_the_target_lacks_is_an_error_naming_it():
    with pytest.raises(
        shardfuzz.InvalidArgument,
        match="option 'lse_gradient' pinned, but target 'ring_attention' has no such option",
    ):
        shardfuzz.run(
            "ring_attention", "reference", max_examples=2, database=None, options={"lse_gradient": False}
        )


def test_a_gloo_abort_reports_the_aborting_ranks_first_lines_and_the_peers_closed_connection():
    """The expected failure's case: the aborting rank's stderr keeps its head (the 'terminate
    called after throwing' line comes before the noise) and the peer's error is shown too."""
    case = shardfuzz.Case(
        target="ring_attention",
        world_size=2,
        mesh=(2,),
        sizes={"batch": 1, "seq": 3, "heads": 1, "head_dim": 1},
        split=("seq",),
        dtype="float32",
        options={"variant": "full", "logit_scale": 1.0, "lse_grad": False},
    )
    runner = shardfuzz.Runner("ring_attention", "torch_cp_ring")
    with pytest.raises(shardfuzz.Finding) as e:
        runner.run_case(case)
    report = e.value.report
    assert e.value.kind == "rank-error", report
    assert "terminate called after throwing" in report and "EnforceNotMet" in report, report
    assert "Connection closed by peer" in report or "Connection reset" in report, report
