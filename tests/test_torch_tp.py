"""torch.distributed.tensor.parallel (real PyTorch code) as implementations of the tp_mlp target."""

import dataclasses

import pytest

import shardfuzz
from shardfuzz.targets import tp_mlp


def test_dtensor_plan_passes_uneven_sizes_included():
    """use_local_output=False keeps DTensors between the layers and handles uneven hidden sizes."""
    result = shardfuzz.run(
        "tp_mlp", "torch_tp_dtensor", profile="shardfuzz-ci", database=None, max_examples=120
    )
    assert not result.found, result.report
    assert result.stats.triggers["uneven"] > 0 and result.stats.triggers["world>=3"] > 0
    # the known size-1 discrepancy is rejected loudly and counted, never passed
    assert sum(result.stats.unsupported.values()) > 0
    assert "rejected as unsupported" in result.stats.summary()


@pytest.mark.parametrize(
    "impl, world, mesh, hidden",
    [
        ("torch_tp", 2, (2,), 3),  # pytorch/pytorch#150336: the default plan on an uneven hidden size
        ("torch_tp_dtensor_size1", 1, (1,), 1),  # DTensor view propagation on a size-1 sharded dim
    ],
)
def test_expected_failures_still_fail_at_their_minimal_case(impl, world, mesh, hidden):
    assert impl in tp_mlp.TARGET.expected_failures
    result = shardfuzz.run("tp_mlp", impl, profile="shardfuzz-ci", database=None, max_examples=100)
    assert result.found and result.kind == "rank-error", result.stats.summary()
    case = result.case
    assert (case.world_size, case.mesh, case.sizes["hidden"]) == (world, mesh, hidden), result.report


def test_unsupported_case_is_refused_outside_hypothesis():
    from shardfuzz import Case, Runner, Unsupported

    case = Case(
        target="tp_mlp",
        world_size=1,
        mesh=(1,),
        sizes=dict(batch=1, seq=1, d_model=1, hidden=1, d_out=1),
        split=("hidden",),
    )
    with pytest.raises(Unsupported, match="sharded dim has global size 1"):
        Runner("tp_mlp", "torch_tp_dtensor").run_case(case)
    assert (
        Runner("tp_mlp", "torch_tp_dtensor").run_case(
            dataclasses.replace(case, sizes={**case.sizes, "hidden": 2})
        )
        < 1
    )
