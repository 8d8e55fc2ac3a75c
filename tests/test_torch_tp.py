"""torch.distributed.tensor.parallel (real PyTorch code) as implementations of the tp_mlp target.

Its expected failures (the default plan on uneven sizes, the DTensor size-1 discrepancy) are
records of the target, proved found and shrunk by tests/test_targets.py.
"""

import dataclasses

import pytest

import shardfuzz


def test_dtensor_plan_passes_uneven_sizes_included():
    """use_local_output=False keeps DTensors between the layers and handles uneven hidden sizes."""
    result = shardfuzz.run(
        "tp_mlp", "torch_tp_dtensor", profile="shardfuzz-ci", database=None, max_examples=60
    )
    assert not result.found, result.report
    assert result.stats.triggers["uneven"] > 0 and result.stats.triggers["world>=3"] > 0
    # the known size-1 discrepancy is rejected loudly and counted, never passed
    assert sum(result.stats.unsupported.values()) > 0
    assert "rejected as unsupported" in result.stats.summary()


def test_unsupported_case_is_refused_outside_hypothesis():
    from shardfuzz import Case, Runner, Unsupported

    case = Case(
        target="tp_mlp",
        world_size=1,
        mesh=(1,),
        sizes=dict(batch=1, seq=1, d_model=1, hidden=1, d_out=1),
        split=("hidden",),
    )
    with pytest.raises(Unsupported, match="sharded dim has global size 1") as e:
        Runner("tp_mlp", "torch_tp_dtensor").run_case(case)
    assert e.value.reason.startswith("torch TP: Linear on a DTensor")
    assert (
        Runner("tp_mlp", "torch_tp_dtensor").run_case(
            dataclasses.replace(case, sizes={**case.sizes, "hidden": 2})
        )
        < 1
    )
