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
