"""PyTorch's loss_parallel (torchtitan's plan: real PyTorch code) as an implementation of
vocab_parallel.

Its expected failures (two crashes and the ignored label smoothing) are records of the target,
proved found and shrunk by tests/test_targets.py, and their standalone reproducers are checked by
tests/test_standalone.py. Here: with the crashes' regions set aside (counted) and the contract's
choices pinned as options, the implementation passes, with every reduction, class weights and
ignored labels reached.
"""

import pytest

import shardfuzz
from shardfuzz.targets.vocab_parallel import LOSS_PARALLEL_KNOWN


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_loss_parallel_passes_outside_its_known_failures(dtype):
    result = shardfuzz.run(
        "vocab_parallel",
        "torch_loss_parallel",
        profile="shardfuzz-ci",
        database=None,
        max_examples=40,
        dtypes=(dtype,),
        options={"rule": "dtensor", "smoothing": 0.0},
        exclude=tuple(LOSS_PARALLEL_KNOWN.values()),
    )
    assert not result.found, result.report
    assert result.stats.passed == result.stats.examples >= 40
    assert sum(result.stats.excluded.values()) > 0, result.stats.summary()  # set aside, counted
    reached = result.stats.triggers
    for condition in (
        "reduction=mean",
        "reduction=sum",
        "class weights",
        "ignored labels",
        "uneven",
        "world>=3",
    ):
        assert reached[condition] > 0, (condition, result.stats.summary())


def test_unpinned_cases_torch_cannot_run_are_refused_and_counted():
    result = shardfuzz.run(
        "vocab_parallel",
        "torch_loss_parallel",
        profile="shardfuzz-ci",
        database=None,
        max_examples=10,
        exclude=tuple(LOSS_PARALLEL_KNOWN.values()),
    )
    assert not result.found, result.report
    assert result.stats.unsupported["rule"] > 0 and result.stats.unsupported["smoothing"] > 0
