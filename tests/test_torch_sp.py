"""torch.distributed.tensor.parallel's SequenceParallel (real PyTorch code) with ColwiseParallel /
RowwiseParallel, as implementations of tp_mlp under its ``sequence_parallel`` option.

Its expected failure (the local-tensor plan aborting on an uneven sequence, pytorch/torchtitan#1306)
is a record of the target, proved found and shrunk by tests/test_targets.py. Here: the local-tensor
plan restricted to what it supports and the DTensor plan pass, and what they refuse is counted.
"""

import pytest

import shardfuzz

EXAMPLES = 40


def _run(impl, dtype):
    result = shardfuzz.run(
        "tp_mlp", impl, profile="shardfuzz-ci", database=None, max_examples=EXAMPLES, dtypes=(dtype,)
    )
    assert not result.found, result.report
    assert result.stats.passed == result.stats.examples >= EXAMPLES, result.stats.summary()
    # sequence-parallel plans: the plain MLP's cases are refused, counted
    assert result.stats.unsupported["not sequence parallel"] > 0, result.stats.summary()
    return result


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_local_tensor_plan_passes_on_even_sequences(dtype):
    """use_local_output=True, plain local tokens in and out: uneven sequences are refused."""
    result = _run("torch_sp_even", dtype)
    assert result.stats.unsupported["uneven seq"] > 0, result.stats.summary()
    for trigger in ("sequence parallel", "world>=3", "group<world", "batch>1"):
        assert result.stats.triggers[trigger] > 0, result.stats.summary()


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_dtensor_plan_passes_uneven_and_empty_sequence_shards(dtype):
    """use_local_output=False, DTensors in and out (y, grad_x and the LayerNorm's Partial
    gradients read by their placements)."""
    result = _run("torch_sp_dtensor", dtype)
    for trigger in (
        "sequence parallel, uneven sequence",
        "sequence parallel, an empty sequence shard",
        "world>=3",
        "2-D mesh",
    ):
        assert result.stats.triggers[trigger] > 0, result.stats.summary()
