"""DTensor outputs: the engine reads their placements and checks each rank's local piece."""

import pytest

import shardfuzz
from shardfuzz.spec.placements import box

TARGET = "tests/data/dtensor_target.py"


def _run(impl, **kw):
    return shardfuzz.run(TARGET, impl, profile="shardfuzz-ci", database=None, **{"max_examples": 25, **kw})


@pytest.mark.parametrize("impl", ["reference", "replicated", "both_axes", "dtensor_inputs"])
def test_dtensor_outputs_pass_on_uneven_and_empty_shards_and_2d_meshes(impl):
    result = _run(impl)
    assert not result.found, result.report
    assert result.stats.passed == result.stats.examples >= 25


def test_a_partial_sum_labelled_replicate_is_a_mismatch():
    result = _run("partial_called_replicate")
    assert result.found and result.kind == "mismatch", result.report
    assert result.case.world_size == 2 and "total" in result.report
    assert "DTensor(Replicate()) on mesh (2,)" in result.report


@pytest.mark.parametrize(
    "impl, message",
    [
        (
            "wrong_local_shape",
            "output 'y' (DTensor(Shard(0)) on mesh (2,)): rank 1 holds [1, 1] float32, expected [0, 1]",
        ),
        (  # the placements that explain the shape (they were left out)
            "shard_called_replicate",
            "output 'y': rank 1 holds a DTensor of global shape [0, 1] (['Replicate()'] on mesh (2,)), "
            "the oracle gives [1, 1]",
        ),
        (
            "plain_for_dtensor",
            "output 'y' (FromDTensor()): rank 0 returned a plain value, expected a DTensor",
        ),
    ],
)
def test_a_dtensor_that_breaks_its_placements_is_a_layout_finding(impl, message):
    result = _run(impl)
    assert result.found and result.kind == "layout", result.report
    assert message in result.report


def test_dtensors_whose_ranks_disagree_on_the_global_shape_name_each_and_from_local():
    """A new user's from_local without shape= on uneven rows: the report named rank 0's wrong global
    shape alone, and told them to fix the target's declared layout (Target(outputs=...)), which a
    DTensor's placements override."""
    result = _run("from_local_without_shape", max_examples=40)
    assert result.found and result.kind == "layout", result.report
    (line,) = [line for line in result.report.splitlines() if "global shape" in line]
    assert line.count("holds a DTensor of global shape") == result.case.world_size, line
    assert "DTensor.from_local infers it from each rank's own local piece" in line
    assert "pass shape= and stride=" in line
    assert "Target(outputs=...)" not in result.report


def test_the_piece_of_each_rank_follows_dtensor_rule_on_every_axis():
    # 5 rows on 2 x 2: axis 0 takes [3, 2] rows, axis 1 splits those again: [2, 1] and [1, 1]
    placements = (("shard", 0), ("shard", 0))
    boxes = [box((5, 4), placements, (2, 2), (i, j)) for i in range(2) for j in range(2)]
    assert boxes == [((0, 0), (2, 4)), ((2, 0), (1, 4)), ((3, 0), (1, 4)), ((4, 0), (1, 4))]
    assert box((1, 3), (("shard", 0),), (2,), (1,)) == ((1, 0), (0, 3))  # an empty shard
    assert box((2, 3), (("replicate",), ("shard", 1)), (2, 2), (1, 1)) == ((0, 2), (2, 1))


# -- torch's own DTensor outputs (its implementations' passes are tests/test_verified.py) ---------
def test_fsdp2_state_layout_is_read_from_the_dtensors():
    """FSDP2's per-parameter Shard(0) state handed back as plain local pieces, not the DTensors:
    a layout finding at 2 ranks (the engine reads the layout from the DTensors, never assumes it)."""
    result = shardfuzz.run(
        "zero_adamw_torch",
        "tests/data/fsdp2_locals.py::fsdp2_local_pieces",
        profile="shardfuzz-ci",
        database=None,
        max_examples=10,
        world_sizes=(1, 2),
    )
    assert result.found and result.kind == "layout", result.report
    assert result.case.world_size == 2, result.report


def _redistribute_case(src, dst):
    return shardfuzz.Case(
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
    case = _redistribute_case("R,S0", "P,S0")
    assert shardfuzz.Runner("redistribute", "reference").run_case(case) < 1
    with pytest.raises(shardfuzz.Mismatch):
        shardfuzz.Runner("redistribute", "sum_replicas").run_case(case)


def test_a_partial_destination_on_another_axis_than_the_sources_partial_sums_to_the_value():
    """Found by `shardfuzz fuzz` (the README's quick start): the reference cut a Partial
    destination with the owners of the source's Partial axes, so an element kept by source
    coordinate 1 was kept by no destination coordinate."""
    case = shardfuzz.Case(
        target="redistribute", world_size=2, mesh=(2, 1), sizes={"d0": 1, "d1": 1}, split=("d0", "d1"),
        options={"src": "P,R", "dst": "R,P"},
    )  # fmt: skip
    assert shardfuzz.Runner("redistribute", "reference").run_case(case) < 1


def test_an_input_layout_that_cannot_fit_the_case_mesh_is_the_targets_error_not_a_finding():
    # a new user's AsDTensor(Shard(0), Shard(2), mesh="all") on a target that also draws 1-D meshes
    # raised on the ranks and was reported as a rank error of their own math, with a failure file
    from torch.distributed.tensor import Shard

    from shardfuzz import Case
    from shardfuzz.engine.config import RunConfig
    from shardfuzz.engine.runner import Runner
    from shardfuzz.errors import InvalidArgument, TargetError
    from shardfuzz.spec.registry import get_target

    base = get_target(TARGET)
    two = base.derive(
        name="dtensor_all", input_layouts={"x": shardfuzz.AsDTensor(Shard(0), Shard(1), mesh="all")}
    )
    case = Case(target="dtensor_all", world_size=2, mesh=(2,), sizes={"rows": 2, "cols": 2}, split=("rows",))
    with pytest.raises(
        TargetError,
        match=r"input_layouts\['x'\]=AsDTensor\(Shard\(dim=0\), Shard\(dim=1\), mesh='all'\) has 2 placement\(s\).*mesh \(2,\) has 1",
    ):
        Runner(two, "reference", RunConfig()).run_case(case)
    with pytest.raises(
        InvalidArgument, match=r"the axis under test is one mesh axis, so it takes one placement"
    ):
        shardfuzz.AsDTensor(Shard(0), Shard(1))
    with pytest.raises(
        TargetError, match=r"input_layouts=<function .*must be a mapping input name -> layout"
    ):
        base.derive(name="by_case", input_layouts=lambda case: {})
