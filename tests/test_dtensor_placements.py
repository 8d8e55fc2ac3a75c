"""Every placement DTensor's own ops return is read as torch means it (issue 32): ``Partial`` max,
min, sum and product, ``_NormPartial`` (p = 1, 2; torch turns p = inf into ``Partial(max)``),
``_MaskPartial`` (a row-sharded embedding) and ``_StridedShard`` (flatten of a 2-D-sharded
tensor, compared through ``full_tensor()``). Each case's implementation returns the DTensor and
its ``full_tensor()``: both are judged against one oracle, so a misread placement fails ``y``
only. The file asserts, on the ranks, that torch returned the placement each op is about. On 1-D
and 2-D meshes in the ci suite, on (2, 2, 2) under ``-m slow`` (8 ranks)."""

import pytest

import shardfuzz
from shardfuzz import Case, RunConfig, Runner

TARGET = "tests/data/dtensor_placements.py"
OPS = ("sum", "amax", "amin", "prod", "norm1", "norm2", "norminf", "embedding", "flatten")


def _case(op, world, mesh, rows, cols):
    return Case(
        target="dtensor_placements", world_size=world, mesh=mesh, sizes={"rows": rows, "cols": cols},
        split=("rows",), dtype="float32", options={"op": op}, seed=3,
    )  # fmt: skip


@pytest.mark.parametrize("op", OPS)
def test_each_placement_is_read_as_torch_means_it_on_1d_and_2d_meshes(op):
    runner = Runner(TARGET, "reference", RunConfig(failures_dir=None))
    for case in (_case(op, 3, (3,), 6, 2), _case(op, 4, (2, 2), 4, 2)):
        ratio = runner.run_case(case)  # raises a Finding on a misread placement
        assert ratio < 1, (case, ratio)


def test_a_strided_shard_is_compared_through_full_tensor_and_says_so():
    from shardfuzz.spec.placements import DTensorPiece, Placed, resolve

    runner = Runner(TARGET, "reference", RunConfig(failures_dir=None))
    assert runner.run_case(_case("flatten", 4, (2, 2), 4, 2)) < 1
    piece = DTensorPiece(local=None, global_shape=(8,), placements=(("replicate",), ("replicate",)),
                         mesh_shape=(2, 2), mesh_ranks=(0, 1, 2, 3), coordinate=(0, 0),
                         via="Shard(dim=0), _StridedShard(dim=0, sf=2)")  # fmt: skip
    assert "compared through full_tensor()" in repr(Placed((), (2, 2), (), (), (), (8,), via=piece.via))
    assert callable(resolve)


def test_a_pending_max_read_as_a_sum_is_found():
    # the negative control: the check above can fail
    result = shardfuzz.run(TARGET, "max_called_sum", profile="shardfuzz-ci", database=None, max_examples=30,
                           failures_dir=None, world_sizes=(2,))  # fmt: skip
    assert result.found and result.kind == "mismatch", result.report
    assert "DTensor(Partial(sum)) on mesh (2,)" in result.report and "'y'" in result.report


def test_placement_reductions_rebuild_the_value():
    import math

    import torch

    from shardfuzz.spec.placements import Placed

    a, b = torch.tensor([1.0, -4.0]), torch.tensor([3.0, 2.0])
    boxes = (((0,), (2,)), ((0,), (2,)))

    def placed(reduce, p=2.0, divide=1):
        return Placed((("partial", reduce),), (2,), boxes, ((0, 1),), (0, 1), (2,), False, divide, reduce, p)

    assert placed("sum").assemble_at([0, 1], [a, b]).tolist() == [4.0, -2.0]
    assert placed("sum", divide=2).assemble_at([0, 1], [a, b]).tolist() == [2.0, -1.0]
    assert placed("max").assemble_at([0, 1], [a, b]).tolist() == [3.0, 2.0]
    assert placed("min").assemble_at([0, 1], [a, b]).tolist() == [1.0, -4.0]
    norms = placed("norm", 2.0).assemble_at([0, 1], [a.abs(), b.abs()])
    assert torch.allclose(norms, torch.tensor([math.hypot(1, 3), math.hypot(4, 2)], dtype=torch.float64))
    assert placed("norm", 1.0).assemble_at([0, 1], [a.abs(), b.abs()]).tolist() == [4.0, 6.0]
    assert placed("norm", math.inf).assemble_at([0, 1], [a.abs(), b.abs()]).tolist() == [3.0, 4.0]


@pytest.mark.slow
@pytest.mark.parametrize("op", OPS)
def test_each_placement_is_read_as_torch_means_it_on_a_3d_mesh(op):
    """(2, 2, 2): rows sharded on the first axis, columns nested over the other two."""
    runner = Runner(TARGET, "reference", RunConfig(failures_dir=None))
    ratio = runner.run_case(_case(op, 8, (2, 2, 2), 8, 4))
    assert ratio < 1, (op, ratio)
