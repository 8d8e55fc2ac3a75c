"""DTensor.redistribute (real PyTorch code) as an implementation of the redistribute target.

The target's planted bugs and reference are proved by tests/test_targets.py. Here: torch's
redistribute passes, forward and backward, on 1-D and 2-D meshes with uneven and empty shards;
what it refuses by design (redistributing to Partial) is counted; and the engine judges a
2-D mesh DTensor output with a Partial axis both ways.
"""

import pytest

import shardfuzz
from shardfuzz import Case, Mismatch, Runner


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_torch_redistribute_passes(dtype):
    result = shardfuzz.run(
        "redistribute",
        "torch_redistribute",
        profile="shardfuzz-ci",
        database=None,
        max_examples=40,
        dtypes=(dtype,),
    )
    assert not result.found, result.report
    assert result.stats.passed == result.stats.examples >= 40, result.stats.summary()
    assert result.stats.unsupported["to Partial"] > 0, result.stats.summary()
    for trigger in (
        "Partial source",
        "Partial -> Shard on one axis",
        "Shard -> another Shard on one axis",
        "a dim smaller than its mesh axis (empty shards)",
        "2-D mesh",
        "uneven",
        "backward",
    ):
        assert result.stats.triggers[trigger] > 0, result.stats.summary()


def _case(src, dst):
    return Case(
        target="redistribute",
        world_size=4,
        mesh=(2, 2),
        sizes={"d0": 3, "d1": 1},
        split=("d0", "d1"),
        options={"src": src, "dst": dst},
    )


def test_a_2d_mesh_partial_output_is_summed_over_its_axis_only():
    """dst Partial on axis 0, Shard(0) on axis 1 (uneven: [2, 1]): right when each replica's
    pieces sum to the value, a mismatch when the Replicate copies of the source are summed too."""
    assert Runner("redistribute", "reference").run_case(_case("R,S0", "P,S0")) < 1
    with pytest.raises(Mismatch):
        Runner("redistribute", "sum_replicas").run_case(_case("R,S0", "P,S0"))


def test_a_partial_destination_on_another_axis_than_the_sources_partial_sums_to_the_value():
    """Found by `shardfuzz fuzz` (the README's quick start): the reference cut a Partial
    destination with the owners of the source's Partial axes, so an element kept by source
    coordinate 1 was kept by no destination coordinate."""
    case = shardfuzz.Case(
        target="redistribute", world_size=2, mesh=(2, 1), sizes={"d0": 1, "d1": 1}, split=("d0", "d1"),
        options={"src": "P,R", "dst": "R,P"},
    )  # fmt: skip
    assert shardfuzz.Runner("redistribute", "reference").run_case(case) < 1
